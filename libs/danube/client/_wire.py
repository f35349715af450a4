"""A lean HTTP/1.1 client for the producer's requests: kept-alive connections to one server,
each request written in one ``write`` and its answer read with the stream's own buffering.

Why not httpx for these: a produce of one message spent 1.2-2.4 ms of client CPU in httpx
(its request and response models, header validation, anyio, two socket sends per request)
against ~0.2-0.4 ms here, and that CPU is latency on every hop of a lone message
(docs/performance.md, "The lean produce path"). httpx stays the SDK's client for everything
else, and for the producer too when a test plugs in its transport.

What it keeps: TLS (the client's ``ssl.SSLContext``), the auth headers, a deadline on every
request, a bound on connections (:data:`MAX_CONNECTIONS`, waiting for one when all are busy)
and on an answer's head (:data:`HEAD_BYTES_MAX`). Answers with ``Content-Length`` or chunked
are read; a connection is reused only after an answer read whole that did not say
``Connection: close``. A request that fails on a kept-alive connection before any byte of
the answer came is tried once more on a new connection (the server closed an idle one);
every other failure is :class:`OSError` / :class:`asyncio.IncompleteReadError` for the caller
to map (:mod:`danube.client._http`).
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from collections import deque
from urllib.parse import urlsplit

MAX_CONNECTIONS = 32
HEAD_BYTES_MAX = 64 * 1024
BODY_BYTES_MAX = 64 * 1024 * 1024


class AnswerError(OSError):
    """An answer this client cannot read (not HTTP/1.1, a bad length, too large)."""


class _Connection:
    __slots__ = ("reader", "writer")

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer

    def usable(self) -> bool:
        return not self.reader.at_eof() and not self.writer.is_closing()

    def close(self) -> None:
        self.writer.close()


class WireAnswer:
    """Status, lower-cased headers and body of an answer."""

    __slots__ = ("body", "headers", "status")

    def __init__(self, status: int, headers: dict[str, str], body: bytes) -> None:
        self.status = status
        self.headers = headers
        self.body = body


class Http1Pool:
    """Kept-alive HTTP/1.1 connections to ``base_url`` (``http://`` or ``https://``)."""

    def __init__(
        self, base_url: str, *, ssl_context: ssl.SSLContext | None, headers: dict[str, str]
    ) -> None:
        parts = urlsplit(base_url)
        if parts.scheme not in ("http", "https") or parts.hostname is None:
            raise ValueError(f"not an http(s) URL: {base_url!r}")
        self._host = parts.hostname
        self._tls = parts.scheme == "https"
        self._port = parts.port or (443 if self._tls else 80)
        self._prefix = parts.path.rstrip("/")
        self._ssl = (ssl_context or ssl.create_default_context()) if self._tls else None
        host = parts.netloc.rpartition("@")[2]
        fixed = "".join(f"{name}: {value}\r\n" for name, value in headers.items())
        self._fixed = f"host: {host}\r\n{fixed}".encode("latin-1")
        self._idle: deque[_Connection] = deque()
        self._slots = asyncio.Semaphore(MAX_CONNECTIONS)
        self._closed = False

    async def request(
        self, method: str, target: str, *, content_type: str, body: bytes
    ) -> WireAnswer:
        """One request (``target``: path and query); the caller bounds it with a deadline
        (a cancelled request closes its connection)."""
        head = b"%s %s%s HTTP/1.1\r\n%scontent-type: %s\r\ncontent-length: %d\r\n\r\n" % (
            method.encode("ascii"),
            self._prefix.encode("ascii"),
            target.encode("ascii"),
            self._fixed,
            content_type.encode("latin-1"),
            len(body),
        )
        # Small bodies go in the same write as the head (one segment); large ones are not
        # copied to be joined.
        message = [head + body] if len(body) <= 16 * 1024 else [head, body]
        async with self._slots:
            while self._idle:
                connection = self._idle.pop()  # the most recently used: the least stale
                if not connection.usable():
                    connection.close()
                    continue
                try:
                    return await self._exchange(connection, message, reused=True)
                except _StaleConnectionError:
                    continue
            return await self._exchange(await self._connect(), message, reused=False)

    async def _connect(self) -> _Connection:
        reader, writer = await asyncio.open_connection(
            self._host,
            self._port,
            ssl=self._ssl,
            server_hostname=self._host if self._tls else None,
            limit=HEAD_BYTES_MAX,
        )
        return _Connection(reader, writer)

    async def _exchange(
        self, connection: _Connection, message: list[bytes], *, reused: bool
    ) -> WireAnswer:
        keep = False
        try:
            connection.writer.writelines(message)
            try:
                status_line = await connection.reader.readuntil(b"\r\n")
            except (asyncio.IncompleteReadError, ConnectionError) as exc:
                if reused and not getattr(exc, "partial", b""):
                    raise _StaleConnectionError() from exc
                raise
            answer, keep = await _read_answer(connection.reader, status_line)
            return answer
        finally:
            if keep and not self._closed:
                self._idle.append(connection)
            else:
                connection.close()

    async def aclose(self) -> None:
        """Close every idle connection (busy ones close when their request ends)."""
        self._closed = True
        while self._idle:
            connection = self._idle.pop()
            connection.close()
            with contextlib.suppress(OSError, ssl.SSLError):  # closing anyway
                await connection.writer.wait_closed()


class _StaleConnectionError(Exception):
    """A kept-alive connection the server had closed: try a new one."""


async def _read_answer(reader: asyncio.StreamReader, status_line: bytes) -> tuple[WireAnswer, bool]:
    """The answer after its status line, and whether the connection may be reused."""
    parts = status_line.split(b" ", 2)
    if len(parts) < 2 or parts[0] != b"HTTP/1.1" or not parts[1].isdigit():
        raise AnswerError(f"not an HTTP/1.1 answer: {status_line[:80]!r}")
    status = int(parts[1])
    try:
        raw = await reader.readuntil(b"\r\n\r\n")
    except asyncio.LimitOverrunError as exc:
        raise AnswerError(f"answer headers over {HEAD_BYTES_MAX} bytes") from exc
    headers: dict[str, str] = {}
    for line in raw[:-4].split(b"\r\n"):
        if line:
            name, _, value = line.partition(b":")
            headers[name.strip().lower().decode("latin-1")] = value.strip().decode("latin-1")
    keep = headers.get("connection", "").lower() != "close"
    if "chunked" in headers.get("transfer-encoding", "").lower():
        return WireAnswer(status, headers, await _read_chunked(reader)), keep
    length = headers.get("content-length")
    if length is None:
        if status in (204, 304) or 100 <= status < 200:
            return WireAnswer(status, headers, b""), keep
        return WireAnswer(status, headers, await _read_to_end(reader)), False
    if not length.isdigit() or int(length) > BODY_BYTES_MAX:
        raise AnswerError(f"bad content-length {length!r:.40}")
    return WireAnswer(status, headers, await reader.readexactly(int(length))), keep


async def _read_chunked(reader: asyncio.StreamReader) -> bytes:
    chunks: list[bytes] = []
    total = 0
    while True:
        size_line = (await reader.readuntil(b"\r\n")).split(b";", 1)[0].strip()
        try:
            size = int(size_line, 16)
        except ValueError as exc:
            raise AnswerError(f"bad chunk size {size_line[:40]!r}") from exc
        total += size
        if total > BODY_BYTES_MAX:
            raise AnswerError(f"answer over {BODY_BYTES_MAX} bytes")
        if size == 0:
            while (await reader.readuntil(b"\r\n")) != b"\r\n":
                pass  # trailers, ignored
            return b"".join(chunks)
        chunks.append(await reader.readexactly(size))
        if await reader.readexactly(2) != b"\r\n":
            raise AnswerError("chunk not followed by CRLF")


async def _read_to_end(reader: asyncio.StreamReader) -> bytes:
    data = await reader.read(BODY_BYTES_MAX + 1)
    chunks = [data]
    total = len(data)
    while data:
        data = await reader.read(BODY_BYTES_MAX + 1 - total)
        chunks.append(data)
        total += len(data)
        if total > BODY_BYTES_MAX:
            raise AnswerError(f"answer over {BODY_BYTES_MAX} bytes")
    return b"".join(chunks)

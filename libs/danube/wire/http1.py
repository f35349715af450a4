"""A lean HTTP/1.1 client: kept-alive connections to one server, each request written in one
``write``, its answer parsed by httptools (llhttp, the parser uvicorn uses). The SDK's
producer posts with it, and an ingest follower fetches from its leader's data door
(danube.ingest.replica_link).

Why not httpx for these: a produce of one message spent 1.2-2.4 ms of client CPU in httpx
(its request and response models, header validation, anyio, two socket sends per request)
against ~0.2-0.4 ms here, and that CPU is latency on every hop of a lone message
(docs/performance.md, "The lean produce path"). httpx stays the SDK's client for everything
else, and for the producer too when a test plugs in its transport.

What it keeps: TLS (the client's ``ssl.SSLContext``), the auth headers, a deadline on every
request, a bound on connections (:data:`MAX_CONNECTIONS`, waiting for one when all are busy)
and on an answer's head (:data:`HEAD_BYTES_MAX`) and body (:data:`BODY_BYTES_MAX`). A
connection is reused only after an answer read whole that lets it be kept alive
(``should_keep_alive``). A request that fails on a kept-alive connection before any byte of
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

import httptools

MAX_CONNECTIONS = 32
READ_BYTES = 64 * 1024
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
            answer, keep = await _read_answer(connection.reader, reused=reused)
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


class _Parsed:
    """What httptools hands over while it parses one answer (its callbacks)."""

    __slots__ = (
        "body",
        "done",
        "head_bytes",
        "headers",
        "headers_done",
        "keep_alive",
        "parser",
        "size",
    )

    parser: httptools.HttpResponseParser  # set once made: it takes this object

    def __init__(self) -> None:
        self.headers: dict[str, str] = {}
        self.body: list[bytes] = []
        self.size = 0
        self.head_bytes = 0
        self.headers_done = False
        self.done = False
        self.keep_alive = False

    def on_header(self, name: bytes, value: bytes) -> None:
        self.head_bytes += len(name) + len(value) + 4
        if self.head_bytes > HEAD_BYTES_MAX:
            raise AnswerError(f"answer headers over {HEAD_BYTES_MAX} bytes")
        self.headers[name.decode("latin-1").lower()] = value.decode("latin-1")

    def on_headers_complete(self) -> None:
        self.headers_done = True

    def on_body(self, body: bytes) -> None:
        self.size += len(body)
        if self.size > BODY_BYTES_MAX:
            raise AnswerError(f"answer over {BODY_BYTES_MAX} bytes")
        self.body.append(body)

    def on_message_complete(self) -> None:
        self.done = True
        # Asked here, while the answer is the parser's current message: once feed_data()
        # returns, llhttp has reset for the next one and says False whatever the answer
        # said (every request then paid a new connection: docs/performance.md).
        self.keep_alive = self.parser.should_keep_alive()


async def _read_answer(reader: asyncio.StreamReader, *, reused: bool) -> tuple[WireAnswer, bool]:
    """The answer, and whether the connection may be kept. On a ``reused`` connection that
    ends before any byte of the answer came, :class:`_StaleConnectionError`."""
    parsed = _Parsed()
    parser = httptools.HttpResponseParser(parsed)
    parsed.parser = parser
    received = 0
    while not parsed.done:
        try:
            data = await reader.read(READ_BYTES)
        except ConnectionError:
            if reused and received == 0:
                raise _StaleConnectionError() from None
            raise
        if not data:
            if reused and received == 0:
                raise _StaleConnectionError()
            if (
                parsed.headers_done
                and "content-length" not in parsed.headers
                and ("chunked" not in parsed.headers.get("transfer-encoding", "").lower())
            ):
                break  # a body delimited by the end of the connection: it has ended
            raise asyncio.IncompleteReadError(b"", None)
        received += len(data)
        try:
            parser.feed_data(data)
        except httptools.HttpParserCallbackError as exc:
            cause = exc.__context__
            raise cause if isinstance(cause, AnswerError) else AnswerError(str(exc)) from exc
        except httptools.HttpParserError as exc:
            raise AnswerError(f"not an HTTP/1.1 answer: {exc}") from exc
        if not parsed.headers_done and received > HEAD_BYTES_MAX:
            raise AnswerError(f"answer headers over {HEAD_BYTES_MAX} bytes")
    if parser.get_http_version() != "1.1":
        raise AnswerError(f"not an HTTP/1.1 answer (HTTP/{parser.get_http_version()})")
    keep = parsed.done and parsed.keep_alive
    answer = WireAnswer(parser.get_status_code(), parsed.headers, b"".join(parsed.body))
    return answer, keep

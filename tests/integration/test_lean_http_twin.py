"""The SDK's lean HTTP/1.1 client (danube.wire.http1) against its twin, httpx, through
HttpCore on a raw loopback server: the same requests arrive, and every answer (framed by
length, chunks or the close; damaged, cut or not HTTP at all) ends the same way on both."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qsl, urlsplit

import orjson
import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from danube.client._http import Answer, HttpCore
from danube.client.errors import ApiError, ClientError, ProtocolError, TransportError
from danube.client.retry import RetryPolicy

pytestmark = pytest.mark.integration

# Long enough for a loaded CI machine; no example waits for it (every damaged answer ends
# with the server closing the connection).
_TIMEOUT_S = 5.0
_RECORDS_TYPE = "application/vnd.danube.records"

# How an answer's body is delimited, or how the answer is damaged.
_FRAMED = ("length", "chunked", "eof")
_DAMAGED = ("short", "chunked_cut", "silent", "garbage", "bad_length")
# Answers httpx reads and the lean client deliberately fails as a transport error (retried
# like any other): an HTTP/1.0 answer (it reads HTTP/1.1 only, all Danube's servers speak;
# see AnswerError), and one with both a length and chunks (llhttp refuses it, as RFC 9112
# 6.3 advises: "ought to be handled as an error", a sign of response splitting; h11 lets
# the chunks win).
_HTTP10 = "http10"
_LEAN_REFUSES = (_HTTP10, "length_and_chunked")


@dataclass(frozen=True)
class Reply:
    """One canned answer, written byte for byte."""

    status: int
    reason: bytes
    body: bytes
    framing: str
    cuts: tuple[int, ...]  # where a chunked body is split
    headers: tuple[tuple[bytes, bytes], ...]  # besides the framing ones, names as cased
    length_name: bytes  # "content-length" as cased
    connection: bytes | None  # the connection header's value, if any

    def __repr__(self) -> str:  # a body or a header of 300 KB is shown by its size
        headers = [(n, v if len(v) < 40 else b"<%d bytes>" % len(v)) for n, v in self.headers]
        body = self.body if len(self.body) < 80 else b"<%d bytes>" % len(self.body)
        return (
            f"Reply({self.status}, {self.reason!r}, {body!r}, {self.framing}, {self.cuts},"
            f" {headers}, {self.length_name!r}, {self.connection!r})"
        )

    @property
    def closes(self) -> bool:
        """Whether the server closes the connection once it is written."""
        return self.framing not in ("length", "chunked") or (
            self.connection is not None and self.connection.lower() == b"close"
        )

    def wire(self) -> bytes:
        if self.framing == "silent":
            return b""
        if self.framing == "garbage":
            return b"SPAM " + self.body[:64] + b"\r\n\r\n"
        version = b"HTTP/1.0" if self.framing == _HTTP10 else b"HTTP/1.1"
        lines = [b"%s %d%s" % (version, self.status, self.reason)]
        lines += [name + b": " + value for name, value in self.headers]
        if self.connection is not None:
            lines.append(b"Connection: " + self.connection)
        body = self.body
        if self.framing in ("length", "short", _HTTP10, "length_and_chunked"):
            extra = 3 if self.framing == "short" else 0
            lines.append(b"%s: %d" % (self.length_name, len(body) + extra))
        if self.framing == "bad_length":
            lines.append(self.length_name + b": 12x")
        if self.framing in ("chunked", "chunked_cut", "length_and_chunked"):
            lines.append(b"Transfer-Encoding: chunked")
            body = _chunked(body, self.cuts, cut=self.framing == "chunked_cut")
        return b"\r\n".join(lines) + b"\r\n\r\n" + body


def _chunked(body: bytes, cuts: tuple[int, ...], *, cut: bool) -> bytes:
    edges = [0, *sorted({c % (len(body) + 1) for c in cuts}), len(body)]
    pieces = [body[a:b] for a, b in itertools.pairwise(edges) if b > a]
    out = b"".join(b"%x\r\n%s\r\n" % (len(piece), piece) for piece in pieces)
    if cut:  # the last chunk never comes, nor the rest of the one being sent
        return out[: max(0, len(out) - 3)]
    return out + b"0\r\n\r\n"


@dataclass(frozen=True)
class Call:
    """One request as the SDK makes it."""

    method: str
    path: str
    params: dict[str, str | int] | None
    content: bytes
    content_type: str | None


@dataclass(frozen=True)
class Seen:
    """A request as the server read it."""

    method: str
    path: str
    query: list[tuple[str, str]]
    headers: dict[str, list[str]]
    body: bytes


class CannedServer:
    """A loopback server answering the request at ``/.../r<i>`` with ``replies[i]``."""

    def __init__(self, replies: list[Reply]) -> None:
        self.replies = replies
        self.seen: dict[int, list[Seen]] = {}
        self._closing = 0
        self._settled = asyncio.Event()  # set while no connection is being closed
        self._settled.set()
        self._handlers: set[asyncio.Task[None]] = set()
        self._writers: set[asyncio.StreamWriter] = set()

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        closing = False
        task = asyncio.current_task()
        assert task is not None
        self._handlers.add(task)
        self._writers.add(writer)
        try:
            while True:
                try:
                    head = await reader.readuntil(b"\r\n\r\n")
                except (asyncio.IncompleteReadError, ConnectionError):
                    return
                index, seen = _read_head(head)
                length = int(seen.headers.get("content-length", ["0"])[0])
                body = await reader.readexactly(length)
                seen = Seen(seen.method, seen.path, seen.query, seen.headers, body)
                self.seen.setdefault(index, []).append(seen)
                reply = self.replies[index]
                closing = reply.closes
                if closing:
                    self._closing += 1
                    self._settled.clear()
                writer.write(reply.wire())
                await writer.drain()
                if closing:
                    return
        finally:
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()
            if closing:
                self._closing -= 1
                if not self._closing:
                    self._settled.set()
            self._handlers.discard(task)
            self._writers.discard(writer)

    async def aclose(self) -> None:
        """End the connections still open (kept alive by a client)."""
        for writer in self._writers:
            writer.close()  # its handler's read ends
        await asyncio.gather(*self._handlers, return_exceptions=True)

    async def quiet(self) -> None:
        """Until every connection the server meant to close is closed, so the client's
        next request sees it closed (no race between the close and the reuse)."""
        await self._settled.wait()
        await asyncio.sleep(0.002)  # the client's loop takes in the close


def _read_head(head: bytes) -> tuple[int, Seen]:
    request_line, *lines = head.decode("latin-1").split("\r\n")
    method, target, _ = request_line.split(" ")
    parts = urlsplit(target)
    headers: dict[str, list[str]] = {}
    for line in lines:
        if line:
            name, _, value = line.partition(":")
            headers.setdefault(name.strip().lower(), []).append(value.strip())
    path = parts.path
    index = int(path.rpartition("/r")[2])
    query = parse_qsl(parts.query, keep_blank_values=True, strict_parsing=False)
    return index, Seen(method, path, query, headers, b"")


# What an outcome is compared on: an answer whole; an API error by class, status, code and
# message (the first bytes of the body); a protocol error by message (the body's start); a
# transport error by whether it is retriable (its text quotes each client's own exception).
def _outcome(result: Answer | ClientError) -> tuple[Any, ...]:
    if isinstance(result, Answer):
        return ("answer", result.status, result.body)
    if isinstance(result, ApiError):
        return ("api", type(result), result.status, result.code, str(result))
    if isinstance(result, ProtocolError):
        return ("protocol", str(result))
    if isinstance(result, TransportError):
        return ("transport", result.retriable)
    raise AssertionError(f"an error the SDK does not map: {result!r}")


async def _run(
    core: HttpCore, server: CannedServer, calls: list[Call], *, lean: bool
) -> list[tuple[Any, ...]]:
    outcomes = []
    for index, call in enumerate(calls):
        try:
            result: Answer | ClientError = await core.request(
                call.method,
                f"{call.path}/r{index}",
                content=call.content,
                content_type=call.content_type,
                params=call.params,
                lean=lean,
            )
        except ClientError as exc:
            result = exc
        outcomes.append(_outcome(result))
        await server.quiet()
    return outcomes


async def _both(
    prefix: str, token: str | None, calls: list[Call], replies: list[Reply]
) -> tuple[list[Any], list[Any], dict[int, list[Seen]], dict[int, list[Seen]]]:
    server = CannedServer(replies)
    listener = await asyncio.start_server(server.handle, "127.0.0.1", 0)
    port = listener.sockets[0].getsockname()[1]
    core = HttpCore(
        f"http://127.0.0.1:{port}{prefix}",
        timeout_s=_TIMEOUT_S,
        retry=RetryPolicy(),
        token=token,
    )
    try:
        lean = await _run(core, server, calls, lean=True)
        seen_lean, server.seen = server.seen, {}
        twin = await _run(core, server, calls, lean=False)
        return lean, twin, seen_lean, server.seen
    finally:
        await core.aclose()
        await server.aclose()
        listener.close()
        await listener.wait_closed()


# -- what is drawn ---------------------------------------------------------------------------

_SEGMENT = st.text("abcXYZ019_-", min_size=1, max_size=8)
_PATH = st.lists(_SEGMENT, min_size=1, max_size=4).map(lambda s: "/v1/" + "/".join(s))
_TEXT = st.text(st.characters(exclude_categories=["Cs"]), max_size=12)
_PARAMS = st.one_of(
    st.none(),
    st.dictionaries(
        st.one_of(st.sampled_from(["dispatch", "producer_id", "epoch"]), _TEXT.filter(bool)),
        st.one_of(_TEXT, st.integers(-(2**63), 2**63 - 1)),
        min_size=1,
        max_size=4,
    ),
)
_CONTENT_TYPE = st.sampled_from(
    [None, "application/json", _RECORDS_TYPE, "text/plain; charset=utf-8"]
)
_CALL = st.builds(
    Call,
    method=st.sampled_from(["POST", "PUT", "PATCH", "DELETE"]),
    path=_PATH,
    params=_PARAMS,
    content=st.one_of(st.binary(max_size=64), st.binary(min_size=20_000, max_size=40_000)),
    content_type=_CONTENT_TYPE,
)
_TOKEN = st.one_of(st.none(), st.text("abcXYZ0189-_.~+/=", min_size=1, max_size=40))
_PREFIX = st.sampled_from(["", "/", "/base", "/a/b/"])

_JSON_VALUE = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**53), 2**53) | _TEXT,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_TEXT, inner, max_size=3),
    max_leaves=8,
)
_BODY = st.one_of(
    st.just(b""),
    _JSON_VALUE.map(orjson.dumps),
    st.builds(
        lambda code, message: orjson.dumps({"error": {"code": code, "message": message}}),
        st.sampled_from(["topic_not_found", "no_owner", "too_many_requests", "x"]),
        _TEXT,
    ),
    st.binary(max_size=300),
    # Past one read (64 KiB) and one chunk; drawn from a list, as integers favour small ones.
    st.sampled_from([5_000, 70_000, 300_000]).map(lambda n: orjson.dumps("x" * n)),
    st.sampled_from([17_000, 130_000]).map(lambda n: bytes(range(256)) * (n // 256)),
)
_STATUS = st.one_of(
    st.sampled_from([200, 201, 400, 401, 403, 404, 409, 410, 413, 429, 500, 503]),
    st.integers(200, 599).filter(lambda s: s not in (204, 304)),  # no body allowed: below
)


def _cased(name: str) -> st.SearchStrategy[bytes]:
    return st.sampled_from([name.lower(), name.title(), name.upper()]).map(str.encode)


_EXTRA_HEADERS = st.lists(
    st.tuples(
        st.one_of(_cased("x-danube-trace"), _cased("content-type"), _cased("server")),
        st.text("abc019 ;=/-", max_size=20).map(lambda v: v.strip().encode()),
    ),
    max_size=4,  # a name given twice now and then (content-type too)
)
# A head near neither limit (lean: 64 KiB; httpcore's h11: 100 KiB) or past both.
_PAD = st.sampled_from([0, 0, 1_000, 20_000, 200_000])


@st.composite
def _reply(draw: st.DrawFn) -> Reply:
    framing = draw(st.sampled_from(_FRAMED * 3 + _DAMAGED + _LEAN_REFUSES))
    status = draw(_STATUS)
    body = draw(_BODY)
    if draw(st.booleans()) and status == 200 and framing == "length":
        status, body = 204, b""  # no content: the other status a server answers with
    headers = list(draw(_EXTRA_HEADERS))
    pad = draw(_PAD)
    if pad:
        headers.append((b"X-Pad", b"p" * pad))
    return Reply(
        status=status,
        reason=draw(st.sampled_from([b" OK", b" ", b"", b" Whatever It Says"])),
        body=body,
        framing=framing,
        cuts=tuple(draw(st.lists(st.integers(0, 400_000), max_size=4))),
        headers=tuple(headers),
        length_name=draw(_cased("content-length")),
        connection=draw(st.sampled_from([None, b"close", b"keep-alive", b"Close"])),
    )


# -- the property --------------------------------------------------------------------------

_COMPARED_HEADERS = ("host", "content-type", "content-length", "authorization")


@settings(
    max_examples=80,
    # No shrinking: each example is a server and a dozen sockets, and shrinking a failure
    # took over five minutes; a failure shows its example unshrunk (bodies by their size).
    phases=[Phase.explicit, Phase.reuse, Phase.generate],
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(
    prefix=_PREFIX,
    token=_TOKEN,
    calls_replies=st.lists(st.tuples(_CALL, _reply()), min_size=1, max_size=3),
)
def test_the_lean_client_agrees_with_httpx(
    prefix: str, token: str | None, calls_replies: list[tuple[Call, Reply]]
) -> None:
    calls = [call for call, _ in calls_replies]
    replies = [reply for _, reply in calls_replies]
    lean, twin, seen_lean, seen_twin = asyncio.run(_both(prefix, token, calls, replies))

    for index, reply in enumerate(replies):
        if reply.framing in _LEAN_REFUSES:
            assert lean[index] == ("transport", True), lean[index]
        else:
            assert lean[index] == twin[index], (index, reply)

    # The same requests arrived. The lean client tries a request once more on a new
    # connection when a kept-alive one ends before any byte of its answer (the server
    # closed an idle one; httpx finds that before sending, by polling the socket), so it
    # may be seen twice, the same each time.
    assert seen_lean.keys() == seen_twin.keys() == set(range(len(calls)))
    for index in seen_twin:
        assert len(seen_twin[index]) == 1
        assert 1 <= len(seen_lean[index]) <= 2
        twin_seen = seen_twin[index][0]
        for lean_seen in seen_lean[index]:
            assert lean_seen.method == twin_seen.method
            assert lean_seen.path == twin_seen.path
            assert lean_seen.query == twin_seen.query
            assert lean_seen.body == twin_seen.body == calls[index].content
            for name in _COMPARED_HEADERS:
                assert _header(lean_seen, name) == _header(twin_seen, name), name


def _header(seen: Seen, name: str) -> list[str] | None:
    # httpx leaves out "content-length: 0" of an empty body but for POST, PUT and PATCH;
    # the lean client always sends it: the same request.
    if name == "content-length" and not seen.body:
        return seen.headers.get(name, ["0"])
    return seen.headers.get(name)

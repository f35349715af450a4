"""A data door's connection (danube.runtime.data_connection) fed bytes as a network would:
however a stream of requests is cut into reads, the answers are the same and in order; and
whatever bytes come, nothing escapes the protocol's callbacks: a request that cannot be
read is answered 400 (or 413) and the connection closed, never left half-served."""

from __future__ import annotations

import asyncio
import itertools
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client import Counter

from danube.errors import TooLargeError
from danube.runtime.data_connection import Connection, DoorLimits, DoorRequest
from danube.runtime.door import Answer, error_answer
from danube.runtime.peers import PerClient

pytestmark = pytest.mark.unit

LIMITS = DoorLimits(
    body_bytes_max=4096,
    timeout_s=10,
    max_inflight=3,
    header_timeout_s=10,
    keep_alive_timeout_s=10,
    max_connections=8,
    max_connections_per_client=8,
)
_REFUSALS = Counter("danube_test_data_connection_refusals", "refusals", ["code"])


class Transport:
    """What a connection writes, whether it paused reading, and whether it closed."""

    def __init__(self, protocol: Connection) -> None:
        self.protocol = protocol
        self.written = bytearray()
        self.closed = False
        self.paused = False

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return ("127.0.0.1", 5555) if name == "peername" else default

    def write(self, data: bytes) -> None:
        assert not self.closed, "written after close"
        self.written += data

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        if not self.closed:  # as asyncio's: the protocol hears of it on a later turn
            self.closed = True
            asyncio.get_running_loop().call_soon(self.protocol.connection_lost, None)

    abort = close

    def can_write_eof(self) -> bool:
        return True

    def write_eof(self) -> None:
        pass

    def pause_reading(self) -> None:
        self.paused = True

    def resume_reading(self) -> None:
        self.paused = False


class Listener:
    """A connection's owner: answers each request with its path and body length."""

    def __init__(self) -> None:
        self.limits = LIMITS
        self.listener = "unit"
        self.per_client = PerClient(8)
        self.connections: set[Connection] = set()
        self.inflight = 0

    async def app(self, request: DoorRequest) -> Answer:
        await asyncio.sleep(0)  # answered on a later turn of the loop, as a door does
        said = {"path": request.path, "length": len(request.body)}
        return 200, orjson.dumps(said), "application/json", None

    def refusal(self, exc: Exception) -> Answer:
        return error_answer(exc, "unit door", _REFUSALS)

    def too_large(self) -> Exception:
        return TooLargeError("too large", code="body_too_large", limit=LIMITS.body_bytes_max)

    def forget(self, connection: Connection) -> None:
        self.connections.discard(connection)


async def feed(chunks: list[bytes]) -> tuple[Transport, Listener]:
    """A connection fed ``chunks`` one read at a time (as its transport allows), then left
    to answer what it took."""
    loop = asyncio.get_running_loop()
    listener = Listener()
    connection = Connection(listener, loop)  # type: ignore[arg-type]
    transport = Transport(connection)
    connection.connection_made(transport)  # type: ignore[arg-type]
    pending = list(chunks)
    for _ in range(10_000):
        if pending and not transport.paused and not transport.closed:
            connection.data_received(pending.pop(0))
        elif connection.running is None and (not pending or transport.closed):
            break
        await asyncio.sleep(0)
    await asyncio.sleep(0)  # a close heard
    return transport, listener


def _post(path: str, body: bytes, *extra: str) -> bytes:
    head = [f"POST {path} HTTP/1.1", "Host: x", f"Content-Length: {len(body)}", *extra]
    return ("\r\n".join(head) + "\r\n\r\n").encode() + body


def _answers(raw: bytes) -> list[tuple[int, bytes]]:
    out = []
    while raw:
        head, _, rest = raw.partition(b"\r\n\r\n")
        status = int(head.split(b" ", 2)[1])
        length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
        out.append((status, rest[:length]))
        raw = rest[length:]
    return out


def _cuts(data: bytes, points: list[int]) -> list[bytes]:
    cuts = sorted({p % (len(data) + 1) for p in points} | {0, len(data)})
    return [data[a:b] for a, b in itertools.pairwise(cuts) if b > a]


requests = st.lists(
    st.tuples(st.sampled_from(["/a", "/b/c", "/v1/x-part-0"]), st.binary(max_size=300)),
    min_size=1,
    max_size=6,
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(requests, st.lists(st.integers(min_value=0, max_value=10_000), max_size=12))
async def test_however_the_stream_is_cut_every_request_is_answered_in_order(
    sent: list[tuple[str, bytes]], points: list[int]
) -> None:
    stream = b"".join(_post(path, body) for path, body in sent)
    transport, listener = await feed(_cuts(stream, points))
    answers = _answers(bytes(transport.written))
    assert [status for status, _ in answers] == [200] * len(sent)
    assert listener.inflight == 0  # every slot given back with its answer
    assert [orjson.loads(body) for _, body in answers] == [
        {"path": path, "length": len(body)} for path, body in sent
    ]
    assert not transport.closed  # kept alive


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.one_of(
        st.binary(max_size=600),
        st.builds(
            lambda junk, good: good + junk,
            st.binary(min_size=1, max_size=200),
            st.just(_post("/ok", b"fine")),
        ),
    ),
    st.lists(st.integers(min_value=0, max_value=1000), max_size=6),
)
async def test_whatever_bytes_come_the_connection_answers_or_closes(
    data: bytes, points: list[int]
) -> None:
    transport, listener = await feed(_cuts(data, points))
    answers = _answers(bytes(transport.written))
    statuses = [status for status, _ in answers]
    # A slot is held only by a request whose head came and that is not answered yet: none
    # once the connection closed.
    assert listener.inflight == 0 if transport.closed else 0 <= listener.inflight <= 1
    # Only whole requests are answered 200; anything else is one refusal, then closed.
    assert all(status in (200, 400, 413) for status in statuses), statuses
    if any(status != 200 for status in statuses):
        assert statuses[-1] in (400, 413)
        assert transport.closed or transport.written.endswith(b"}")


async def test_a_body_past_the_bound_is_refused_413_even_when_chunked() -> None:
    body = b"y" * 5000
    chunked = (
        b"POST /big HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
        + b"%x\r\n%s\r\n0\r\n\r\n" % (len(body), body)
    )
    transport, _ = await feed([chunked[i : i + 700] for i in range(0, len(chunked), 700)])
    ((status, answer),) = _answers(bytes(transport.written))
    assert (status, orjson.loads(answer)["error"]["code"]) == (413, "body_too_large")

"""The data door's listener (danube.runtime.data_listener) on real sockets, with a small
door that echoes what it was sent: keep-alive and pipelining in order, every guard of the
mesh's other listeners (head size and time, idle keep-alive, connection caps, the body's
bound and time), 100-continue, TLS and its principal, flow control, and a stop."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import socket
import ssl
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import orjson
import pytest
from prometheus_client import REGISTRY, Counter

from danube.config import TlsConfig
from danube.errors import TooLargeError
from danube.runtime.data_listener import DataListener, DoorLimits, DoorRequest
from danube.runtime.door import Answer, error_answer
from danube.runtime.listener import HEAD_BYTES_MAX
from danube.security.pki import LocalPki, ensure_local_pki
from danube.security.tls import ServerTls

pytestmark = pytest.mark.integration

BODY_MAX = 64 * 1024
LIMITS = DoorLimits(
    body_bytes_max=BODY_MAX,
    timeout_s=0.6,
    max_inflight=2,
    header_timeout_s=0.6,
    keep_alive_timeout_s=0.4,
    max_connections=6,
    max_connections_per_client=4,
)
_COUNTER = Counter("danube_test_data_listener_refusals", "refusals", ["code"])


class Door:
    """Answers each request with what it saw (method, path, query, body's length and its
    first bytes, the principal), after ``delay_s``, counting the requests."""

    def __init__(self, answer_bytes: int = 0) -> None:
        self.delay_s = 0.0
        self.answer_bytes = answer_bytes
        self.seen: list[DoorRequest] = []
        self.called = asyncio.Event()  # a request came
        self.cancelled = 0  # requests cut while the door worked on them

    async def __call__(self, request: DoorRequest) -> Answer:
        self.seen.append(request)
        self.called.set()
        if self.delay_s:
            try:
                await asyncio.sleep(self.delay_s)
            except asyncio.CancelledError:
                self.cancelled += 1
                raise
        said = {
            "method": request.method,
            "path": request.path,
            "query": request.query.decode(),
            "length": len(request.body),
            "head": request.body[:16].decode("latin-1"),
            "principal": request.tls_principal,
            "padding": "x" * self.answer_bytes,
        }
        return 200, orjson.dumps(said), "application/json", {"X-Seen": str(len(self.seen))}


def _refusal(exc: Exception) -> Answer:
    return error_answer(exc, "test door", _COUNTER)


def _too_large() -> Exception:
    return TooLargeError(f"over {BODY_MAX}", code="body_too_large", limit=BODY_MAX)


Started = Callable[..., Awaitable[tuple[DataListener, Door]]]


@pytest.fixture
async def started() -> AsyncIterator[Started]:
    listeners: list[DataListener] = []

    async def start(
        limits: DoorLimits = LIMITS, tls: ServerTls | None = None, answer_bytes: int = 0
    ) -> tuple[DataListener, Door]:
        door = Door(answer_bytes)
        listener = DataListener(door, _refusal, _too_large, limits, listener="test", tls=tls)
        await listener.start("127.0.0.1", 0)
        listeners.append(listener)
        return listener, door

    yield start
    for listener in listeners:
        await listener.close(2.0)


async def until(condition: Callable[[], bool], timeout_s: float = 5.0) -> None:
    """Wait for ``condition`` (the listener's state, changed by its own callbacks)."""
    async with asyncio.timeout(timeout_s):
        while not condition():  # noqa: ASYNC110 - no event to wait on in the listener
            await asyncio.sleep(0.01)


def _read_all(sock: socket.socket) -> bytes:
    chunks = []
    while True:
        try:
            chunk = sock.recv(65536)
        except (ConnectionResetError, TimeoutError):
            break
        if not chunk:
            break
        chunks.append(chunk)
    return b"".join(chunks)


def _talk(port: int, data: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(data)
        return _read_all(sock)


def _post(path: str, body: bytes, *extra: str) -> bytes:
    head = [f"POST {path} HTTP/1.1", "Host: x", f"Content-Length: {len(body)}", *extra]
    return ("\r\n".join(head) + "\r\n\r\n").encode() + body


def _answers(raw: bytes) -> list[tuple[int, dict[str, str], bytes]]:
    """Every answer in ``raw``: status, headers, body."""
    answers = []
    while raw:
        head, _, rest = raw.partition(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        status = int(lines[0].split()[1])
        headers = dict(line.lower().split(": ", 1) for line in lines[1:])
        length = int(headers["content-length"])
        answers.append((status, headers, rest[:length]))
        raw = rest[length:]
    return answers


async def test_pipelined_requests_on_one_connection_are_answered_in_order(
    started: Started,
) -> None:
    listener, door = await started()
    door.delay_s = 0.02  # the second and third arrive while the first is served
    data = (
        _post("/a%2Dz?x=1", b"first")
        + _post("/b", b"second")
        + _post("/c", b"third", "Connection: close")
    )
    answers = _answers(await asyncio.to_thread(_talk, listener.port, data))
    assert [a[0] for a in answers] == [200, 200, 200]
    bodies = [orjson.loads(a[2]) for a in answers]
    assert [(b["path"], b["query"], b["head"]) for b in bodies] == [
        ("/a-z", "x=1", "first"),  # the path decoded, the query as sent
        ("/b", "", "second"),
        ("/c", "", "third"),
    ]
    assert [a[1]["x-seen"] for a in answers] == ["1", "2", "3"]
    assert answers[2][1]["connection"] == "close"
    assert "connection" not in answers[0][1]


def _two_on_one_connection(port: int) -> list[bytes]:
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(_post("/one", b"1"))
        first = sock.recv(65536)
        sock.sendall(_post("/two", b"22"))
        second = sock.recv(65536)
        return [first, second]


async def test_a_connection_is_kept_alive_between_requests(started: Started) -> None:
    listener, _ = await started()
    first, second = await asyncio.to_thread(_two_on_one_connection, listener.port)
    assert orjson.loads(_answers(first)[0][2])["path"] == "/one"
    assert orjson.loads(_answers(second)[0][2])["length"] == 2


def _closed_after_s(port: int, data: bytes) -> tuple[float, bytes]:
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        started = time.monotonic()
        sock.sendall(data)
        answer = _read_all(sock)
        return time.monotonic() - started, answer


async def test_an_idle_connection_closes_after_the_keep_alive_time(started: Started) -> None:
    listener, _ = await started()
    after_s, answer = await asyncio.to_thread(_closed_after_s, listener.port, b"")
    assert answer == b""
    assert LIMITS.keep_alive_timeout_s * 0.9 <= after_s < LIMITS.keep_alive_timeout_s + 1


async def test_a_slow_head_closes_after_the_header_timeout(started: Started) -> None:
    listener, door = await started()
    after_s, answer = await asyncio.to_thread(
        _closed_after_s, listener.port, b"POST /slow HTTP/1.1\r\nHost: x\r\n"
    )
    assert answer == b""
    # begun, so not the keep-alive's 0.4 s: the head's 0.6 s
    assert LIMITS.header_timeout_s * 0.9 <= after_s < LIMITS.header_timeout_s + 1
    assert door.seen == []


def _oversized_head(port: int) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(b"POST /big HTTP/1.1\r\nHost: x\r\n")
        filler = b"X-Filler: " + b"a" * 1000 + b"\r\n"
        try:
            for _ in range(HEAD_BYTES_MAX // len(filler) + 4):
                sock.sendall(filler)
        except (BrokenPipeError, ConnectionResetError):
            pass
        return _read_all(sock)


async def test_a_head_past_the_bound_is_answered_400_and_closed(started: Started) -> None:
    listener, door = await started()
    answer = await asyncio.to_thread(_oversized_head, listener.port)
    ((status, headers, body),) = _answers(answer)
    assert status == 400
    assert headers["connection"] == "close"
    assert orjson.loads(body)["error"]["code"] == "bad_request"
    assert door.seen == []


async def test_a_request_that_does_not_parse_is_answered_400(started: Started) -> None:
    listener, door = await started()
    answer = await asyncio.to_thread(_talk, listener.port, b"NOT HTTP AT ALL\r\n\r\n")
    ((status, _, body),) = _answers(answer)
    assert status == 400
    assert "parse" in orjson.loads(body)["error"]["message"]
    assert door.seen == []


def _large_declared(port: int, size: int) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(_post("/large", b"").replace(b"Length: 0", b"Length: %d" % size))
        # the client sends on: the answer still comes, not a reset
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            sock.sendall(b"z" * size)
        return _read_all(sock)


async def test_a_declared_body_past_the_bound_is_413_before_it_is_read(started: Started) -> None:
    listener, door = await started()
    answer = await asyncio.to_thread(_large_declared, listener.port, BODY_MAX + 1)
    ((status, headers, body),) = _answers(answer)
    assert (status, orjson.loads(body)["error"]["code"]) == (413, "body_too_large")
    assert headers["connection"] == "close"
    assert door.seen == []
    assert _COUNTER.labels("body_too_large")._value.get() >= 1


def _chunked(port: int, chunks: list[bytes]) -> bytes:
    head = b"POST /chunked HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
    body = b"".join(b"%x\r\n%s\r\n" % (len(c), c) for c in chunks) + b"0\r\n\r\n"
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            sock.sendall(head + body)
        return _read_all(sock)


async def test_a_chunked_body_is_read_whole_and_bounded(started: Started) -> None:
    listener, door = await started()
    ok = await asyncio.to_thread(_chunked, listener.port, [b"abc", b"defg"])
    # a chunked request keeps the connection: _read_all ends at the keep-alive close
    ((status, _, body),) = _answers(ok)
    assert (status, orjson.loads(body)["length"], orjson.loads(body)["head"]) == (
        200,
        7,
        "abcdefg",
    )
    large = await asyncio.to_thread(_chunked, listener.port, [b"y" * 40_000] * 2)
    ((status, _, body),) = _answers(large)
    assert (status, orjson.loads(body)["error"]["code"]) == (413, "body_too_large")
    assert len(door.seen) == 1


async def test_a_body_not_whole_in_time_is_503_and_closed(started: Started) -> None:
    listener, door = await started()
    after_s, answer = await asyncio.to_thread(
        _closed_after_s,
        listener.port,
        _post("/trickle", b"0123456789")[:-5],  # five bytes of the body never come
    )
    ((status, headers, body),) = _answers(answer)
    assert (status, orjson.loads(body)["error"]["code"]) == (503, "timeout")
    assert headers["connection"] == "close"
    assert LIMITS.timeout_s * 0.9 <= after_s < LIMITS.timeout_s + 1 + 1  # + the linger
    assert door.seen == []


async def test_a_request_not_answered_by_its_deadline_is_503_and_the_connection_goes_on(
    started: Started,
) -> None:
    listener, door = await started(dataclasses.replace(LIMITS, keep_alive_timeout_s=5))
    door.delay_s = 30
    reader, writer = await asyncio.open_connection("127.0.0.1", listener.port)
    sent_at = time.monotonic()
    writer.write(_post("/stuck", b"s"))
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
    took_s = time.monotonic() - sent_at
    length = int(head.split(b"content-length: ")[1].split(b"\r\n")[0])
    body = await reader.readexactly(length)
    assert head.startswith(b"HTTP/1.1 503 ")
    assert orjson.loads(body)["error"]["code"] == "timeout"
    # Cancelled by the listener's sweep (every 0.1 s with these limits), not before.
    assert LIMITS.timeout_s <= took_s < LIMITS.timeout_s + 0.5
    assert door.cancelled == 1
    # The connection is kept: the next request on it is answered as usual.
    door.delay_s = 0
    writer.write(_post("/next", b"n"))
    ((status, _, answer),) = _answers(await asyncio.wait_for(reader.read(65536), 5))
    assert (status, orjson.loads(answer)["path"]) == (200, "/next")
    writer.close()


def _expect_continue(port: int) -> tuple[bytes, bytes]:
    body = b"after the continue"
    head = _post("/continue", body, "Expect: 100-continue")[: -len(body)]
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(head)
        interim = sock.recv(65536)  # sent before the body
        sock.sendall(body)
        return interim, sock.recv(65536)


async def test_expect_100_continue_is_answered_before_the_body(started: Started) -> None:
    listener, _ = await started()
    interim, final = await asyncio.to_thread(_expect_continue, listener.port)
    assert interim == b"HTTP/1.1 100 Continue\r\n\r\n"
    assert orjson.loads(_answers(final)[0][2])["length"] == len(b"after the continue")


async def test_a_head_request_gets_the_head_alone(started: Started) -> None:
    listener, _ = await started()
    raw = await asyncio.to_thread(
        _talk, listener.port, b"HEAD /h HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    )
    head, _, rest = raw.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200 OK")
    assert b"content-length: " in head
    assert rest == b""


def _refused(listener: str, reason: str) -> float:
    value = REGISTRY.get_sample_value(
        "danube_listener_connections_refused_total", {"listener": listener, "reason": reason}
    )
    return value or 0.0


async def test_connections_past_the_caps_are_closed_at_accept_and_counted(
    started: Started,
) -> None:
    listener, _ = await started()
    per_client = _refused("test", "per_client")
    held = [socket.create_connection(("127.0.0.1", listener.port), timeout=5) for _ in range(4)]
    try:
        await until(lambda: len(listener.connections) == 4)  # all four accepted
        answer = await asyncio.to_thread(_talk, listener.port, _post("/x", b"x"))
        assert answer == b""  # this address holds its four
        assert _refused("test", "per_client") - per_client == 1
    finally:
        for sock in held:
            sock.close()
    await until(lambda: not listener.connections)  # their closes heard
    answer = await asyncio.to_thread(_talk, listener.port, _post("/x", b"x", "Connection: close"))
    assert _answers(answer)[0][0] == 200  # given back at close


async def test_the_global_cap_is_counted(started: Started) -> None:
    small = dataclasses.replace(
        LIMITS,
        timeout_s=1,
        header_timeout_s=5,
        keep_alive_timeout_s=5,
        max_connections=2,
        max_connections_per_client=2,
    )
    listener, _ = await started(small)
    before = _refused("test", "max_connections")
    held = [socket.create_connection(("127.0.0.1", listener.port), timeout=5) for _ in range(2)]
    try:
        await until(lambda: len(listener.connections) == 2)
        # the third: over the global cap (checked before the per-client one, equal here)
        assert await asyncio.to_thread(_talk, listener.port, _post("/x", b"x")) == b""
        assert _refused("test", "max_connections") - before == 1
    finally:
        for sock in held:
            sock.close()


def _unread_answers(port: int, count: int, door: Door) -> tuple[int, list[bytes]]:
    """Pipeline ``count`` requests, read nothing for a while, note how many the door has
    served, then read every answer."""
    with socket.socket() as sock:
        # A small window, set before the connection: the client's kernel takes little of
        # the answers (what the server's takes is bounded by its own send buffer, ~4 MiB).
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 * 1024)
        sock.settimeout(10)
        sock.connect(("127.0.0.1", port))
        sock.sendall(b"".join(_post(f"/{i}", b"p") for i in range(count)))
        time.sleep(0.5)
        served_while_unread = len(door.seen)
        sock.sendall(_post("/last", b"", "Connection: close"))
        return served_while_unread, [_read_all(sock)]


async def test_a_client_that_does_not_read_its_answers_stops_being_served(
    started: Started,
) -> None:
    listener, door = await started(
        dataclasses.replace(LIMITS, keep_alive_timeout_s=10, header_timeout_s=10),
        answer_bytes=64 * 1024,
    )
    count = 200  # 13 MiB of answers: over what the two kernels buffer
    served, (raw,) = await asyncio.to_thread(_unread_answers, listener.port, count, door)
    assert served < count // 2, served  # the loop stopped where the client stopped reading
    answers = _answers(raw)
    assert len(answers) == count + 1
    assert [orjson.loads(a[2])["path"] for a in answers] == [
        *(f"/{i}" for i in range(count)),
        "/last",
    ]


@pytest.fixture
def pki(tmp_path: Path) -> LocalPki:
    return ensure_local_pki(tmp_path / "pki", ["localhost", "127.0.0.1"], clients=["alice"])


async def _tls_post(port: int, context: ssl.SSLContext) -> dict[str, object]:
    reader, writer = await asyncio.open_connection(
        "127.0.0.1", port, ssl=context, server_hostname="localhost"
    )
    writer.write(_post("/tls", b"secret", "Connection: close"))
    raw = await reader.read()
    writer.close()
    ((status, _, body),) = _answers(raw)
    assert status == 200
    said: dict[str, object] = orjson.loads(body)
    return said


async def test_tls_hands_the_client_certificates_principal_with_each_request(
    started: Started, pki: LocalPki
) -> None:
    tls = TlsConfig(
        cert_file=pki.server.cert,
        key_file=pki.server.key,
        client_ca_file=pki.ca.cert,
        client_auth="optional",
    )
    listener, _ = await started(tls=ServerTls(tls))
    anonymous = ssl.create_default_context(cafile=str(pki.ca.cert))
    alice = ssl.create_default_context(cafile=str(pki.ca.cert))
    alice.load_cert_chain(pki.clients["alice"].cert, pki.clients["alice"].key)
    assert (await _tls_post(listener.port, alice))["principal"] == "alice"
    assert (await _tls_post(listener.port, anonymous))["principal"] is None
    plain = await asyncio.to_thread(_talk, listener.port, _post("/plain", b"x"))
    assert not plain.startswith(b"HTTP/1.1 200")  # no plain HTTP on a TLS door


async def test_a_stop_answers_the_request_in_progress_and_closes_idle_ones(
    started: Started,
) -> None:
    listener, door = await started(
        dataclasses.replace(LIMITS, keep_alive_timeout_s=10, header_timeout_s=10)
    )
    door.delay_s = 0.5
    idle_reader, idle_writer = await asyncio.open_connection("127.0.0.1", listener.port)
    busy_reader, busy_writer = await asyncio.open_connection("127.0.0.1", listener.port)
    busy_writer.write(_post("/busy", b"b"))
    await door.called.wait()
    closing = asyncio.create_task(listener.close(5.0))
    assert await asyncio.wait_for(idle_reader.read(), 1) == b""  # closed at once
    answer = await asyncio.wait_for(busy_reader.read(), 2)  # answered, then closed
    ((status, headers, _),) = _answers(answer)
    assert (status, headers["connection"]) == (200, "close")
    await asyncio.wait_for(closing, 2)
    with pytest.raises(ConnectionRefusedError):
        await asyncio.open_connection("127.0.0.1", listener.port)
    idle_writer.close()
    busy_writer.close()


async def test_a_stop_cuts_what_is_not_answered_within_its_time(started: Started) -> None:
    listener, door = await started()
    door.delay_s = 30
    reader, writer = await asyncio.open_connection("127.0.0.1", listener.port)
    writer.write(_post("/stuck", b"s"))
    await door.called.wait()
    started_at = time.monotonic()
    await listener.close(0.3)
    assert time.monotonic() - started_at < 1.5
    assert await asyncio.wait_for(reader.read(), 1) == b""
    assert listener.connections == set()
    writer.close()


async def test_requests_past_max_inflight_are_429_before_their_body_is_read(
    started: Started,
) -> None:
    listener, door = await started()
    door.delay_s = 0.5
    held = [await asyncio.open_connection("127.0.0.1", listener.port) for _ in range(2)]
    for _, writer in held:
        writer.write(_post("/slow", b"s"))
    await until(lambda: len(door.seen) == 2)  # both in progress (max_inflight=2)
    refused = await asyncio.to_thread(_talk, listener.port, _post("/third", b"t" * 1000))
    ((status, headers, body),) = _answers(refused)
    assert (status, orjson.loads(body)["error"]["code"]) == (429, "too_many_requests")
    assert headers["connection"] == "close"
    assert len(door.seen) == 2  # the third never reached the door
    for reader, writer in held:
        ((status, _, _),) = _answers(await asyncio.wait_for(reader.read(65536), 2))
        assert status == 200
        writer.close()
    assert listener.inflight == 0  # given back with the answers
    door.delay_s = 0
    again = await asyncio.to_thread(
        _talk, listener.port, _post("/fourth", b"f", "Connection: close")
    )
    assert _answers(again)[0][0] == 200

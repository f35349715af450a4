"""danube.bus._client on a real nats-server: write-through keeps order and flushes (a PING
never overtakes a queued command), replies resolved in the read loop keep timeouts and
no-responders, requests started there keep order and the pending queue's bound, all through a
server restart."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from danube import trace
from danube.bus import Bus, BusTimeoutError, Message, NoRespondersError, Request
from danube.bus.errors import InvalidSubjectError
from danube.config.model import BusConfig
from danube.up import ServerProcess, nats_spec
from danube.up.servers import free_port

pytestmark = pytest.mark.integration


@pytest.fixture
def config(nats_url: str) -> BusConfig:
    return BusConfig(
        servers=[nats_url],
        connect_timeout_s=2.0,
        request_timeout_s=2.0,
        drain_timeout_s=5.0,
        subject_prefix=f"t{uuid.uuid4().hex[:10]}",
    )


@pytest.fixture
async def client(config: BusConfig) -> AsyncIterator[Bus]:
    bus = await Bus.connect(config, name="test-client")
    yield bus
    await bus.close()


@pytest.fixture
async def server(config: BusConfig) -> AsyncIterator[Bus]:
    bus = await Bus.connect(config, name="test-server")
    yield bus
    await bus.close()


def _subject(bus: Bus, name: str) -> str:
    return f"{bus.config.subject_prefix}.{name}"


async def _collecting(bus: Bus, subject: str, count: int) -> asyncio.Task[list[Message]]:
    """A task gathering the next ``count`` messages of ``subject`` (subscribed on return)."""
    subscription = await bus.subscribe(subject)

    async def collect() -> list[Message]:
        got: list[Message] = []
        async with asyncio.timeout(10):
            async for message in subscription:
                got.append(message)
                if len(got) == count:
                    break
        return got

    return asyncio.create_task(collect())


async def test_a_publish_on_an_idle_connection_is_written_at_once(client: Bus, server: Bus) -> None:
    subject = _subject(client, "fast.idle")
    received = await _collecting(server, subject, 1)
    await client.publish(subject, b"one")
    # Written before the call returned: nothing left for nats-py's flusher task.
    assert client._nc.pending_data_size == 0
    assert [m.body for m in await received] == [b"one"]


async def test_a_plain_publish_is_one_pub_and_a_traced_one_keeps_its_header(
    client: Bus, server: Bus, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A publish with no headers outside any trace (a live stream's) is written as one plain
    ``PUB``; one inside a trace still carries the trace's id; a subject that is not one is
    refused every time (a refusal is not remembered as checked)."""
    subject = _subject(client, "fast.plain")
    received = await _collecting(server, subject, 2)
    transport = client._nc._transport
    assert transport is not None
    written: list[bytes] = []
    write = transport.write

    def record(data: bytes) -> None:
        written.append(bytes(data))
        write(data)

    monkeypatch.setattr(transport, "write", record)
    await client.publish(subject, b"plain")
    await asyncio.sleep(0)  # the next turn: write-through again
    with trace.bound("t-plain"):
        await client.publish(subject, b"traced")
    monkeypatch.undo()
    assert written[0] == b"PUB %b 5\r\nplain\r\n" % subject.encode()
    got = await received
    assert [m.body for m in got] == [b"plain", b"traced"]
    assert got[0].headers == {}
    assert got[1].headers.get("Danube-Trace-Id") == "t-plain"
    for bad in (f"{subject} x", f"{subject}.*", f"{subject}..x", f"{subject}\r\nPUB x 1"):
        for _ in range(2):
            with pytest.raises(InvalidSubjectError):
                await client.publish(bad, b"no")


async def test_write_through_and_the_flusher_keep_publish_order(client: Bus, server: Bus) -> None:
    subject = _subject(client, "fast.order")
    count = 300
    received = await _collecting(server, subject, count)
    # Bursts in one turn (the first goes straight, the rest through the flusher), lone
    # publishes between turns, and 256 KiB bodies that fill the socket's buffer.
    for index in range(count):
        size = 256 * 1024 if index % 50 == 7 else 16
        await client.publish(subject, index.to_bytes(4, "big") * (size // 4))
        if index % 10 == 0:
            await asyncio.sleep(0)
    got = await received
    assert [int.from_bytes(m.body[:4], "big") for m in got] == list(range(count))


async def test_a_ping_goes_out_after_the_commands_queued_before_it(
    client: Bus, server: Bus, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A flush's PING (a drain's, after its UNSUB) never overtakes a command waiting in the
    pending buffer: its PONG would come back before the server saw the command."""
    subject = _subject(client, "fast.ping")
    received = await _collecting(server, subject, 2)
    nc = client._nc
    transport = nc._transport
    assert transport is not None
    written: list[bytes] = []
    write, writelines = transport.write, transport.writelines

    def record(data: bytes) -> None:
        written.append(bytes(data))
        write(data)

    def record_lines(lines: list[bytes]) -> None:
        written.extend(bytes(line) for line in lines)
        writelines(lines)

    monkeypatch.setattr(transport, "write", record)
    monkeypatch.setattr(transport, "writelines", record_lines)
    await client.publish(subject, b"first")  # straight out: this turn's write-through
    await client.publish(subject, b"second")  # the same turn: the pending buffer
    assert nc._pending, "the second publish was to wait in the pending buffer"
    await nc.flush(timeout=2)  # nats-py's own flush, as a subscription's drain calls it
    monkeypatch.undo()
    wire = b"".join(written)
    assert wire.index(b"second") < wire.rindex(b"PING\r\n")
    assert [m.body for m in await received] == [b"first", b"second"]


async def test_close_flushes_what_was_published(config: BusConfig, server: Bus) -> None:
    subject = _subject(server, "fast.close")
    received = await _collecting(server, subject, 200)
    bus = await Bus.connect(config, name="short-lived")
    for index in range(200):
        await bus.publish(subject, index.to_bytes(4, "big"))
    await bus.close()
    assert [int.from_bytes(m.body, "big") for m in await received] == list(range(200))


async def test_a_reply_needs_no_subscription_task(client: Bus, server: Bus) -> None:
    subject = _subject(server, "fast.echo")

    async def echo(request: Request) -> bytes:
        return request.body

    await server.serve(subject, echo)
    assert (await client.request(subject, b"first")).body == b"first"
    # The reply subscription's own task is gone: replies are resolved where they are read.
    reply_sub = client._nc._subs[client._nc._reply_sid]  # type: ignore[index]
    assert reply_sub._wait_for_msgs_task is not None
    reply_sub._wait_for_msgs_task.cancel()
    replies = await asyncio.gather(*(client.request(subject, b"%d" % i) for i in range(20)))
    assert [r.body for r in replies] == [b"%d" % i for i in range(20)]


async def test_a_request_still_times_out_and_forgets_its_late_reply(
    client: Bus, server: Bus
) -> None:
    subject = _subject(server, "fast.slow")

    async def slow(request: Request) -> bytes:
        await asyncio.sleep(0.3)  # past the deadline: the responder answers it expired
        return b"late"

    await server.serve(subject, slow)
    started = asyncio.get_running_loop().time()
    with pytest.raises(BusTimeoutError):
        await client.request(subject, b"x", timeout_s=0.1)
    assert asyncio.get_running_loop().time() - started < 0.25
    await asyncio.sleep(0.2)  # the late answer arrives and finds no one waiting
    assert client._nc._resp_map == {}
    with pytest.raises(NoRespondersError):
        await client.request(_subject(server, "fast.nobody"), b"x", timeout_s=1.0)
    assert client._nc._resp_map == {}


async def test_requests_started_in_the_read_loop_keep_their_order_and_bound(
    client: Bus, server: Bus
) -> None:
    subject = _subject(server, "fast.serve")
    started: list[int] = []
    running = 0
    most = 0
    gate = asyncio.Event()

    async def handler(request: Request) -> bytes:
        nonlocal running, most
        started.append(int(request.body))
        running += 1
        most = max(most, running)
        await gate.wait()
        running -= 1
        return request.body

    await server.serve(subject, handler, max_concurrency=3)
    calls = [asyncio.create_task(client.request(subject, b"%d" % i)) for i in range(30)]
    async with asyncio.timeout(5):
        while len(started) < 3:  # noqa: ASYNC110  (a plain predicate: there is no event to await)
            await asyncio.sleep(0.01)
    await asyncio.sleep(0.1)  # time for a fourth to start, were the bound not kept
    assert started == [0, 1, 2]  # the rest wait in the pending queue
    gate.set()
    replies = await asyncio.gather(*calls)
    assert [r.body for r in replies] == [b"%d" % i for i in range(30)]
    assert started == list(range(30))
    assert most == 3


async def test_requests_and_publishes_survive_a_server_restart(tmp_path: Path) -> None:
    spec = nats_spec(port=free_port(), monitor_port=free_port())
    nats_server = ServerProcess(spec, tmp_path / "nats.log")
    nats_server.start()
    config = BusConfig(
        servers=[f"nats://127.0.0.1:{spec.port}"], reconnect_wait_s=0.1, request_timeout_s=2.0
    )
    try:
        serving = await Bus.connect(config, name="restart-server")
        calling = await Bus.connect(config, name="restart-client")

        async def echo(request: Request) -> bytes:
            return request.body

        await serving.serve("fast.restart", echo)
        assert (await calling.request("fast.restart", b"before")).body == b"before"
        nats_server.stop()
        async with asyncio.timeout(10):  # both saw the server go
            while serving.is_connected or calling.is_connected:  # noqa: ASYNC110
                await asyncio.sleep(0.01)
        nats_server = ServerProcess(spec, tmp_path / "nats-2.log")
        nats_server.start()
        async with asyncio.timeout(10):
            while not (serving.is_connected and calling.is_connected):  # noqa: ASYNC110
                await asyncio.sleep(0.05)
        await serving.flush()  # its subscription is back on the server
        # The reply subscription keeps its id across the reconnect: answers still resolve.
        assert (await calling.request("fast.restart", b"after")).body == b"after"
        received = await _collecting(serving, "fast.restart.pub", 50)
        for index in range(50):
            await calling.publish("fast.restart.pub", b"%d" % index)
        assert [int(m.body) for m in await received] == list(range(50))
        await calling.close()
        await serving.close()
    finally:
        nats_server.stop()

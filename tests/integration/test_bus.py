"""danube.bus on a real nats-server: request/reply, errors, deadlines, limits, streams, drain."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import os
import time
import uuid
import weakref
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

import nats
import pytest

from danube.bus import (
    TIMEOUT_HEADER,
    Bus,
    BusError,
    BusTimeoutError,
    Kind,
    Message,
    NoRespondersError,
    NotConnectedError,
    PayloadTooLargeError,
    RemoteError,
    Reply,
    Request,
)
from danube.bus.protocol import ERROR_CODE_HEADER, monotonic_s
from danube.bus.rpc import Responder
from danube.config.model import BusConfig
from danube.errors import DanubeError
from danube.up.servers import free_port

pytestmark = pytest.mark.integration

TOPIC = "/default/orders"


class NotFound(DanubeError):
    code = "not_found"


async def wait_until(predicate: Callable[[], bool], timeout_s: float = 5.0) -> None:
    """Poll ``predicate`` until it holds; fail the test if it does not within ``timeout_s``."""
    async with asyncio.timeout(timeout_s):
        while not predicate():  # noqa: ASYNC110  (a plain predicate: there is no event to await)
            await asyncio.sleep(0.005)


@pytest.fixture
def config(nats_url: str) -> BusConfig:
    # A prefix of its own per test: the session's one server is shared by every test.
    return BusConfig(
        servers=[nats_url],
        connect_timeout_s=2.0,
        request_timeout_s=2.0,
        drain_timeout_s=5.0,
        subject_prefix=f"t{uuid.uuid4().hex[:10]}",
    )


@pytest.fixture
async def server(config: BusConfig) -> AsyncIterator[Bus]:
    bus = await Bus.connect(config, name="test-server")
    yield bus
    await bus.close()


@pytest.fixture
async def client(config: BusConfig) -> AsyncIterator[Bus]:
    bus = await Bus.connect(config, name="test-client")
    yield bus
    await bus.close()


async def echo(request: Request) -> Reply:
    return Reply(request.body, {"Seen-Producer": request.headers.get("Producer", "")})


# --- request/reply -------------------------------------------------------------------


async def test_binary_body_and_headers_round_trip(server: Bus, client: Bus) -> None:
    subject = server.subjects.produce(TOPIC)
    await server.serve(subject, echo)
    body = bytes(range(256))
    reply = await client.request(subject, body, headers={"Producer": "p-1"})
    assert reply.body == body
    assert reply.headers["Seen-Producer"] == "p-1"


async def test_reconnect_stale_reconnects_and_keeps_serving(server: Bus, client: Bus) -> None:
    """A connection dropped as stale (what the ingest bus watch does once its round trips
    go unanswered) comes back, and what it served before is served again on the new one."""
    subject = server.subjects.produce(TOPIC)
    await server.serve(subject, echo)
    await server.reconnect_stale()
    await wait_until(lambda: server.reconnects == 1 and server.is_connected)
    reply = await client.request(subject, b"again")
    assert reply.body == b"again"


async def test_one_mib_body_round_trips(server: Bus, client: Bus) -> None:
    subject = server.subjects.wal_fetch(TOPIC)
    await server.serve(subject, echo)
    body = os.urandom(min(server.max_payload_bytes, 1024 * 1024) - 1024)
    assert len(body) >= 1023 * 1024
    reply = await client.request(subject, body)
    assert reply.body == body


async def test_oversize_body_is_refused_and_the_connection_lives_on(
    server: Bus, client: Bus
) -> None:
    subject = server.subjects.wal_fetch(TOPIC)
    await server.serve(subject, echo)
    with pytest.raises(PayloadTooLargeError) as info:
        await client.request(subject, b"x" * (client.max_payload_bytes + 1))
    assert info.value.limit_bytes == client.max_payload_bytes
    assert (await client.request(subject, b"still here")).body == b"still here"


async def test_oversize_reply_becomes_an_error(server: Bus, client: Bus) -> None:
    subject = server.subjects.wal_fetch(TOPIC)

    async def too_big(request: Request) -> bytes:
        return b"y" * (server.max_payload_bytes + 1)

    await server.serve(subject, too_big)
    with pytest.raises(RemoteError) as info:
        await client.request(subject, b"")
    assert info.value.code == "payload_too_large"


async def test_slow_handler_times_out_within_the_deadline(server: Bus, client: Bus) -> None:
    subject = server.subjects.wal_stats(TOPIC)
    cancelled = asyncio.Event()

    async def slow(request: Request) -> bytes:
        try:
            await asyncio.Event().wait()  # never set
        except asyncio.CancelledError:
            cancelled.set()
            raise
        return b""

    await server.serve(subject, slow)
    start = time.monotonic()
    with pytest.raises(BusTimeoutError) as info:
        await client.request(subject, b"", timeout_s=0.3)
    elapsed = time.monotonic() - start
    assert 0.29 <= elapsed < 0.3 + 0.25
    assert info.value.code == "timeout"
    assert info.value.retriable is True
    # The responder gives up at the same deadline: nobody would read the reply.
    async with asyncio.timeout(2):
        await cancelled.wait()


@pytest.mark.parametrize("retriable", [True, False])
async def test_typed_error_arrives_as_remote_error(
    server: Bus, client: Bus, retriable: bool
) -> None:
    subject = server.subjects.wal_stats(TOPIC)

    async def missing(request: Request) -> bytes:
        raise NotFound("no partition /default/orders-part-9\nhere", retriable=retriable)

    await server.serve(subject, missing)
    with pytest.raises(RemoteError) as info:
        await client.request(subject, b"")
    assert isinstance(info.value, BusError)
    assert info.value.code == "not_found"
    assert info.value.message == "no partition /default/orders-part-9\nhere"
    assert info.value.retriable is retriable
    assert info.value.subject == subject


async def test_other_exceptions_arrive_as_internal(
    server: Bus, client: Bus, caplog: pytest.LogCaptureFixture
) -> None:
    subject = server.subjects.wal_stats(TOPIC)

    async def broken(request: Request) -> bytes:
        raise ValueError("bad offset 7")

    await server.serve(subject, broken)
    with caplog.at_level(logging.ERROR, logger="danube.bus"), pytest.raises(RemoteError) as info:
        await client.request(subject, b"")
    assert (info.value.code, info.value.message, info.value.retriable) == (
        "internal",
        "bad offset 7",
        False,
    )
    logged = [r for r in caplog.records if r.exc_info and r.name.startswith("danube.bus")]
    assert logged, "the responder logs the traceback"
    assert isinstance(logged[0].exc_info[1], ValueError)  # type: ignore[index]


async def test_no_responders_is_fast(client: Bus) -> None:
    start = time.monotonic()
    with pytest.raises(NoRespondersError) as info:
        await client.request(client.subjects.produce(TOPIC), b"x", timeout_s=5.0)
    assert time.monotonic() - start < 1.0
    assert (info.value.code, info.value.retriable) == ("no_responders", True)


async def test_queue_group_spreads_requests(config: BusConfig, client: Bus) -> None:
    subject = client.subjects.cloud_fetch(TOPIC)
    first = await Bus.connect(config, name="reader-1")
    second = await Bus.connect(config, name="reader-2")
    try:

        def named(name: bytes) -> Callable[[Request], Awaitable[bytes]]:
            async def handler(request: Request) -> bytes:
                return name

            return handler

        await first.serve(client.subjects.all_of_kind(Kind.CLOUD_FETCH), named(b"1"), queue="q")
        await second.serve(client.subjects.all_of_kind(Kind.CLOUD_FETCH), named(b"2"), queue="q")
        replies = await asyncio.gather(*(client.request(subject, b"") for _ in range(40)))
        counts = Counter(r.body for r in replies)
        assert set(counts) == {b"1", b"2"}
        assert sum(counts.values()) == 40
    finally:
        await first.close()
        await second.close()


async def test_responder_receives_the_deadline(server: Bus, client: Bus) -> None:
    subject = server.subjects.wal_stats(TOPIC)
    seen: list[Request] = []

    async def record(request: Request) -> bytes:
        seen.append(request)
        return b""

    await server.serve(subject, record)
    before = monotonic_s()
    await client.request(subject, b"", timeout_s=3.0)
    after = monotonic_s()
    (request,) = seen
    assert before + 3.0 <= request.deadline_s <= after + 3.0
    assert request.headers[TIMEOUT_HEADER] == "3000"
    assert 0 < request.remaining_s() <= 3.0


async def test_expired_deadline_is_answered_without_running_the_handler(
    server: Bus, nats_url: str
) -> None:
    subject = server.subjects.produce(TOPIC)
    calls: list[Request] = []

    async def handler(request: Request) -> bytes:
        calls.append(request)
        return b"ran"

    await server.serve(subject, handler)
    raw = await nats.connect(nats_url)
    try:
        msg = await raw.request(subject, b"x", timeout=2, headers={TIMEOUT_HEADER: "0"})
    finally:
        await raw.close()
    assert msg.data == b""
    assert msg.headers is not None
    assert msg.headers[ERROR_CODE_HEADER] == "deadline_exceeded"
    assert calls == []


async def test_concurrency_bound_is_respected(server: Bus, client: Bus) -> None:
    subject = server.subjects.produce(TOPIC)
    running = 0
    peak = 0
    gate = asyncio.Event()

    async def held(request: Request) -> bytes:
        nonlocal running, peak
        running += 1
        peak = max(peak, running)
        try:
            await gate.wait()
        finally:
            running -= 1
        return request.body

    responder = await server.serve(subject, held, max_concurrency=3)
    calls = [
        asyncio.create_task(client.request(subject, bytes([i]), timeout_s=10)) for i in range(10)
    ]
    await wait_until(lambda: running == 3)
    assert responder.in_flight == 3
    gate.set()
    replies = await asyncio.gather(*calls)
    assert [r.body for r in replies] == [bytes([i]) for i in range(10)]
    assert peak == 3


async def test_unsubscribe_stops_answering_and_cancels_handlers(server: Bus, client: Bus) -> None:
    subject = server.subjects.produce(TOPIC)
    cancelled = asyncio.Event()

    async def held(request: Request) -> bytes:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled.set()
            raise
        return b""

    responder = await server.serve(subject, held)
    call = asyncio.create_task(client.request(subject, b"", timeout_s=10))
    await wait_until(lambda: responder.in_flight == 1)
    await responder.unsubscribe()  # the owner lost its lease
    assert cancelled.is_set()
    assert responder.in_flight == 0
    await server.flush()
    with pytest.raises(NoRespondersError):
        await client.request(subject, b"", timeout_s=2)
    call.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await call


# --- live streams --------------------------------------------------------------------


async def test_subscribe_iterates_published_messages_in_order(server: Bus, client: Bus) -> None:
    sub = await client.subscribe(client.subjects.all_partitions(Kind.LIVE, TOPIC))
    bodies = [bytes([i]) * (i + 1) + b"\x00\xff" for i in range(5)]
    for i, body in enumerate(bodies):
        subject = server.subjects.live(f"{TOPIC}-part-{i % 2}")
        await server.publish(subject, body, {"Offset": str(i)})
    received: list[Message] = []
    async with asyncio.timeout(5):
        async for message in sub:
            received.append(message)
            if len(received) == len(bodies):
                break
    assert [m.body for m in received] == bodies
    assert [m.headers["Offset"] for m in received] == [str(i) for i in range(5)]
    assert [client.subjects.parse(m.subject).topic for m in received] == [
        f"orders-part-{i % 2}" for i in range(5)
    ]
    with pytest.raises(BusTimeoutError):
        await sub.next(timeout_s=0.1)
    await sub.unsubscribe()


async def test_subscribe_with_callback_and_drop_counting(server: Bus, client: Bus) -> None:
    subject = server.subjects.live(TOPIC)
    got: list[bytes] = []
    gate = asyncio.Event()

    async def slow_consumer(message: Message) -> None:
        await gate.wait()
        got.append(message.body)

    sub = await client.subscribe(subject, slow_consumer, pending_msgs_limit=2)
    for i in range(10):
        await server.publish(subject, bytes([i]))
    await server.flush()
    await wait_until(lambda: sub.dropped + sub.pending >= 9)  # one more sits in the callback
    gate.set()
    await wait_until(lambda: len(got) + sub.dropped == 10)
    assert sub.dropped >= 1
    assert got == sorted(got)  # the survivors keep their order


async def test_publish_refuses_wildcards_and_reserved_headers(client: Bus) -> None:
    with pytest.raises(BusError):
        await client.publish(client.subjects.all_of_kind(Kind.LIVE), b"x")
    with pytest.raises(BusError):
        await client.publish(client.subjects.live(TOPIC), b"x", {TIMEOUT_HEADER: "1"})


# --- connection lifecycle ------------------------------------------------------------


async def test_connect_failure_is_typed_and_bounded() -> None:
    config = BusConfig(servers=[f"nats://127.0.0.1:{free_port()}"], reconnect_wait_s=0.1)
    start = time.monotonic()
    with pytest.raises(NotConnectedError) as info:
        await Bus.connect(config, name="nobody-home", timeout_s=0.5)
    assert time.monotonic() - start < 0.5 + 2.5
    assert info.value.retriable is True


async def test_close_drains_requests_in_flight(config: BusConfig, client: Bus) -> None:
    server = await Bus.connect(config, name="draining")
    subject = server.subjects.produce(TOPIC)
    started = asyncio.Event()
    release = asyncio.Event()

    async def handler(request: Request) -> bytes:
        started.set()
        await release.wait()
        return b"done"

    await server.serve(subject, handler)
    assert server.is_connected
    in_flight = asyncio.create_task(client.request(subject, b"", timeout_s=5))
    async with asyncio.timeout(5):
        await started.wait()
    closing = asyncio.create_task(server.close())
    await wait_until(lambda: not server.is_connected)
    assert not closing.done()  # waiting for the handler
    release.set()
    assert (await in_flight).body == b"done"
    async with asyncio.timeout(config.drain_timeout_s):
        await closing
    with pytest.raises(NoRespondersError):
        await client.request(subject, b"", timeout_s=1)


@asynccontextmanager
async def _stuck_request(
    config: BusConfig, name: str
) -> AsyncIterator[tuple[Bus, Responder, asyncio.Event]]:
    """A bus with a 0.3 s drain timeout serving a handler that never returns, with one
    request in it; the event is set when the handler is cancelled. Everything is closed
    after (closing the bus again is a no-op)."""
    short = config.model_copy(update={"drain_timeout_s": 0.3})
    server = await Bus.connect(short, name=name)
    client = await Bus.connect(short, name=f"{name}-client")
    cancelled = asyncio.Event()

    async def stuck(request: Request) -> bytes:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled.set()
            raise
        return b""

    responder = await server.serve(server.subjects.produce(TOPIC), stuck)
    call = asyncio.create_task(client.request(server.subjects.produce(TOPIC), b"", timeout_s=10))
    try:
        await wait_until(lambda: responder.in_flight == 1)
        yield server, responder, cancelled
    finally:
        call.cancel()
        with contextlib.suppress(asyncio.CancelledError, BusError):
            await call
        await server.close()
        await client.close()


async def test_close_cancels_handlers_past_the_drain_timeout(config: BusConfig) -> None:
    async with _stuck_request(config, "stuck") as (server, _, cancelled):
        start = time.monotonic()
        await server.close()
        assert time.monotonic() - start < 0.3 + 2.5
        assert cancelled.is_set()


async def test_a_responder_drained_alone_cancels_a_stuck_handler_past_the_drain_timeout(
    config: BusConfig,
) -> None:
    """An owner stops serving one subject (a dispatcher letting a subscription go, ingest
    stepping down) while its bus lives on: the drain ends within the timeout, not with the
    stuck handler."""
    async with _stuck_request(config, "stuck-one") as (_, responder, cancelled):
        start = time.monotonic()
        await responder.drain()
        assert time.monotonic() - start < 0.3 + 1.0
        await wait_until(cancelled.is_set)
        assert responder.in_flight == 0


async def test_a_finished_subscription_or_responder_is_not_kept_by_the_bus(
    server: Bus, client: Bus
) -> None:
    """Unsubscribed and dropped by their owner, subscriptions and responders are garbage:
    the bus's slow-consumer bookkeeping once kept every one ever made (a dispatcher leaked a
    whole subscription runtime per deleted topic through its reader's live subscription)."""

    async def ignore(_message: object) -> None:
        return None

    async def echo(request: Request) -> bytes:
        return request.body

    gone: list[weakref.ref[object]] = []
    for i in range(50):
        subscription = await client.subscribe(f"leak.sub.{i}", ignore)
        await subscription.unsubscribe()
        gone.append(weakref.ref(subscription))
        responder = await server.serve(f"leak.rpc.{i}", echo)
        await responder.drain()
        gone.append(weakref.ref(responder))
    del subscription, responder
    await asyncio.sleep(0.2)  # the last one's message task ends
    gc.collect()
    assert [ref for ref in gone if ref() is not None] == []

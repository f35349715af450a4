"""The dispatcher service on real NATS and etcd with an in-process ingest: exclusive, shared,
failover, nack with delay, dead letters, cursors that survive a restart, seek refusals and
exact backlog."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

import pytest
from prometheus_client import REGISTRY

from danube.bus import Bus, RemoteError, TopicName
from danube.config import (
    DanubeSettings,
)
from danube.dispatcher import app as dispatcher_app
from danube.frame import Record, decode_record, encode_record
from danube.ingest import app as ingest_app
from danube.meta import MetaStore
from danube.meta import keys as meta_keys
from danube.meta.records import Owner, SubscriptionCursor, TopicConfig
from danube.runtime.service import run_in_process
from danube.wire.dispatcher.client import DispatcherClient
from danube.wire.dispatcher.protocol import PolledMessage
from danube.wire.ingest.client import IngestClient

pytestmark = pytest.mark.integration

SHARED_MESSAGES = 30_000  # as the issue asks: each to exactly one of 3 consumers


@pytest.fixture
def settings(mesh_settings: Callable[..., DanubeSettings]) -> DanubeSettings:
    """The integration mesh's settings, with at most two redeliveries before a dead letter."""
    base = mesh_settings()
    dispatcher = base.dispatcher.model_copy(update={"max_redeliveries": 2})
    return base.model_copy(update={"dispatcher": dispatcher})


@asynccontextmanager
async def mesh(settings: DanubeSettings) -> AsyncIterator[None]:
    async with (
        run_in_process(ingest_app.serve, settings, "ingest-a"),
        run_in_process(dispatcher_app.serve, settings, "disp-a"),
    ):
        yield


async def _produce(bus: Bus, partition: TopicName, payloads: list[bytes]) -> int:
    records = [encode_record(Record(payload=p, publish_time_ms=1, producer="t")) for p in payloads]
    return await IngestClient(bus).produce(partition, records, timeout_s=10)


def _refs(messages: list[PolledMessage]) -> list[tuple[str, int]]:
    return [(m.partition, m.offset) for m in messages]


async def _poll_until(
    client: DispatcherClient, topic: TopicName, sub: str, consumer: str, count: int
) -> list[PolledMessage]:
    got: list[PolledMessage] = []
    async with asyncio.timeout(10):
        while len(got) < count:
            got += await client.poll(topic, sub, consumer, max=count - len(got), wait_ms=500)
    return got


async def test_exclusive_refuses_a_second_consumer(bus: Bus, settings: DanubeSettings) -> None:
    topic = TopicName("default", "excl")
    client = DispatcherClient(bus)
    async with mesh(settings):
        first = await client.attach(topic, "s", "c1", type="exclusive")
        with pytest.raises(RemoteError) as refused:
            await client.attach(topic, "s", "c2", type="exclusive")
        assert refused.value.code == "subscription_taken"
        await _produce(bus, topic, [b"a", b"b"])
        got = await _poll_until(client, topic, "s", first, 2)
        assert [(m.offset, decode_record(m.record).payload) for m in got] == [(0, b"a"), (1, b"b")]
        await client.detach(topic, "s", first)
        # Once the holder left, the subscription is free again.
        await client.attach(topic, "s", "c2", type="exclusive")


async def test_a_silent_consumer_expires_and_frees_the_exclusive_subscription(
    bus: Bus, settings: DanubeSettings
) -> None:
    topic = TopicName("default", "expiry")
    client = DispatcherClient(bus)
    dispatcher = settings.dispatcher.model_copy(update={"consumer_session_timeout_s": 1.0})
    settings = settings.model_copy(update={"dispatcher": dispatcher})
    async with mesh(settings):
        silent = await client.attach(topic, "s", "c1")
        # A long poll is being heard from: it outlives the 1 s session timeout; and it waits
        # without holding the event loop (the dispatcher runs in this process).
        lags: list[float] = []

        async def measure_lag() -> None:
            while True:
                before = time.monotonic()
                await asyncio.sleep(0.01)
                lags.append(time.monotonic() - before - 0.01)

        monitor = asyncio.create_task(measure_lag())
        assert await client.poll(topic, "s", silent, wait_ms=1500) == []
        monitor.cancel()
        assert max(lags) < 0.2
        with pytest.raises(RemoteError) as refused:
            await client.attach(topic, "s", "c2")
        assert refused.value.code == "subscription_taken"
        started = time.monotonic()
        codes: list[str] = []
        async with asyncio.timeout(5):
            while True:
                try:
                    await client.attach(topic, "s", "c2")
                    break
                except RemoteError as exc:
                    codes.append(exc.code)
                await asyncio.sleep(0.1)
        assert set(codes) <= {"subscription_taken"}
        assert time.monotonic() - started >= 0.9
        with pytest.raises(RemoteError) as gone:
            await client.poll(topic, "s", silent, wait_ms=0)
        assert gone.value.code == "consumer_not_found"


async def test_shared_spreads_each_message_to_exactly_one_consumer(
    bus: Bus, store: MetaStore, settings: DanubeSettings
) -> None:
    topic = TopicName("default", "shared")
    await store.put_model(
        meta_keys.topic_key(topic), TopicConfig(partitions=3, created_ms=int(time.time() * 1000))
    )
    client = DispatcherClient(bus)
    per_partition = SHARED_MESSAGES // 3
    async with mesh(settings):
        consumers = [
            await client.attach(topic, "s", f"c{i}", type="shared", start="earliest")
            for i in range(3)
        ]
        for partition in topic.partitions(3):
            for start in range(0, per_partition, 500):
                count = min(500, per_partition - start)
                await _produce(bus, partition, [b"m%d" % i for i in range(start, start + count)])
        seen: list[tuple[str, tuple[str, int]]] = []

        async def consume(consumer: str) -> None:
            while len(seen) < SHARED_MESSAGES:
                got = await client.poll(topic, "s", consumer, max=100, wait_ms=200)
                seen.extend((consumer, ref) for ref in _refs(got))
                if got:
                    await client.ack(topic, "s", consumer, _refs(got))

        async with asyncio.timeout(60):
            await asyncio.gather(*(consume(c) for c in consumers))
        refs = Counter(ref for _, ref in seen)
        assert len(refs) == SHARED_MESSAGES
        assert set(refs.values()) == {1}
        expected = {(p.topic, o) for p in topic.partitions(3) for o in range(per_partition)}
        assert set(refs) == expected
        by_consumer = Counter(consumer for consumer, _ in seen)
        assert set(by_consumer) == set(consumers)
        assert await client.poll(topic, "s", consumers[0], wait_ms=300) == []


async def test_failover_standby_takes_over_from_the_first_unacked(
    bus: Bus, settings: DanubeSettings
) -> None:
    topic = TopicName("default", "fail")
    client = DispatcherClient(bus)
    async with mesh(settings):
        active = await client.attach(topic, "s", "a", type="failover")
        standby = await client.attach(topic, "s", "b", type="failover")
        await _produce(bus, topic, [b"%d" % i for i in range(10)])
        got = await _poll_until(client, topic, "s", active, 10)
        assert [m.offset for m in got] == list(range(10))
        await client.ack(topic, "s", active, _refs(got[:3]))
        assert await client.poll(topic, "s", standby, wait_ms=200) == []
        await client.detach(topic, "s", active)
        taken = await _poll_until(client, topic, "s", standby, 7)
        assert [m.offset for m in taken] == list(range(3, 10))
        assert {m.redelivery_count for m in taken} == {1}


async def test_nack_delay_then_dead_letter_after_max_redeliveries(
    bus: Bus, store: MetaStore, settings: DanubeSettings
) -> None:
    topic = TopicName("default", "nacked")
    client = DispatcherClient(bus)
    dead_before = _sample("danube_dispatcher_dead_lettered_messages_total")
    aged_before = _sample("danube_dispatcher_delivery_age_seconds_count")
    reads_before = _reads()
    async with mesh(settings):
        consumer = await client.attach(topic, "s", "c", type="exclusive")
        await _produce(bus, topic, [b"poison"])
        (first,) = await _poll_until(client, topic, "s", consumer, 1)
        assert (first.offset, first.redelivery_count) == (0, 0)
        await client.nack(topic, "s", consumer, _refs([first]), delay_ms=400)
        nacked_at = time.monotonic()
        assert await client.poll(topic, "s", consumer, wait_ms=0) == []
        (again,) = await _poll_until(client, topic, "s", consumer, 1)
        assert time.monotonic() - nacked_at >= 0.35
        assert (again.offset, again.redelivery_count) == (0, 1)
        await client.nack(topic, "s", consumer, _refs([again]))
        (third,) = await _poll_until(client, topic, "s", consumer, 1)
        assert third.redelivery_count == 2
        # max_redeliveries = 2: the third refusal sends it to the dead-letter topic.
        await client.nack(topic, "s", consumer, _refs([third]))
        dlq = await IngestClient(bus).fetch(TopicName("default", "nacked-dlq"), 0)
        assert [decode_record(f.payload).payload for f in dlq.frames] == [b"poison"]
        # A real topic: it has a config (so it is listed, described, deleted like any other).
        dlq_config = await store.get_model("topics/default/nacked-dlq", TopicConfig)
        assert dlq_config is not None
        assert (dlq_config.partitions, dlq_config.dispatch) == (0, "reliable")
        assert _sample("danube_dispatcher_dead_lettered_messages_total") == dead_before + 1
        await _produce(bus, topic, [b"next"])
        (after,) = await _poll_until(client, topic, "s", consumer, 1)
        assert (after.offset, after.redelivery_count) == (1, 0)
        # Per-hop metrics: two first deliveries aged (redeliveries are not a hop), reads timed
        # (a fetch) or counted (frames a live wake-up carried).
        assert _sample("danube_dispatcher_delivery_age_seconds_count") == aged_before + 2
        assert _reads() > reads_before
        cursor_key = meta_keys.subscription_cursor_key(topic, "s", topic)
        async with asyncio.timeout(5):
            while True:
                cursor = await store.get_model(cursor_key, SubscriptionCursor)
                if cursor is not None and cursor.next_offset == 1:
                    break
                await asyncio.sleep(0.05)


async def test_restart_redelivers_only_unacked(
    bus: Bus, store: MetaStore, settings: DanubeSettings
) -> None:
    topic = TopicName("default", "restart")
    client = DispatcherClient(bus)
    async with run_in_process(ingest_app.serve, settings, "ingest-a"):
        async with run_in_process(dispatcher_app.serve, settings, "disp-a"):
            consumer = await client.attach(topic, "s", "c", start="earliest")
            await _produce(bus, topic, [b"%d" % i for i in range(10)])
            got = await _poll_until(client, topic, "s", consumer, 10)
            acked = [m for m in got if m.offset < 5 or m.offset == 7]
            await client.ack(topic, "s", consumer, _refs(acked))
        # The clean stop wrote the cursor and released the subscription.
        owner_key = meta_keys.subscription_owner_key(topic, "s")
        assert await store.get_model(owner_key, Owner) is None
        cursor_key = meta_keys.subscription_cursor_key(topic, "s", topic)
        cursor = await store.get_model(cursor_key, SubscriptionCursor)
        assert cursor is not None
        assert (cursor.next_offset, cursor.acked_beyond) == (5, (7,))
        async with run_in_process(dispatcher_app.serve, settings, "disp-b"):
            consumer = await client.attach(topic, "s", "c")
            again = await _poll_until(client, topic, "s", consumer, 4)
            assert [m.offset for m in again] == [5, 6, 8, 9]
            assert await client.poll(topic, "s", consumer, wait_ms=300) == []
            owner = await store.get_model(owner_key, Owner)
            assert owner is not None
            assert owner.node_id == "disp-b"


def _sample(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


def _reads() -> float:
    """WAL reads of the dispatcher: fetches timed, and messages taken from live wake-ups."""
    fetches = _sample("danube_dispatcher_fetch_seconds_count", tier="wal")
    return fetches + _sample("danube_dispatcher_live_carried_messages_total")


async def test_non_reliable_slow_consumer_loses_messages_and_slows_nobody(
    bus: Bus, store: MetaStore, settings: DanubeSettings
) -> None:
    topic = TopicName("default", "nr")
    await store.put_model(
        meta_keys.topic_key(topic),
        TopicConfig(dispatch="non_reliable", created_ms=int(time.time() * 1000)),
    )
    buffer = 100
    dispatcher = settings.dispatcher.model_copy(update={"non_reliable_buffer_messages": buffer})
    client = DispatcherClient(bus)

    async def produce(count: int) -> tuple[float, list[int]]:
        started = time.perf_counter()
        offsets: list[int] = []
        for start in range(0, count, 50):
            first = await _produce(bus, topic, [b"n%d" % i for i in range(start, start + 50)])
            offsets += range(first, first + 50)
        return time.perf_counter() - started, offsets

    async with mesh(settings.model_copy(update={"dispatcher": dispatcher})):
        alone_s, _ = await produce(5000)  # nobody subscribed
        stuck = await client.attach(topic, "slow", "slow", type="exclusive", start="latest")
        active = await client.attach(topic, "fast", "fast", type="shared")
        received: list[int] = []

        async def consume(stop: asyncio.Event) -> None:
            while not stop.is_set():
                got = await client.poll(topic, "fast", active, max=1000, wait_ms=100)
                received.extend(m.offset for m in got)

        dropped_before = _sample("danube_dispatcher_dropped_messages_total", reason="slow_consumer")
        stop = asyncio.Event()
        consumer = asyncio.create_task(consume(stop))
        watched_s, offsets = await produce(5000)
        await asyncio.sleep(0.5)  # the last live batches reach the dispatcher
        stop.set()
        await consumer
        kept = await client.poll(topic, "slow", stuck, max=1000, wait_ms=0)

    # The consumer that never polled kept only the newest messages; the rest were dropped
    # and counted, and producing took about as long as with nobody listening.
    assert [m.offset for m in kept] == offsets[-buffer:]
    assert [m.redelivery_count for m in kept] == [0] * buffer
    dropped = _sample("danube_dispatcher_dropped_messages_total", reason="slow_consumer")
    assert dropped - dropped_before >= len(offsets) - buffer
    print(f"produce 5000: alone {alone_s:.3f} s, with a stuck consumer {watched_s:.3f} s")
    assert watched_s < 3 * alone_s + 1.0, (watched_s, alone_s)
    # The other subscription's consumer kept up: every message it got came in order.
    assert received
    assert received == sorted(set(received))


async def _cursor(store: MetaStore, topic: TopicName, partition: TopicName) -> SubscriptionCursor:
    cursor = await store.get_model(
        meta_keys.subscription_cursor_key(topic, "s", partition), SubscriptionCursor
    )
    assert cursor is not None
    return cursor


async def test_seek_earliest_offset_and_latest_move_the_cursor_at_once(
    bus: Bus, store: MetaStore, settings: DanubeSettings
) -> None:
    topic = TopicName("default", "seeking")
    client = DispatcherClient(bus)
    async with mesh(settings):
        consumer = await client.attach(topic, "s", "c", start="earliest")
        await _produce(bus, topic, [b"%d" % i for i in range(10)])
        got = await _poll_until(client, topic, "s", consumer, 10)
        await client.ack(topic, "s", consumer, _refs(got))
        async with asyncio.timeout(5):
            while True:  # acks are written in batches
                if (await _cursor(store, topic, topic)).next_offset == 10:
                    break
                await asyncio.sleep(0.05)

        # Back to the start: every acked message comes again, as a first delivery.
        assert await client.seek(topic, "s", "earliest") == {"seeking": 0}
        assert (await _cursor(store, topic, topic)).next_offset == 0  # written before the answer
        again = await _poll_until(client, topic, "s", consumer, 10)
        assert [(m.offset, m.redelivery_count) for m in again] == [(i, 0) for i in range(10)]
        assert [decode_record(m.record).payload for m in again] == [b"%d" % i for i in range(10)]

        # To an offset: what is unacked below it is dropped, delivery resumes there.
        assert await client.seek(topic, "s", {"offset": 7}) == {"seeking": 7}
        from_seven = await _poll_until(client, topic, "s", consumer, 3)
        assert [m.offset for m in from_seven] == [7, 8, 9]
        assert await client.poll(topic, "s", consumer, wait_ms=300) == []

        assert await client.seek(topic, "s", "latest") == {"seeking": 10}
        assert await client.poll(topic, "s", consumer, wait_ms=300) == []
        await _produce(bus, topic, [b"new"])
        (new,) = await _poll_until(client, topic, "s", consumer, 1)
        assert new.offset == 10
        for bad in ({"offset": -1}, {"time": 5}, "first", {"offset": 1, "timestamp_ms": 2}):
            with pytest.raises(RemoteError) as refused:
                await client.seek(topic, "s", bad)  # type: ignore[arg-type]
            assert refused.value.code == "bad_request", bad
        with pytest.raises(RemoteError) as unknown:
            await client.seek(topic, "nobody", "earliest")
        assert unknown.value.code == "subscription_not_found"


async def test_an_offset_seek_is_refused_while_no_ingest_tells_the_end(
    bus: Bus, settings: DanubeSettings
) -> None:
    topic = TopicName("default", "endless")
    client = DispatcherClient(bus, timeout_s=2.0)  # the refusal is retriable: retried till then
    async with run_in_process(dispatcher_app.serve, settings, "disp-a"):  # no ingest at all
        await client.attach(topic, "s", "c", start="earliest")
        with pytest.raises(RemoteError) as unknown:
            await client.seek(topic, "s", {"offset": 5})
        assert (unknown.value.code, unknown.value.retriable) == ("position_unavailable", True)
        assert "endless" in unknown.value.message
        assert await client.seek(topic, "s", {"offset": 0}) == {"endless": 0}  # never past an end
        with pytest.raises(RemoteError) as refused:
            await client.attach(topic, "other", "c", start={"offset": 3})
        assert refused.value.code == "position_unavailable"


async def test_stats_count_backlog_acks_beyond_and_consumers_and_never_claim(
    bus: Bus, store: MetaStore, settings: DanubeSettings
) -> None:
    topic = TopicName("default", "counted")
    client = DispatcherClient(bus)
    async with mesh(settings):
        assert await client.stats(topic, "s") is None  # nobody serves it, and stats does not
        assert await store.get(meta_keys.subscription_owner_key(topic, "s")) is None  # claim
        first = await client.attach(topic, "s", "one", type="shared", start="earliest")
        second = await client.attach(topic, "s", "two", type="shared")
        await _produce(bus, topic, [b"%d" % i for i in range(10)])
        got = await _poll_until(client, topic, "s", first, 4)
        assert [m.offset for m in got] == [0, 1, 2, 3]
        stats = await client.stats(topic, "s")
        assert stats is not None
        assert stats.type == "shared"
        assert [(c.consumer_id, c.name, c.unacked) for c in stats.consumers] == [
            (first, "one", 4),
            (second, "two", 0),
        ]
        (partition,) = stats.partitions
        assert (partition.partition, partition.next_offset, partition.backlog) == ("counted", 0, 10)
        assert (partition.wal_start, partition.wal_next) == (0, 10)
        await client.ack(topic, "s", first, [("counted", 1), ("counted", 3)])
        stats = await client.stats(topic, "s")
        assert stats is not None
        (partition,) = stats.partitions
        assert (partition.next_offset, partition.acked_beyond, partition.backlog) == (0, 2, 8)
        assert stats.consumers[0].unacked == 2
        await client.ack(topic, "s", first, [("counted", 0)])
        stats = await client.stats(topic, "s")
        assert stats is not None
        (partition,) = stats.partitions
        assert (partition.next_offset, partition.acked_beyond, partition.backlog) == (2, 1, 7)


async def test_backlog_is_exact_zero_when_all_acked_and_one_with_one_unacked(
    bus: Bus, store: MetaStore, settings: DanubeSettings
) -> None:
    topic = TopicName("default", "exact")
    await store.put_model(
        meta_keys.topic_key(topic), TopicConfig(partitions=2, created_ms=int(time.time() * 1000))
    )
    client = DispatcherClient(bus)
    per_partition = 50
    async with mesh(settings):
        consumer = await client.attach(topic, "s", "c", type="shared", start="earliest")
        for partition in topic.partitions(2):
            await _produce(bus, partition, [b"%d" % i for i in range(per_partition)])
        got = await _poll_until(client, topic, "s", consumer, 2 * per_partition)
        held_back = got[len(got) // 2]  # somewhere inside one partition, acks beyond it
        await client.ack(
            topic, "s", consumer, [r for r in _refs(got) if r != _refs([held_back])[0]]
        )
        stats = await client.stats(topic, "s")
        assert stats is not None
        backlogs = {p.partition: p.backlog for p in stats.partitions}
        assert backlogs == {
            p.topic: 1 if p.topic == held_back.partition else 0 for p in topic.partitions(2)
        }
        (held,) = [p for p in stats.partitions if p.partition == held_back.partition]
        assert (held.next_offset, held.wal_next) == (held_back.offset, per_partition)
        assert held.acked_beyond == per_partition - 1 - held_back.offset
        await client.ack(topic, "s", consumer, _refs([held_back]))
        stats = await client.stats(topic, "s")
        assert stats is not None
        assert [p.backlog for p in stats.partitions] == [0, 0]
        assert [p.next_offset for p in stats.partitions] == [per_partition] * 2


async def test_delete_removes_every_key_and_the_next_attach_starts_afresh(
    bus: Bus, store: MetaStore, settings: DanubeSettings
) -> None:
    topic = TopicName("default", "deleted")
    client = DispatcherClient(bus)
    async with mesh(settings):
        old = await client.attach(topic, "s", "c", type="exclusive", start="earliest")
        await _produce(bus, topic, [b"%d" % i for i in range(5)])
        got = await _poll_until(client, topic, "s", old, 5)
        await client.ack(topic, "s", old, _refs(got[:3]))
        await client.delete(topic, "s")
        assert await store.range(meta_keys.subscription_prefix(topic, "s")) == []
        with pytest.raises(RemoteError) as gone:
            await client.poll(topic, "s", old, wait_ms=0)
        assert gone.value.code == "consumer_not_found"
        # A new subscription of that name: another type is fine (the old config is gone),
        # the exclusive holder is gone, and it starts where the new attach says.
        fresh = await client.attach(topic, "s", "c2", type="shared", start="latest")
        assert (await _cursor(store, topic, topic)).next_offset == 5
        await _produce(bus, topic, [b"after"])
        (after,) = await _poll_until(client, topic, "s", fresh, 1)
        assert (after.offset, after.redelivery_count) == (5, 0)


async def test_an_attach_racing_a_delete_never_resurrects_the_old_cursor(
    bus: Bus, store: MetaStore, settings: DanubeSettings
) -> None:
    topic = TopicName("default", "raced")
    client = DispatcherClient(bus)
    async with mesh(settings):
        await _produce(bus, topic, [b"%d" % i for i in range(6)])
        for round_ in range(3):
            old = await client.attach(topic, "s", "old", type="shared", start={"offset": 0})
            got = await _poll_until(client, topic, "s", old, 6)
            await client.ack(topic, "s", old, _refs(got[:2]))  # the old cursor: 2
            await client.detach(topic, "s", old)
            assert (await _cursor(store, topic, topic)).next_offset == 2
            start = {"offset": 4 + round_ % 2}
            _, new = await asyncio.gather(
                client.delete(topic, "s"),
                client.attach(topic, "s", "new", type="shared", start=start),
            )
            config = await store.get(meta_keys.subscription_key(topic, "s"))
            if config is None:  # the attach came first and was deleted with the rest
                assert await store.range(meta_keys.subscription_prefix(topic, "s")) == []
                continue
            # The attach came after: a new subscription from its own start, never from 2.
            assert (await _cursor(store, topic, topic)).next_offset == start["offset"]
            polled = await _poll_until(client, topic, "s", new, 6 - start["offset"])
            assert [m.offset for m in polled] == list(range(start["offset"], 6))
            await client.delete(topic, "s")


async def test_non_reliable_subscriptions_refuse_seek_report_buffers_and_delete(
    bus: Bus, store: MetaStore, settings: DanubeSettings
) -> None:
    topic = TopicName("default", "nr-admin")
    await store.put_model(
        meta_keys.topic_key(topic),
        TopicConfig(dispatch="non_reliable", created_ms=int(time.time() * 1000)),
    )
    client = DispatcherClient(bus)
    async with mesh(settings):
        consumer = await client.attach(topic, "s", "c", type="shared")
        await _produce(bus, topic, [b"a", b"b", b"c"])
        async with asyncio.timeout(5):
            while True:  # the live batch reaches the buffer
                stats = await client.stats(topic, "s")
                assert stats is not None
                if stats.consumers and stats.consumers[0].unacked == 3:
                    break
                await asyncio.sleep(0.05)
        assert (stats.type, stats.partitions) == ("shared", [])
        with pytest.raises(RemoteError) as refused:
            await client.seek(topic, "s", "earliest")
        assert refused.value.code == "unsupported_operation"
        await client.delete(topic, "s")
        assert await store.range(meta_keys.subscription_prefix(topic, "s")) == []
        with pytest.raises(RemoteError) as gone:
            await client.poll(topic, "s", consumer, wait_ms=0)
        assert gone.value.code == "consumer_not_found"


async def test_a_subscription_whose_owner_key_goes_is_let_go_at_once(
    bus: Bus, store: MetaStore, settings: DanubeSettings
) -> None:
    """An idle subscription (its consumer gone, nothing to write) whose records are deleted
    with its topic stops being served within a moment, not at a cursor write it never makes:
    it was kept in memory and kept reading, one per deleted topic."""
    topic = TopicName("default", "gone")
    client = DispatcherClient(bus)
    served = {"dispatch": "reliable"}
    async with mesh(settings):
        before = _sample("danube_dispatcher_subscriptions", **served)
        consumer = await client.attach(topic, "s", "c", type="exclusive")
        await _produce(bus, topic, [b"x"])
        await _poll_until(client, topic, "s", consumer, 1)
        await client.detach(topic, "s", consumer)
        assert _sample("danube_dispatcher_subscriptions", **served) == before + 1
        await store.delete_prefix(meta_keys.subscriptions_prefix(topic))  # as a topic delete
        deadline = time.monotonic() + 5
        while _sample("danube_dispatcher_subscriptions", **served) != before:
            assert time.monotonic() < deadline, "still served after its keys were deleted"
            await asyncio.sleep(0.05)

"""Partitions move while serving, with real ingest processes: a reassignment of a factor-1
partition to another node under load (the copy catches up, leadership moves by a controlled
transfer, the old copy is deleted), the catch-up throttle, and SIGTERM handing every
leadership over at factor 3; every history checked by tests/history.py."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from danube.bus import TopicName
from danube.meta import MetaStore, encode_model
from danube.meta import keys as meta_keys
from danube.meta.records import Assignment
from tests.history import History

from replication import (
    Cluster,
    Producer,
    Tailer,
    connect,
    leader,
    read_all,
    wait_isr,
)

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

# A preferred leader gets its leadership back half a second after it is in sync (2 s default).
SETTLE = {"DANUBE_INGEST__PREFERRED_LEADER_SETTLE_S": "0.5"}


async def _assignment(store: MetaStore, partition: TopicName) -> tuple[Assignment, int]:
    found = await store.get_model_kv(meta_keys.partition_assignment_key(partition), Assignment)
    assert found is not None
    return found[0], found[1].mod_revision


async def _reassign(
    store: MetaStore, partition: TopicName, target: tuple[str, ...], **extra: object
) -> None:
    """What the controller writes to start a reassignment (the target set first)."""
    current, revision = await _assignment(store, partition)
    union = target + tuple(n for n in current.replicas if n not in target)
    moved = Assignment(
        replicas=union,
        min_insync_replicas=current.min_insync_replicas,
        assigned_ms=int(time.time() * 1000),
        adding=tuple(n for n in target if n not in current.replicas),
        removing=tuple(n for n in union if n not in target),
        **extra,
    )
    key = meta_keys.partition_assignment_key(partition)
    result = (
        await store.txn()
        .if_mod_revision(key, "==", revision)
        .then_put(key, encode_model(moved))
        .commit()
    )
    assert result.succeeded


async def _wait_reassigned(
    store: MetaStore, partition: TopicName, target: tuple[str, ...], *, timeout_s: float = 60.0
) -> Assignment:
    async with asyncio.timeout(timeout_s):
        while True:
            found, _ = await _assignment(store, partition)
            if found.replicas == target and not found.moving:
                return found
            await asyncio.sleep(0.05)


async def test_factor_1_partition_moves_to_another_node_under_load(
    cluster: Callable[..., Cluster], nats_url: str, store: MetaStore, tmp_path: Path
) -> None:
    """A factor-1 partition with data, a producer and a tailing reader: reassigned from
    ingest-0 to ingest-1, the new copy catches up, leadership moves by transfer (the old
    node answers not_owner, the producer's retry reaches the new one), the assignment ends
    as [ingest-1] with ingest-0 retired and its copy deleted; nothing lost, offsets dense,
    and the longest wait for one acknowledgement under a second."""
    nodes = cluster(2, factor=1, min_insync=1, **SETTLE)
    partition = TopicName("default", "move-part-0")
    history = History()
    bus, client = await connect(nats_url, "elastic-move")
    producer = Producer(client, partition, history)
    tailer = Tailer(client, partition, history)
    stop_tail = asyncio.Event()
    tail = asyncio.create_task(tailer.run(stop_tail))
    try:
        await producer.send(1)
        first = await leader(store, partition)
        source = first.node_id
        dest = next(n for n in nodes.specs if n != source)
        await producer.send(300)
        stop = asyncio.Event()
        running = asyncio.create_task(producer.run(stop))
        await asyncio.sleep(0.3)
        await _reassign(store, partition, (dest,))
        done = await _wait_reassigned(store, partition, (dest,))
        assert done.retired == (source,)
        owner = await leader(store, partition)
        assert owner.node_id == dest
        assert owner.epoch == first.epoch + 1  # one controlled transfer, no race
        await asyncio.sleep(0.5)
        stop.set()
        await running
        source_dir = tmp_path / "wal" / source / "default" / "move-part-0"
        async with asyncio.timeout(10):
            while True:
                if not source_dir.exists():
                    break
                await asyncio.sleep(0.05)
        await producer.send(5)
        stop_tail.set()
        await tail
        offsets = await read_all(client, partition, history)
        report = history.check(expect_contiguous_from={str(partition): 0})
        assert report.ok, report.summary()
        assert offsets == list(range(len(offsets)))
        assert len(offsets) >= producer.acked
        print(f"factor-1 move under load: longest ack wait {max(producer.stalls):.3f}s")
        assert max(producer.stalls) < 1.0
    finally:
        stop_tail.set()
        tail.cancel()
        await asyncio.gather(tail, return_exceptions=True)
        await bus.close()


async def test_catch_up_respects_the_throttle(
    cluster: Callable[..., Cluster], nats_url: str, store: MetaStore
) -> None:
    """A new replica of a partition holding ~3 MiB catches up at the assignment's
    catch-up limit (512 KiB/s): it takes at least the bytes over the rate (less a burst)."""
    nodes = cluster(2, factor=1, min_insync=1, **SETTLE)
    partition = TopicName("default", "throttle-part-0")
    bus, client = await connect(nats_url, "elastic-throttle")
    try:
        record = b"x" * 16_000
        from danube.frame import Record, encode_record

        payload = encode_record(Record(payload=record, publish_time_ms=1, producer="t"))
        for _ in range(40):
            await client.produce(partition, [payload] * 5, timeout_s=10.0)
        owner = await leader(store, partition)
        dest = next(n for n in nodes.specs if n != owner.node_id)
        total_bytes = 200 * len(payload)
        rate = 512 * 1024
        started = time.monotonic()
        await _reassign(store, partition, (dest,), catchup_bytes_s=rate)
        await _wait_reassigned(store, partition, (dest,), timeout_s=60.0)
        took_s = time.monotonic() - started
        measured = total_bytes / took_s
        print(f"catch-up of {total_bytes} bytes at {rate} B/s: {took_s:.2f}s, {measured:.0f} B/s")
        # The bucket starts with a quarter second's burst: the rest is paced.
        assert took_s >= (total_bytes - rate / 4) / rate * 0.9
        assert measured <= rate * 1.25
    finally:
        await bus.close()


async def _place(store: MetaStore, partition: TopicName, replicas: tuple[str, ...]) -> None:
    """Write a replica set (as the controller's placement does), preferred leader first."""
    now_ms = int(time.time() * 1000)  # the preferred leader claims first for a while
    assignment = Assignment(replicas=replicas, min_insync_replicas=2, assigned_ms=now_ms)
    assert await store.create_model(meta_keys.partition_assignment_key(partition), assignment)


async def test_rolling_restart_hands_leadership_over_and_leaders_come_back(
    cluster: Callable[..., Cluster], nats_url: str, store: MetaStore
) -> None:
    """Factor 3, min in-sync 2, six partitions whose preferred leaders are spread over the
    three nodes, a producer on each: SIGTERM and restart each node in turn. A stopping
    leader hands over (a controlled transfer, not a lease expiry), a stopping follower
    leaves the ISR at once, so the longest wait for one acknowledgement stays under a
    second; afterwards each node leads its two preferred partitions again (by transfer)."""
    nodes = cluster(3, factor=3, min_insync=2, **SETTLE)
    names = sorted(nodes.specs)
    partitions = [TopicName("default", f"roll-part-{i}") for i in range(6)]
    for i, partition in enumerate(partitions):
        await _place(store, partition, tuple(names[(i + k) % 3] for k in range(3)))
    history = History()
    bus, client = await connect(nats_url, "elastic-roll")
    producers = [Producer(client, p, history) for p in partitions]
    try:
        for producer in producers:
            await producer.send(10)
        for partition in partitions:
            await wait_isr(store, partition, 3)
        longest: dict[str, float] = {}
        for node in names:
            stop = asyncio.Event()
            running = [asyncio.create_task(p.run(stop)) for p in producers]
            await asyncio.sleep(0.3)
            await asyncio.to_thread(nodes.processes[node].stop)
            await asyncio.sleep(0.5)
            await asyncio.to_thread(nodes.start, node)
            for partition in partitions:
                await wait_isr(store, partition, 3)
            await asyncio.sleep(0.3)
            stop.set()
            await asyncio.gather(*running)
            longest[node] = max(p.stalls[-1] for p in producers)
        async with asyncio.timeout(30):
            while True:
                leaders = [(await leader(store, p)).node_id for p in partitions]
                if leaders == [names[i % 3] for i in range(6)]:
                    break
                await asyncio.sleep(0.1)
        for producer in producers:
            await producer.send(3)
        for partition in partitions:
            offsets = await read_all(client, partition, history)
            assert offsets == list(range(len(offsets)))
        report = history.check(expect_contiguous_from={str(p): 0 for p in partitions})
        assert report.ok, report.summary()
        print(
            "rolling restart (6 partitions, factor 3), longest ack wait per node: "
            + ", ".join(f"{n} {s:.3f}s" for n, s in longest.items())
        )
        assert max(longest.values()) < 1.0
    finally:
        await bus.close()

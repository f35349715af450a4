"""The fencing rule of a leader without its node lease, on a real WAL and the real bus
handlers (docs/replication.md, "Serving through an etcd outage"): it acknowledges while its
in-sync followers confirm its epoch; once one has moved to a newer leader it acknowledges
nothing more (a fetch at a newer epoch fences it at once; a follower gone silent fences it
within the contact bound), so no offset is acknowledged by two leaders."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from danube.bus import Request, Subjects
from danube.config import DanubeSettings
from danube.frame import decode_frames
from danube.frame.record import Record, encode_record
from danube.frame.record_decode import decode_record
from danube.ingest.epochs import EpochHistory
from danube.ingest.handlers import PartitionHandlers
from danube.ingest.leadership import NotLeaderError, Term
from danube.ingest.partition import Partition
from danube.ingest.wal import Durability, Wal, WalOptions
from danube.meta import TopicName
from danube.meta.records import Assignment
from danube.wire.ingest import protocol, replication
from danube.wire.sizes import body_limit

pytestmark = pytest.mark.integration

PARTITION = TopicName("ns", "t")
EPOCH = 5
CONTACT_S = 0.5


class _Bus:
    subjects = Subjects()
    max_payload_bytes = 1 << 20

    async def publish(self, subject: str, body: bytes, headers: Any = None) -> None:
        return None


class _Lease:
    """The node lease as the partition sees it (NodeLease.alive)."""

    alive = False  # etcd is away and the lease ran out


async def _leader(
    tmp_path: Path,
    replicas: tuple[str, ...] = ("a", "b", "c"),
    durability: Durability = Durability.FSYNC,
) -> tuple[Wal, Partition, PartitionHandlers]:
    options = WalOptions(
        durability=durability,
        max_batch_bytes=1 << 20,
        sync_interval_ms=5,
        rotation_max_bytes=1 << 26,
        rotation_max_age_s=None,
        cache_capacity=100,
        max_pending_bytes=1 << 22,
        max_frame_payload_bytes=1 << 16,
    )
    wal = await Wal.open(tmp_path / "a", options)
    min_insync = min(2, len(replicas))
    partition = Partition(
        PARTITION,
        wal,
        Term(PARTITION, EPOCH, replicas, replicas, min_insync, 1, 0),
        EpochHistory(((EPOCH, 0),)),
        store=None,  # type: ignore[arg-type]  # no ISR change happens here
        bus=_Bus(),  # type: ignore[arg-type]
        node_id="a",
        lease=_Lease(),  # type: ignore[arg-type]
        lag_max_s=30.0,
        contact_s=CONTACT_S,
        high_watermark=0,
        on_fenced=lambda _partition, _fatal: None,
    )
    store: Any = None
    handlers = PartitionHandlers(partition, DanubeSettings(), node_id="a", store=store)
    handlers._fetch_limit_bytes = body_limit(_Bus.max_payload_bytes)  # as serve() sets it
    return wal, partition, handlers


async def _fetch(
    handlers: PartitionHandlers, follower: str, from_offset: int, *, epoch: int = EPOCH
) -> replication.ReplFetchReply:
    body = replication.ReplFetchRequest(epoch, from_offset, 1 << 20, 0, follower).encode()
    deadline = asyncio.get_running_loop().time() + 5
    return replication.decode_repl_reply(
        await handlers.repl_fetch(Request("repl", body, {}, deadline_s=deadline))
    )


def _record(text: str) -> bytes:
    return encode_record(Record(payload=text.encode(), publish_time_ms=1, producer="t"))


async def _durable(wal: Wal, end: int) -> None:
    assert await wal.wait_for(end - 1, 5.0)


async def _acknowledged(
    wal: Wal, partition: Partition, handlers: PartitionHandlers, text: str
) -> int:
    """Produce one record while b and c confirm by fetching past it; its offset."""
    end = wal.next_offset + 1
    produce = asyncio.create_task(partition.produce([_record(text)]))
    await _durable(wal, end)
    for follower in ("b", "c"):
        assert (await _fetch(handlers, follower, end)).status is replication.ReplStatus.OK
    return (await asyncio.wait_for(produce, 5)).first_offset


async def test_a_fetch_at_a_newer_epoch_ends_the_old_leaders_acknowledgements(
    tmp_path: Path,
) -> None:
    wal, partition, handlers = await _leader(tmp_path)
    try:
        for follower in ("b", "c"):
            await _fetch(handlers, follower, 0)
        # Without its lease, confirmed by both followers: it serves on.
        assert [await _acknowledged(wal, partition, handlers, f"m{i}") for i in range(3)] == [
            0,
            1,
            2,
        ]
        # b claimed epoch 6 (it fetches here no more); c follows b and says so.
        reply = await _fetch(handlers, "c", 3, epoch=EPOCH + 1)
        assert reply.status is replication.ReplStatus.WRONG_EPOCH
        assert partition.fenced
        with pytest.raises(NotLeaderError):
            await partition.produce([_record("late")])
        assert partition.high_watermark == 3
        assert wal.next_offset == 3  # refused before the append
    finally:
        await wal.close()


async def test_a_silent_follower_stops_the_old_leader_within_the_contact_bound(
    tmp_path: Path,
) -> None:
    """c has not heard of the new epoch yet and keeps fetching; b, the new leader, is
    silent: the old leader appends the late record but never acknowledges it, and gives up
    within about the contact bound; readers never see it."""
    wal, partition, handlers = await _leader(tmp_path)
    try:
        for follower in ("b", "c"):
            await _fetch(handlers, follower, 0)
        assert await _acknowledged(wal, partition, handlers, "m0") == 0
        loop = asyncio.get_running_loop()
        started = loop.time()
        produce = asyncio.create_task(partition.produce([_record("late")]))
        await _durable(wal, 2)
        while not produce.done():  # c confirms over and over; b never again
            await _fetch(handlers, "c", wal.durable_next)
            await asyncio.sleep(0.05)
        with pytest.raises(NotLeaderError):
            await produce
        assert loop.time() - started < 2 * CONTACT_S + 0.5
        assert partition.fenced
        assert partition.high_watermark == 1  # the late record was never committed
        fetched = await handlers.fetch(
            Request("fetch", protocol.FetchRequest(0, 1 << 20, 100).encode(), {}, deadline_s=0)
        )
        _, _, _, body = protocol.decode_fetch_reply_head(fetched)
        frames, _ = decode_frames(body)
        assert [decode_record(f.payload).payload for f in frames] == [b"m0"]
    finally:
        await wal.close()


async def test_factor_1_serves_on_without_its_lease(tmp_path: Path) -> None:
    wal, partition, _ = await _leader(tmp_path, replicas=("a",))
    try:
        offsets = [(await partition.produce([_record(f"m{i}")])).first_offset for i in range(5)]
        assert offsets == [0, 1, 2, 3, 4]
        assert not partition.fenced
    finally:
        await wal.close()


async def test_a_non_reliable_partition_stops_with_its_lease(tmp_path: Path) -> None:
    """Memory only: another node may take it over without asking (nothing to lose), so its
    leader never serves without its lease."""
    wal, partition, _ = await _leader(tmp_path, replicas=("a",), durability=Durability.MEMORY)
    try:
        with pytest.raises(NotLeaderError):
            await partition.produce([_record("m0")])
        assert partition.fenced
    finally:
        await wal.close()


async def test_a_node_the_leader_does_not_know_as_a_replica_is_served_nothing(
    tmp_path: Path,
) -> None:
    """A new replica whose watch saw the reassignment before the leader's did: the leader
    serves it nothing (an empty answer after a short wait, not counted as a follower) until
    it reads the assignment, and then at the assignment's catch-up limit from the first
    fetch. Served at once, it caught up unthrottled (the elastic e2e throttle test saw
    654 KB/s against a 512 KiB/s limit)."""
    wal, partition, handlers = await _leader(tmp_path, replicas=("a", "b"))
    try:
        for index in range(20):
            await wal.append([_record(f"m{index}" + "x" * 16_000)])
        loop = asyncio.get_running_loop()
        started = loop.time()
        body = replication.ReplFetchRequest(EPOCH, 0, 1 << 20, 1000, "d").encode()
        deadline = loop.time() + 5
        reply = replication.decode_repl_reply(
            await handlers.repl_fetch(Request("repl", body, {}, deadline_s=deadline))
        )
        assert reply.status is replication.ReplStatus.OK
        assert bytes(reply.frames) == b""
        assert 0.05 <= loop.time() - started < 1.0  # it waited a little, not wait_ms
        assert "d" not in partition.tracker.isr
        rate = 64 * 1024
        partition.set_assignment(
            Assignment(replicas=("a", "b", "d"), assigned_ms=1, catchup_bytes_s=rate)
        )
        first = await _fetch(handlers, "d", 0)
        frames, _ = decode_frames(first.frames)
        assert [f.offset for f in frames][:1] == [0]
        # A fetch's least grant (64 KiB) and at most one frame more, not the 320 KB there are.
        assert len(first.frames) <= 64 * 1024 + 16_200
        assert first.leader_end == 20
        assert frames[-1].offset < 19
    finally:
        await wal.close()

"""A led partition's produce on a real WAL (files, fdatasync): the reply is ready before the
live wake-up goes out, a produce cancelled at its deadline is still written, and a WAL that
fails under a cancelled produce still fences the partition."""

from __future__ import annotations

import asyncio
import errno
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from danube.bus import Request, Subjects
from danube.config import DanubeSettings
from danube.frame.record import Record, encode_record
from danube.ingest.epochs import EpochHistory
from danube.ingest.handlers import PartitionHandlers
from danube.ingest.leadership import NotLeaderError, Term
from danube.ingest.partition import Partition
from danube.ingest.wal import Durability, OsFileOps, Wal, WalFailedError, WalOptions
from danube.meta import TopicName
from danube.wire.ingest import protocol

pytestmark = pytest.mark.integration

PARTITION = TopicName("ns", "t")


class GatedOps(OsFileOps):
    """The real disk, with an fdatasync that can be held and made to fail."""

    def __init__(self) -> None:
        self.gate = threading.Event()
        self.gate.set()
        self.fail = False
        self.entered = 0

    def fdatasync(self, fd: int) -> None:
        self.entered += 1
        if not self.gate.wait(timeout=10):
            raise OSError(errno.EIO, "gate never opened")
        if self.fail:
            raise OSError(errno.EIO, "injected fdatasync failure")
        super().fdatasync(fd)


class RecordingBus:
    """Notes each live publish in ``events`` (the order the test checks)."""

    subjects = Subjects()
    max_payload_bytes = 1 << 20

    def __init__(self, events: list[tuple[str, int]]) -> None:
        self.events = events

    async def publish(self, subject: str, body: bytes, headers: Any = None) -> None:
        wakeup = protocol.Wakeup.decode(body)
        assert wakeup is not None
        self.events.append(("live", wakeup.next_offset))


class _Lease:
    alive = True


async def _leader(
    tmp_path: Path, ops: GatedOps, events: list[tuple[str, int]], fenced: list[bool]
) -> tuple[Wal, Partition, PartitionHandlers]:
    options = WalOptions(
        durability=Durability.FSYNC,
        max_batch_bytes=1 << 20,
        sync_interval_ms=50,
        rotation_max_bytes=1 << 26,
        rotation_max_age_s=None,
        cache_capacity=100,
        max_pending_bytes=1 << 22,
        max_frame_payload_bytes=1 << 16,
    )
    wal = await Wal.open(tmp_path / "p", options, file_ops=ops)
    partition = Partition(
        PARTITION,
        wal,
        Term(PARTITION, 1, ("n1",), ("n1",), 1, 1, 0),
        EpochHistory(),
        store=None,  # type: ignore[arg-type]  # no ISR change with one replica
        bus=RecordingBus(events),  # type: ignore[arg-type]
        node_id="n1",
        lease=_Lease(),  # type: ignore[arg-type]
        lag_max_s=10.0,
        high_watermark=0,
        on_fenced=lambda _partition, fatal: fenced.append(fatal),
    )
    store: Any = None  # no backlog quota asked: the store is never read
    handlers = PartitionHandlers(partition, DanubeSettings(), node_id="n1", store=store)
    return wal, partition, handlers


def _record(payload: bytes) -> bytes:
    return encode_record(Record(payload=payload, publish_time_ms=7, producer="t"))


def _request(*payloads: bytes) -> Request:
    body = protocol.encode_produce_request([_record(p) for p in payloads])
    return Request("produce", body, {}, deadline_s=asyncio.get_running_loop().time() + 10)


async def _until(condition: Callable[[], bool]) -> None:
    async with asyncio.timeout(5):
        while not condition():  # noqa: ASYNC110  (a plain predicate: there is no event to await)
            await asyncio.sleep(0.002)


async def test_the_reply_is_ready_before_the_live_wake_up(tmp_path: Path) -> None:
    events: list[tuple[str, int]] = []
    wal, partition, handlers = await _leader(tmp_path, GatedOps(), events, [])
    live = asyncio.create_task(partition.live.run())
    try:
        for n in range(3):
            reply = await handlers.produce(_request(b"m%d" % n))
            end = protocol.decode_produce_reply(reply)[0] + 1
            events.append(("reply", end))
            await _until(lambda: ("live", end) in events)  # noqa: B023  (awaited in this pass)
        # Each produce's reply came back to the bus before its commit's live wake-up went out.
        assert events == [(kind, end) for end in (1, 2, 3) for kind in ("reply", "live")]
    finally:
        live.cancel()
        await asyncio.gather(live, return_exceptions=True)
        await wal.close()


async def test_a_produce_cancelled_at_its_deadline_is_still_written(tmp_path: Path) -> None:
    ops = GatedOps()
    fenced: list[bool] = []
    wal, partition, handlers = await _leader(tmp_path, ops, [], fenced)
    try:
        await handlers.produce(_request(b"first"))
        ops.gate.clear()  # the disk stalls in fdatasync
        cancelled = asyncio.create_task(handlers.produce(_request(b"late-1", b"late-2")))
        await _until(lambda: ops.entered == 2)
        cancelled.cancel()  # what the bus does at the caller's deadline
        with pytest.raises(asyncio.CancelledError):
            await cancelled
        assert wal.durable_next == 1
        ops.gate.set()
        await _until(lambda: partition.high_watermark == 3)
        reply = await handlers.produce(_request(b"next"))
        assert protocol.decode_produce_reply(reply)[:2] == (3, 1)
        fetched = await wal.fetch(0, max_bytes=1 << 20, max_count=10)
        assert fetched.messages == [
            (n, _record(p)) for n, p in enumerate([b"first", b"late-1", b"late-2", b"next"])
        ]
        assert fenced == []
    finally:
        ops.gate.set()
        await wal.close()


async def test_a_wal_failure_fences_the_partition_with_its_caller_gone(tmp_path: Path) -> None:
    ops = GatedOps()
    fenced: list[bool] = []
    wal, partition, handlers = await _leader(tmp_path, ops, [], fenced)
    try:
        ops.gate.clear()
        ops.fail = True
        cancelled = asyncio.create_task(handlers.produce(_request(b"doomed")))
        await _until(lambda: ops.entered == 1)
        cancelled.cancel()
        with pytest.raises(asyncio.CancelledError):
            await cancelled
        assert fenced == []
        ops.gate.set()
        await _until(lambda: bool(fenced))
        assert fenced == [True]  # fatal: the node restarts to reopen the WAL from disk
        assert partition.fenced
        with pytest.raises(NotLeaderError):
            await handlers.produce(_request(b"after"))
        with pytest.raises(WalFailedError):
            await wal.append([b"after"])
    finally:
        ops.gate.set()
        await wal.close()

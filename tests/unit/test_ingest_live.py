"""The live publisher of a led partition outlives bus failures: a publish that fails is retried
with capped backoff (one warning per burst), a body the bus can never carry is dropped and
counted, and the stream goes on in offset order. A non-reliable partition publishes frames; a
reliable one a durable_next wake-up, carrying its frames when the commits are small."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from types import SimpleNamespace
from typing import Any

import pytest

from danube.bus import BusTimeoutError, NotConnectedError, PayloadTooLargeError, Subjects
from danube.frame import decode_frames, encode_frame
from danube.ingest import metrics
from danube.ingest.epochs import EpochHistory
from danube.ingest.leadership import Term
from danube.ingest.live import frame_chunks
from danube.ingest.partition import Partition
from danube.ingest.wal import Durability
from danube.ingest.wal import feed as feed_module
from danube.ingest.wal.feed import DurableRun as Run
from danube.meta import TopicName
from danube.wire.ingest import protocol
from danube.wire.ingest.client import carried_reply

pytestmark = pytest.mark.unit

PARTITION = TopicName("ns", "t")


class FakeWal:
    """Only what a leader's partition asks of its WAL: the durable end and its listener, and
    its durability (memory: a non-reliable partition, whose live subject carries frames)."""

    def __init__(self, durability: Durability = Durability.MEMORY) -> None:
        self.options = SimpleNamespace(durability=durability)
        self.durable_next = 0
        self.start_offset = 0
        self._listener: Callable[[Run], None] | None = None

    def add_durable_listener(self, listener: Callable[[Run], None]) -> Any:
        self._listener = listener
        return lambda: None

    def add_failure_listener(self, listener: Callable[[str], None]) -> Any:
        return lambda: None

    def made_durable(self, payloads: Sequence[bytes], frames: bytes | None = None) -> None:
        """``payloads`` durable, ``frames``: as the WAL wrote them (None: it did not say)."""
        first = self.durable_next
        self.durable_next += len(payloads)
        assert self._listener is not None
        self._listener(Run(first, payloads, frames, sum(map(len, payloads))))


class FlakyBus:
    """A bus whose publish fails with the errors given, in order, then works."""

    subjects = Subjects()
    max_payload_bytes = 1 << 20

    def __init__(self, failures: list[Exception]) -> None:
        self.failures = failures
        self.attempts = 0
        self.published: list[bytes] = []
        self.got = asyncio.Event()

    async def publish(self, subject: str, body: bytes, headers: Any = None) -> None:
        self.attempts += 1
        if self.failures:
            raise self.failures.pop(0)
        self.published.append(body)
        self.got.set()


class _Lease:
    alive = True


def _partition(wal: FakeWal, bus: FlakyBus) -> Partition:
    term = Term(PARTITION, 1, ("n1",), ("n1",), 1, 1, 0)
    return Partition(
        PARTITION,
        wal,  # type: ignore[arg-type]
        term,
        EpochHistory(),
        store=None,  # type: ignore[arg-type]
        bus=bus,  # type: ignore[arg-type]
        node_id="n1",
        lease=_Lease(),  # type: ignore[arg-type]
        lag_max_s=10.0,
        high_watermark=0,
        on_fenced=lambda partition, fatal: None,
    )


@pytest.fixture
def no_wait(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """asyncio.sleep that only yields; the delays asked for."""
    delays: list[float] = []
    real_sleep = asyncio.sleep

    async def sleep(delay_s: float, *_: Any) -> None:
        delays.append(delay_s)
        await real_sleep(0)

    monkeypatch.setattr(asyncio, "sleep", sleep)
    return delays


async def _published_offsets(bus: FlakyBus, count: int) -> list[int]:
    async with asyncio.timeout(5):
        while sum(len(decode_frames(b)[0]) for b in bus.published) < count:
            bus.got.clear()
            await bus.got.wait()
    return [frame.offset for body in bus.published for frame in decode_frames(body)[0]]


async def test_a_failing_publish_is_retried_and_the_stream_goes_on(
    no_wait: list[float], caplog: pytest.LogCaptureFixture
) -> None:
    wal = FakeWal()
    bus = FlakyBus([NotConnectedError("down"), BusTimeoutError("live", 1.0)] * 3)
    partition = _partition(wal, bus)
    task = asyncio.create_task(partition.live.run())
    try:
        with caplog.at_level(logging.INFO, logger="danube.ingest.partition"):
            wal.made_durable([b"a", b"b"])
            assert await _published_offsets(bus, 2) == [0, 1]
            wal.made_durable([b"c"])  # after the burst: published at once
            assert await _published_offsets(bus, 3) == [0, 1, 2]
        assert not task.done()
        assert bus.attempts == 6 + 2
        assert len(no_wait) == 6
        assert max(no_wait) <= 1.0  # capped backoff between attempts
        warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
        assert len(warnings) == 1  # once per burst, not once per attempt
    finally:
        task.cancel()
        await asyncio.wait({task})


@pytest.mark.parametrize(
    "error",
    [PayloadTooLargeError(size_bytes=2 << 20, limit_bytes=1 << 20), RuntimeError("a bug")],
    ids=["too-large", "unexpected"],
)
async def test_a_body_the_bus_refuses_for_good_is_dropped_and_counted(
    no_wait: list[float], error: Exception
) -> None:
    wal = FakeWal()
    bus = FlakyBus([error])
    partition = _partition(wal, bus)
    dropped_before = metrics.LIVE_DROPPED._value.get()
    task = asyncio.create_task(partition.live.run())
    try:
        wal.made_durable([b"huge"])
        wal.made_durable([b"next"])
        assert await _published_offsets(bus, 1) == [1]
        assert not task.done()
        assert metrics.LIVE_DROPPED._value.get() == dropped_before + 1
        assert no_wait == []  # no retry of what can never fit
    finally:
        task.cancel()
        await asyncio.wait({task})


async def test_a_reliable_partition_publishes_one_wakeup_per_ready_run() -> None:
    """Batches committed while the publisher was busy go out as one durable_next wake-up:
    the next offset, how many messages and payload bytes, no records."""
    wal = FakeWal(Durability.FSYNC)
    bus = FlakyBus([])
    partition = _partition(wal, bus)
    wal.made_durable([b"a", b"bb"])
    wal.made_durable([b"ccc"])
    task = asyncio.create_task(partition.live.run())
    try:
        async with asyncio.timeout(5):
            await bus.got.wait()
        assert [protocol.Wakeup.decode(body) for body in bus.published] == [
            protocol.Wakeup(next_offset=3, count=3, payload_bytes=6)
        ]
        # Small: the wake-up carries the run's frames, what a fetch from offset 0 answers.
        carried = protocol.Carried.decode(bus.published[0])
        assert carried is not None
        assert carried.first_offset == 0
        reply = carried_reply(PARTITION, carried)
        assert (reply.below_wal_start, reply.damaged, reply.next_offset) == (False, None, 3)
        frames = decode_frames(b"".join(bytes(frame.data) for frame in reply.frames))[0]
        assert [(f.offset, bytes(f.payload)) for f in frames] == [
            (0, b"a"),
            (1, b"bb"),
            (2, b"ccc"),
        ]
        bus.got.clear()
        wal.made_durable([b"d"])
        async with asyncio.timeout(5):
            await bus.got.wait()
        assert protocol.Wakeup.decode(bus.published[-1]) == protocol.Wakeup(4, 1, 1)
        assert protocol.Carried.decode(bus.published[-1]) is not None
    finally:
        task.cancel()
        await asyncio.wait({task})


async def test_a_large_commit_or_a_gap_is_a_plain_wakeup() -> None:
    """Over LIVE_CARRY_BYTES_MAX the frames would cross the bus twice: a plain wake-up; a
    run with a batch missing (dropped from a full live queue) too: readers then fetch."""
    wal = FakeWal(Durability.FSYNC)
    bus = FlakyBus([])
    partition = _partition(wal, bus)
    big = b"x" * (protocol.LIVE_CARRY_BYTES_MAX + 1)
    task = asyncio.create_task(partition.live.run())
    try:
        wal.made_durable([big])
        async with asyncio.timeout(5):
            await bus.got.wait()
        assert bus.published[-1] == protocol.Wakeup(1, 1, len(big)).encode()
        # A run with a batch missing between two others (dropped from a full live queue).
        gap = partition.live.wakeup_body(
            protocol.Wakeup(4, 2, 2), [Run(1, [b"a"], None, 1), Run(3, [b"c"], None, 1)]
        )
        assert gap == protocol.Wakeup(4, 2, 2).encode()
        whole = partition.live.wakeup_body(
            protocol.Wakeup(4, 3, 3), [Run(1, [b"a", b"b"], None, 2), Run(3, [b"c"], None, 1)]
        )
        assert protocol.Carried.decode(whole) is not None
    finally:
        task.cancel()
        await asyncio.wait({task})


async def test_frames_the_wal_wrote_are_published_as_they_are(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A run the WAL hands on with its frames goes out in those bytes, framed by nobody
    here; one without (a batch of several runs) is framed as the codec frames it."""

    def framed_again(*_: object) -> int:
        raise AssertionError("the WAL's frames were framed again")

    wal = FakeWal()
    bus = FlakyBus([])
    partition = _partition(wal, bus)
    task = asyncio.create_task(partition.live.run())
    try:
        monkeypatch.setattr(feed_module, "append_frame", framed_again)
        written = encode_frame(0, b"a") + encode_frame(1, b"bc")
        wal.made_durable([b"a", b"bc"], written)
        assert await _published_offsets(bus, 2) == [0, 1]
        assert bus.published == [written]
        monkeypatch.undo()
        wal.made_durable([b"d"])
        assert await _published_offsets(bus, 3) == [0, 1, 2]
        assert bus.published[-1] == encode_frame(2, b"d")
    finally:
        task.cancel()
        await asyncio.wait({task})


def test_frame_chunks_cut_the_written_frames_where_a_frame_ends() -> None:
    payloads = [b"a" * 10, b"b" * 20, b"c" * 5, b"d" * 40]
    written = b"".join(encode_frame(7 + i, p) for i, p in enumerate(payloads))
    for frames in (written, None):  # the WAL's bytes, or framed here: the same bodies
        bodies = frame_chunks(Run(7, payloads, frames, 75), 16 + 20 + 16 + 5)
        assert [count for _, count in bodies] == [1, 2, 1]
        assert b"".join(body for body, _ in bodies) == written
        assert [[f.offset for f in decode_frames(body)[0]] for body, _ in bodies] == [
            [7],
            [8, 9],
            [10],
        ]

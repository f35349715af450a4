"""The live publisher of a led partition outlives bus failures: a publish that fails is retried
with capped backoff (one warning per burst), a body the bus can never carry is dropped and
counted, and the stream goes on in offset order."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from typing import Any

import pytest

from danube.bus import BusTimeoutError, NotConnectedError, PayloadTooLargeError, Subjects
from danube.frame import decode_frames, encode_frame
from danube.ingest import metrics
from danube.ingest import partition as partition_module
from danube.ingest.epochs import EpochHistory
from danube.ingest.leadership import Term
from danube.ingest.partition import Partition
from danube.meta import TopicName

pytestmark = pytest.mark.unit

PARTITION = TopicName("ns", "t")


class FakeWal:
    """Only what a leader's partition asks of its WAL: the durable end and its listener."""

    def __init__(self) -> None:
        self.durable_next = 0
        self._listener: Callable[[int, Sequence[bytes], bytes | None], None] | None = None

    def add_frames_listener(
        self, listener: Callable[[int, Sequence[bytes], bytes | None], None]
    ) -> Any:
        self._listener = listener
        return lambda: None

    def made_durable(self, payloads: Sequence[bytes], frames: bytes | None = None) -> None:
        first = self.durable_next
        self.durable_next += len(payloads)
        assert self._listener is not None
        self._listener(first, payloads, frames)


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
    task = asyncio.create_task(partition.publish_live())
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
    task = asyncio.create_task(partition.publish_live())
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


async def test_the_frames_the_wal_wrote_are_published_as_they_are() -> None:
    wal = FakeWal()
    bus = FlakyBus([])
    partition = _partition(wal, bus)
    task = asyncio.create_task(partition.publish_live())
    try:
        written = encode_frame(0, b"a") + encode_frame(1, b"b")
        wal.made_durable([b"a", b"b"], written)
        wal.made_durable([b"c"])  # no frames given: framed here
        assert await _published_offsets(bus, 3) == [0, 1, 2]
        assert bus.published[0] is written
        assert bus.published[1] == encode_frame(2, b"c")
    finally:
        task.cancel()
        await asyncio.wait({task})


async def test_written_frames_over_a_bus_message_are_cut_on_frame_boundaries(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def framed_again(*_: Any) -> Any:
        raise AssertionError("written frames were framed again")

    monkeypatch.setattr(partition_module, "_frame_chunks", framed_again)
    wal = FakeWal()
    bus = FlakyBus([])
    bus.max_payload_bytes = 4096 + 1024  # the live body limit: 1024 bytes
    partition = _partition(wal, bus)
    task = asyncio.create_task(partition.publish_live())
    try:
        payloads = [bytes([i]) * 300 for i in range(5)]  # 316-byte frames: three per body
        written = b"".join(encode_frame(i, p) for i, p in enumerate(payloads))
        wal.made_durable(payloads, written)
        assert await _published_offsets(bus, 5) == [0, 1, 2, 3, 4]
        assert [len(decode_frames(b)[0]) for b in bus.published] == [3, 2]
        assert b"".join(bus.published) == written
    finally:
        task.cancel()
        await asyncio.wait({task})

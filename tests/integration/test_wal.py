"""The partition WAL on real files with real fsync: round trips, recovery cuts, rotation, drops,
durability modes, backpressure, group commit and failure handling."""

from __future__ import annotations

import asyncio
import errno
import json
import logging
import shutil
import tempfile
import threading
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import danube.ingest.wal.cache as cache_module
from danube.frame import FRAME_HEADER_BYTES, append_frame, decode_frames, encode_frame
from danube.ingest.wal import (
    CHECKPOINT_NAME,
    AppendTooLargeError,
    BelowWalStartError,
    Durability,
    OsFileOps,
    PayloadTooLargeError,
    Wal,
    WalClosedError,
    WalCorruptionError,
    WalFailedError,
    WalOptions,
    segment_name,
)
from danube.ingest.wal.feed import DurableRun
from danube.ingest.wal.options import DEFAULT_PREALLOCATE_BYTES
from danube.ingest.wal.writer import APPEND_FRACTION

pytestmark = pytest.mark.integration

PAYLOAD_BYTES = 100
FRAME_BYTES = FRAME_HEADER_BYTES + PAYLOAD_BYTES
PER_SEGMENT = 10  # frames per segment with SMALL_SEGMENTS


def options(**changes: object) -> WalOptions:
    """fsync durability, no cache (so fetches read the files), generous limits."""
    base = WalOptions(
        durability=Durability.FSYNC,
        max_batch_bytes=1024 * 1024,
        sync_interval_ms=50,
        rotation_max_bytes=64 * 1024 * 1024,
        rotation_max_age_s=None,
        cache_capacity=0,
        max_pending_bytes=4 * 1024 * 1024,
        max_frame_payload_bytes=64 * 1024,
    )
    return replace(base, **changes)  # type: ignore[arg-type]


SMALL_SEGMENTS = {"rotation_max_bytes": FRAME_BYTES * PER_SEGMENT}


def payload(offset: int, size: int = PAYLOAD_BYTES) -> bytes:
    """A payload that names its offset, padded to ``size`` bytes."""
    return f"message-{offset}|".encode().ljust(size, b".")


async def fetch_all(
    wal: Wal, from_offset: int, *, max_count: int = 10_000
) -> list[tuple[int, bytes]]:
    """Every durable message from ``from_offset`` on, fetch after fetch."""
    out: list[tuple[int, bytes]] = []
    while from_offset < wal.durable_next:
        result = await wal.fetch(from_offset, max_bytes=1024 * 1024, max_count=max_count)
        out.extend(result.messages)
        assert result.next_offset > from_offset
        from_offset = result.next_offset
    return out


async def poll(condition: Callable[[], bool], timeout_s: float = 5.0) -> None:
    """Wait until ``condition()`` holds, checking every few milliseconds, or fail."""
    async with asyncio.timeout(timeout_s):
        while not condition():  # noqa: ASYNC110  (a plain predicate: there is no event to await)
            await asyncio.sleep(0.005)


class GatedOps(OsFileOps):
    """The real disk, with fdatasync that can be held (a stalled disk) or made to fail (EIO)."""

    def __init__(self) -> None:
        self.gate = threading.Event()
        self.gate.set()
        self.fail_fdatasync = False
        self.fdatasyncs_entered = 0

    def fdatasync(self, fd: int) -> None:
        self.fdatasyncs_entered += 1
        if not self.gate.wait(timeout=10):
            raise OSError(errno.EIO, "gate never opened")
        if self.fail_fdatasync:
            raise OSError(errno.EIO, "injected fdatasync failure")
        super().fdatasync(fd)


def frames_on_disk(directory: Path) -> list[tuple[int, bytes]]:
    """Every frame of every segment file, in file-name order then file order."""
    out: list[tuple[int, bytes]] = []
    for path in sorted(directory.glob("*.wal")):
        frames, end = decode_frames(path.read_bytes())
        assert end == path.stat().st_size
        out.extend((frame.offset, bytes(frame.payload)) for frame in frames)
    return out


# --- round trips and restarts ---------------------------------------------------------


async def test_append_and_fetch_round_trip_with_exact_offsets(tmp_path: Path) -> None:
    wal = await Wal.open(tmp_path / "p", options())
    assert (wal.start_offset, wal.next_offset, wal.durable_next) == (0, 0, 0)
    assert await wal.append([payload(0)]) == 0
    assert await wal.append([payload(1), payload(2), payload(3)]) == 1
    assert await wal.append([b""]) == 4  # an empty payload is a message too
    assert (wal.next_offset, wal.durable_next) == (5, 5)
    result = await wal.fetch(0, max_bytes=1 << 20, max_count=100)
    assert result.messages == [
        (0, payload(0)),
        (1, payload(1)),
        (2, payload(2)),
        (3, payload(3)),
        (4, b""),
    ]
    assert result.next_offset == 5
    # max_count and max_bytes bound the answer; the first message always comes.
    result = await wal.fetch(1, max_bytes=1 << 20, max_count=2)
    assert [offset for offset, _ in result.messages] == [1, 2]
    assert result.next_offset == 3
    result = await wal.fetch(1, max_bytes=1, max_count=100)
    assert [offset for offset, _ in result.messages] == [1]
    assert result.next_offset == 2
    result = await wal.fetch(5, max_bytes=1 << 20, max_count=100)
    assert result.messages == []
    assert result.next_offset == 5
    await wal.close()


async def test_cache_and_files_serve_the_same_messages(tmp_path: Path) -> None:
    wal = await Wal.open(tmp_path / "p", options(cache_capacity=8, **SMALL_SEGMENTS))
    for offset in range(30):
        await wal.append([payload(offset)])
    assert wal.stats().cache_messages == 8
    from_cache = await wal.fetch(22, max_bytes=1 << 20, max_count=100)
    from_files = await wal.fetch(15, max_bytes=1 << 20, max_count=100)
    assert from_cache.messages == [(o, payload(o)) for o in range(22, 30)]
    assert from_files.messages == [(o, payload(o)) for o in range(15, 30)]
    await wal.close()


async def test_offsets_resume_exactly_after_close_and_reopen(tmp_path: Path) -> None:
    directory = tmp_path / "p"
    wal = await Wal.open(directory, options(**SMALL_SEGMENTS))
    for offset in range(25):
        await wal.append([payload(offset)])
    await wal.close()
    checkpoint = json.loads((directory / CHECKPOINT_NAME).read_text())
    assert checkpoint["version"] == 1
    assert checkpoint["next_offset"] == 25

    wal = await Wal.open(directory, options(**SMALL_SEGMENTS))
    assert (wal.start_offset, wal.next_offset, wal.durable_next) == (0, 25, 25)
    assert wal.recovery_cut is None
    assert await wal.append([payload(25)]) == 25
    assert await fetch_all(wal, 0) == [(o, payload(o)) for o in range(26)]
    await wal.close()


async def test_leftover_temp_files_are_removed_at_open(tmp_path: Path) -> None:
    directory = tmp_path / "p"
    wal = await Wal.open(directory, options())
    await wal.append([payload(0)])
    await wal.close()
    (directory / (CHECKPOINT_NAME + ".tmp")).write_bytes(b"half a checkp")
    wal = await Wal.open(directory, options())
    assert not (directory / (CHECKPOINT_NAME + ".tmp")).exists()
    assert wal.next_offset == 1
    await wal.close()


# --- recovery cuts -----------------------------------------------------------------


async def wal_with_frames(directory: Path, count: int) -> Path:
    """A closed WAL holding offsets ``0 .. count-1`` in one segment; returns that segment."""
    wal = await Wal.open(directory, options())
    await wal.append([payload(offset) for offset in range(count)])
    await wal.close()
    (segment,) = list(directory.glob("*.wal"))  # noqa: ASYNC240  (a test: blocking is fine)
    assert segment.stat().st_size == count * FRAME_BYTES
    return segment


def append_bytes(path: Path, data: bytes) -> None:
    with path.open("ab") as file:
        file.write(data)


@pytest.mark.parametrize(
    ("tail", "reason"),
    [
        pytest.param(lambda: frame_of(5)[: FRAME_BYTES // 2], "incomplete", id="half-frame"),
        pytest.param(lambda: frame_of(5)[:7], "incomplete", id="half-header"),
        pytest.param(lambda: b"\xde\xad\xbe\xef" * 64, "", id="garbage"),
        # A torn frame followed by zeros (allocated ahead): the torn bytes are cut, and said.
        pytest.param(
            lambda: frame_of(5)[: FRAME_BYTES // 2] + bytes(4096), "crc", id="half-frame-zeros"
        ),
        pytest.param(lambda: frame_of(9) + frame_of(10), "offset 9 where 5", id="offset-gap"),
        pytest.param(lambda: frame_of(4), "offset 4 where 5", id="offset-backwards"),
    ],
)
async def test_a_bad_tail_of_the_last_segment_is_cut_and_logged(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, tail: Callable[[], bytes], reason: str
) -> None:
    directory = tmp_path / "p"
    segment = await wal_with_frames(directory, 5)
    bad = tail()
    append_bytes(segment, bad)
    with caplog.at_level(logging.WARNING, logger="danube.ingest.wal"):
        wal = await Wal.open(directory, options())
    cut = wal.recovery_cut
    assert cut is not None
    assert (cut.segment, cut.position, cut.bytes_cut) == (segment.name, 5 * FRAME_BYTES, len(bad))
    assert reason in cut.reason
    assert segment.stat().st_size == 5 * FRAME_BYTES  # truncated on disk
    (record,) = [r for r in caplog.records if "cut the tail" in r.getMessage()]
    assert record.levelno == logging.WARNING
    assert segment.name in record.getMessage()
    assert record.__dict__["bytes_cut"] == len(bad)
    # Offsets resume right after the last good frame.
    assert wal.next_offset == 5
    assert await wal.append([payload(5)]) == 5
    assert await fetch_all(wal, 0) == [(o, payload(o)) for o in range(6)]
    await wal.close()


async def test_zeros_allocated_ahead_are_dropped_at_open_with_no_cut_said(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    directory, crashed = tmp_path / "p", tmp_path / "crashed"
    wal = await Wal.open(directory, options())
    await wal.append([payload(offset) for offset in range(5)])
    shutil.copytree(directory, crashed)  # the files as a kill -9 would leave them
    await wal.close()
    (segment,) = list(crashed.glob("*.wal"))
    data = segment.read_bytes()
    # The open segment's file reaches a preallocation past its frames, in zeros.
    assert len(data) == 5 * FRAME_BYTES + DEFAULT_PREALLOCATE_BYTES
    assert data[5 * FRAME_BYTES :] == bytes(DEFAULT_PREALLOCATE_BYTES)
    with caplog.at_level(logging.DEBUG, logger="danube.ingest.wal"):
        wal = await Wal.open(crashed, options())
    assert wal.recovery_cut is None
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert segment.stat().st_size == 5 * FRAME_BYTES  # the zeros gone from the disk
    assert wal.next_offset == 5
    assert await wal.append([payload(5)]) == 5
    assert await fetch_all(wal, 0) == [(o, payload(o)) for o in range(6)]
    await wal.close()
    assert frames_on_disk(crashed) == [(o, payload(o)) for o in range(6)]


class NoAllocateOps(OsFileOps):
    """A disk that refuses to allocate ahead (no room for it)."""

    def allocate(self, fd: int, position: int, length: int) -> None:
        raise OSError(errno.ENOSPC, "no room to allocate ahead")


@pytest.mark.parametrize("how", ["refused", "off"])
async def test_a_segment_not_allocated_ahead_is_written_as_appends(
    tmp_path: Path, how: str
) -> None:
    directory = tmp_path / "p"
    if how == "refused":
        wal = await Wal.open(directory, options(**SMALL_SEGMENTS), file_ops=NoAllocateOps())
    else:
        wal = await Wal.open(directory, options(**SMALL_SEGMENTS, preallocate_bytes=0))
    for offset in range(PER_SEGMENT + 3):
        assert await wal.append([payload(offset)]) == offset
        active = sorted(directory.glob("*.wal"))[-1]
        assert active.stat().st_size == (offset % PER_SEGMENT + 1) * FRAME_BYTES
    assert await fetch_all(wal, 0) == [(o, payload(o)) for o in range(PER_SEGMENT + 3)]
    await wal.close()
    assert frames_on_disk(directory) == [(o, payload(o)) for o in range(PER_SEGMENT + 3)]


async def test_a_large_write_is_appended_and_a_small_one_allocates_ahead(tmp_path: Path) -> None:
    # Zeros ahead of a write of a quarter of the allocation step or more would double its
    # bytes on the disk: it goes as an append; the small writes after it allocate again.
    directory = tmp_path / "p"
    step = 16 * FRAME_BYTES
    wal = await Wal.open(directory, options(preallocate_bytes=step))
    large = step // APPEND_FRACTION // FRAME_BYTES + 1  # frames in one write past the bound
    assert await wal.append([payload(o) for o in range(large)]) == 0
    (segment,) = directory.glob("*.wal")
    assert segment.stat().st_size == large * FRAME_BYTES  # appended: nothing ahead
    assert await wal.append([payload(large)]) == large
    assert segment.stat().st_size == (large + 1) * FRAME_BYTES + step  # allocated ahead
    assert await fetch_all(wal, 0) == [(o, payload(o)) for o in range(large + 1)]
    await wal.close()
    assert frames_on_disk(directory) == [(o, payload(o)) for o in range(large + 1)]


async def test_sealed_and_closed_segments_end_at_their_last_frame(tmp_path: Path) -> None:
    # Allocated ahead while written; cut back to the last frame when sealed (the next
    # segment begins) and when closed.
    directory = tmp_path / "p"
    wal = await Wal.open(directory, options(**SMALL_SEGMENTS))
    for offset in range(PER_SEGMENT + 3):
        await wal.append([payload(offset)])
    first, second = sorted(directory.glob("*.wal"))
    assert first.stat().st_size == PER_SEGMENT * FRAME_BYTES
    assert second.stat().st_size == PER_SEGMENT * FRAME_BYTES  # allocated to the rotation size
    await wal.close()
    assert second.stat().st_size == 3 * FRAME_BYTES
    assert frames_on_disk(directory) == [(o, payload(o)) for o in range(PER_SEGMENT + 3)]


def frame_of(offset: int) -> bytes:
    buf = bytearray()
    append_frame(buf, offset, payload(offset))
    return bytes(buf)


async def test_a_last_segment_with_no_good_frame_is_removed(tmp_path: Path) -> None:
    directory = tmp_path / "p"
    wal = await Wal.open(directory, options(**SMALL_SEGMENTS))
    await wal.append([payload(offset) for offset in range(PER_SEGMENT)])
    await wal.close()
    torn = directory / segment_name(PER_SEGMENT)  # as if a crash hit right after creating it
    torn.write_bytes(frame_of(PER_SEGMENT)[:20])
    wal = await Wal.open(directory, options(**SMALL_SEGMENTS))
    assert not torn.exists()
    assert wal.next_offset == PER_SEGMENT
    assert wal.segment_names() == [segment_name(0)]
    assert await wal.append([payload(PER_SEGMENT)]) == PER_SEGMENT
    await wal.close()


async def test_a_flipped_bit_in_a_sealed_segment_is_never_served(tmp_path: Path) -> None:
    directory = tmp_path / "p"
    wal = await Wal.open(directory, options(**SMALL_SEGMENTS))
    await wal.append([payload(offset) for offset in range(35)])
    await wal.close()
    sealed = directory / segment_name(10)
    data = bytearray(sealed.read_bytes())
    flip_at = 3 * FRAME_BYTES + FRAME_HEADER_BYTES + 5  # inside the payload of offset 13
    data[flip_at] ^= 0x10
    sealed.write_bytes(data)

    wal = await Wal.open(directory, options(**SMALL_SEGMENTS))
    assert wal.recovery_cut is None  # sealed segments are not scanned at open
    # Before the flip: served, in earlier segments and in the bad one up to the bad frame.
    result = await wal.fetch(0, max_bytes=1 << 20, max_count=100)
    assert result.messages == [(o, payload(o)) for o in range(13)]
    assert result.next_offset == 13
    with pytest.raises(WalCorruptionError) as caught:
        await wal.fetch(13, max_bytes=1 << 20, max_count=100)
    assert caught.value.code == "wal_corrupt"
    assert (caught.value.segment, caught.value.offset) == (sealed.name, 13)
    assert caught.value.position == 3 * FRAME_BYTES
    with pytest.raises(WalCorruptionError):
        await wal.fetch(17, max_bytes=1 << 20, max_count=100)
    # Later segments are intact and still served.
    assert await fetch_all(wal, 20) == [(o, payload(o)) for o in range(20, 35)]
    await wal.close()


async def test_a_flip_after_the_index_was_built_is_caught_on_read(tmp_path: Path) -> None:
    wal = await Wal.open(tmp_path / "p", options(**SMALL_SEGMENTS))
    await wal.append([payload(offset) for offset in range(25)])
    sealed = tmp_path / "p" / segment_name(0)
    data = bytearray(sealed.read_bytes())
    data[6 * FRAME_BYTES + 2] ^= 0x01  # the header offset field of offset 6
    sealed.write_bytes(data)
    result = await wal.fetch(2, max_bytes=1 << 20, max_count=100)
    assert result.messages == [(o, payload(o)) for o in range(2, 6)]
    with pytest.raises(WalCorruptionError) as caught:
        await wal.fetch(6, max_bytes=1 << 20, max_count=100)
    assert (caught.value.segment, caught.value.offset) == (sealed.name, 6)
    await wal.close()


# --- rotation ------------------------------------------------------------------------


async def test_rotation_by_size_keeps_segments_contiguous_and_sorted(tmp_path: Path) -> None:
    directory = tmp_path / "p"
    wal = await Wal.open(directory, options(**SMALL_SEGMENTS))
    offsets = [await wal.append([payload(o) for o in range(n, n + 3)]) for n in range(0, 105, 3)]
    assert offsets == list(range(0, 105, 3))
    names = wal.segment_names()
    assert names == sorted(names) == [segment_name(first) for first in range(0, 105, PER_SEGMENT)]
    assert wal.stats().rotations == len(names) - 1
    for path in directory.glob("*.wal"):
        assert path.stat().st_size <= FRAME_BYTES * PER_SEGMENT
    assert await fetch_all(wal, 0, max_count=7) == [(o, payload(o)) for o in range(105)]
    await wal.close()  # the open segment's file reaches past its frames (allocated ahead)
    assert frames_on_disk(directory) == [(o, payload(o)) for o in range(105)]


async def test_a_frame_larger_than_the_rotation_size_gets_a_segment_of_its_own(
    tmp_path: Path,
) -> None:
    wal = await Wal.open(tmp_path / "p", options(rotation_max_bytes=256))
    big = b"B" * 1000
    await wal.append([b"a", big, b"c"])
    assert wal.segment_names() == [segment_name(0), segment_name(1), segment_name(2)]
    assert await fetch_all(wal, 0) == [(0, b"a"), (1, big), (2, b"c")]
    await wal.close()


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    sizes=st.lists(st.integers(0, 3000), min_size=1, max_size=60),
    groups=st.lists(st.integers(1, 7), min_size=1, max_size=10),
    rotation=st.integers(1, 8000),
    max_count=st.integers(1, 50),
)
def test_fetch_across_segments_returns_the_exact_sequence(
    sizes: list[int], groups: list[int], rotation: int, max_count: int
) -> None:
    payloads = [bytes([offset % 251]) * size for offset, size in enumerate(sizes)]

    async def scenario(directory: Path) -> None:
        wal = await Wal.open(directory, options(rotation_max_bytes=rotation))
        at, turn = 0, 0
        while at < len(payloads):
            count = groups[turn % len(groups)]
            assert await wal.append(payloads[at : at + count]) == at
            at, turn = at + count, turn + 1
        expected = list(enumerate(payloads))
        assert await fetch_all(wal, 0, max_count=max_count) == expected
        await wal.close()
        wal = await Wal.open(directory, options(rotation_max_bytes=rotation))
        assert await fetch_all(wal, 0, max_count=max_count) == expected  # lazily indexed
        assert frames_on_disk(directory) == expected
        await wal.close()

    with tempfile.TemporaryDirectory() as tmp:
        asyncio.run(scenario(Path(tmp) / "p"))


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


async def test_rotation_by_age_on_append_with_an_injected_clock(tmp_path: Path) -> None:
    clock = FakeClock()
    wal = await Wal.open(tmp_path / "p", options(rotation_max_age_s=60.0), clock=clock)
    await wal.append([payload(0)])
    clock.now += 59
    await wal.append([payload(1)])
    assert wal.segment_names() == [segment_name(0)]
    clock.now += 2  # the segment is 61 s old: the next append starts a new one
    await wal.append([payload(2)])
    assert wal.segment_names() == [segment_name(0), segment_name(2)]
    assert await fetch_all(wal, 0) == [(o, payload(o)) for o in range(3)]
    await wal.close()


async def test_an_idle_segment_is_sealed_when_it_gets_old(tmp_path: Path) -> None:
    wal = await Wal.open(tmp_path / "p", options(rotation_max_age_s=0.2))
    await wal.append([payload(0)])
    await poll(lambda: wal.stats().rotations == 1)  # no append needed: the writer's timer
    await wal.append([payload(1)])
    assert wal.segment_names() == [segment_name(0), segment_name(1)]
    await wal.close()


# --- advance_to and drop_below ------------------------------------------------------------


async def test_advance_to_leaves_a_gap_that_fetch_skips(tmp_path: Path) -> None:
    directory = tmp_path / "p"
    wal = await Wal.open(directory, options())
    await wal.append([payload(0), payload(1)])
    await wal.advance_to(100)
    await wal.advance_to(50)  # never back
    assert (wal.next_offset, wal.durable_next) == (100, 100)
    assert await wal.append([payload(100)]) == 100
    assert wal.segment_names() == [segment_name(0), segment_name(100)]
    result = await wal.fetch(0, max_bytes=1 << 20, max_count=100)
    assert result.messages == [(0, payload(0)), (1, payload(1)), (100, payload(100))]
    result = await wal.fetch(2, max_bytes=1 << 20, max_count=100)  # inside the gap
    assert result.messages == [(100, payload(100))]
    assert result.next_offset == 101
    await wal.close()


async def test_restart_after_advance_to_resumes_at_the_floor(tmp_path: Path) -> None:
    directory = tmp_path / "p"
    wal = await Wal.open(directory, options())
    await wal.append([payload(0)])
    await wal.advance_to(1000)
    # A crash right now: copy the directory as it is, with the WAL still open.
    crashed = tmp_path / "crashed"
    shutil.copytree(directory, crashed)  # the files as a kill -9 would leave them
    await wal.close()
    for path in (directory, crashed):
        reopened = await Wal.open(path, options())
        assert (reopened.next_offset, reopened.durable_next) == (1000, 1000)
        assert await reopened.append([payload(1000)]) == 1000
        assert await fetch_all(reopened, 0) == [(0, payload(0)), (1000, payload(1000))]
        await reopened.close()


async def test_drop_below_removes_only_whole_sealed_segments(tmp_path: Path) -> None:
    directory = tmp_path / "p"
    wal = await Wal.open(directory, options(**SMALL_SEGMENTS))
    await wal.append([payload(offset) for offset in range(35)])  # segments 0, 10, 20, 30
    assert await wal.drop_below(25) == 2  # 20..29 is not wholly below 25
    assert wal.segment_names() == [segment_name(20), segment_name(30)]
    assert wal.start_offset == 20
    with pytest.raises(BelowWalStartError) as caught:
        await wal.fetch(19, max_bytes=1 << 20, max_count=10)
    assert caught.value.code == "below_wal_start"
    assert caught.value.start_offset == 20
    assert await fetch_all(wal, 20) == [(o, payload(o)) for o in range(20, 35)]
    assert await wal.drop_below(1000) == 1  # never the newest segment
    assert wal.segment_names() == [segment_name(30)]
    assert wal.start_offset == 30
    assert await wal.drop_below(1000) == 0
    await wal.close()
    assert json.loads((directory / CHECKPOINT_NAME).read_text())["start_offset"] == 30
    wal = await Wal.open(directory, options(**SMALL_SEGMENTS))
    assert (wal.start_offset, wal.next_offset) == (30, 35)
    await wal.close()


async def test_open_finishes_a_drop_cut_short_by_a_crash(tmp_path: Path) -> None:
    directory = tmp_path / "p"
    wal = await Wal.open(directory, options(**SMALL_SEGMENTS))
    await wal.append([payload(offset) for offset in range(35)])
    await wal.close()
    kept = {path.name: path.read_bytes() for path in directory.glob("*.wal")}
    wal = await Wal.open(directory, options(**SMALL_SEGMENTS))
    assert await wal.drop_below(20) == 2
    await wal.close()
    for name, data in kept.items():  # the checkpoint was written, the deletes "lost"
        (directory / name).write_bytes(data)
    wal = await Wal.open(directory, options(**SMALL_SEGMENTS))
    assert wal.segment_names() == [segment_name(20), segment_name(30)]
    assert wal.start_offset == 20
    await wal.close()


# --- durability modes ------------------------------------------------------------------


async def test_interval_mode_acknowledges_before_fsync_and_syncs_on_cadence(
    tmp_path: Path,
) -> None:
    slow = await Wal.open(
        tmp_path / "slow", options(durability=Durability.INTERVAL, sync_interval_ms=60_000)
    )
    for offset in range(10):
        assert await slow.append([payload(offset)]) == offset
    assert slow.durable_next == 10
    assert slow.stats().fsyncs == 0
    assert await fetch_all(slow, 0) == [(o, payload(o)) for o in range(10)]
    await slow.close()
    assert slow.stats().fsyncs == 1  # the final sync at close

    wal = await Wal.open(
        tmp_path / "fast", options(durability=Durability.INTERVAL, sync_interval_ms=50)
    )
    await wal.append([payload(0)])
    await poll(lambda: wal.stats().fsyncs == 1)
    await wal.append([payload(1)])
    await poll(lambda: wal.stats().fsyncs == 2)
    await wal.close()


async def test_memory_mode_never_touches_disk(tmp_path: Path) -> None:
    directory = tmp_path / "memory"
    wal = await Wal.open(directory, options(durability=Durability.MEMORY, cache_capacity=5))
    for offset in range(10):
        assert await wal.append([payload(offset)]) == offset
    assert (wal.start_offset, wal.durable_next) == (5, 10)
    with pytest.raises(BelowWalStartError) as caught:
        await wal.fetch(4, max_bytes=1 << 20, max_count=10)
    assert caught.value.start_offset == 5
    await wal.advance_to(20)
    assert await wal.append([payload(20)]) == 20
    result = await wal.fetch(6, max_bytes=1 << 20, max_count=10)
    assert result.messages == [(o, payload(o)) for o in (6, 7, 8, 9, 20)]
    assert result.next_offset == 21
    await wal.close()
    assert not directory.exists()
    stats = wal.stats()
    assert (stats.segments, stats.fsyncs, stats.bytes_written) == (0, 0, 0)


# --- limits, backpressure, group commit, failures ------------------------------------------


async def test_oversize_payloads_and_appends_are_rejected_with_nothing_written(
    tmp_path: Path,
) -> None:
    wal = await Wal.open(
        tmp_path / "p", options(max_frame_payload_bytes=1000, max_pending_bytes=4096)
    )
    with pytest.raises(PayloadTooLargeError) as caught:
        await wal.append([b"ok", b"x" * 1001])
    assert (caught.value.code, caught.value.index, caught.value.size_bytes) == (
        "payload_too_large",
        1,
        1001,
    )
    with pytest.raises(AppendTooLargeError) as too_many:
        await wal.append([b"y" * 1000] * 5)  # each fits, together over max_pending_bytes
    assert too_many.value.code == "append_too_large"
    assert wal.next_offset == 0
    assert wal.segment_names() == []
    assert wal.stats().appends == 0
    assert await wal.append([b"y" * 1000] * 4) == 0
    await wal.close()


async def test_appenders_wait_for_a_stalled_disk_instead_of_queueing(tmp_path: Path) -> None:
    ops = GatedOps()
    limit = 4 * FRAME_BYTES
    wal = await Wal.open(
        tmp_path / "p",
        options(max_pending_bytes=limit, max_frame_payload_bytes=PAYLOAD_BYTES),
        file_ops=ops,
    )
    ops.gate.clear()  # the disk stalls on fdatasync
    first = asyncio.create_task(wal.append([payload(0)]))
    await poll(lambda: ops.fdatasyncs_entered == 1)
    others = [asyncio.create_task(wal.append([payload(n)])) for n in range(1, 50)]
    await poll(lambda: wal.stats().waiting_appends == 46)  # 3 more fit in the budget
    stats = wal.stats()
    assert stats.pending_bytes == limit
    assert stats.durable_next == 0
    assert not first.done()
    assert not any(task.done() for task in others)
    assert (await wal.fetch(0, max_bytes=1 << 20, max_count=10)).messages == []  # not durable
    ops.gate.set()
    offsets = [await first, *await asyncio.gather(*others)]
    assert sorted(offsets) == list(range(50))
    assert wal.stats().pending_bytes == 0
    await wal.close()


async def test_group_commit_needs_far_fewer_fsyncs_than_appends(tmp_path: Path) -> None:
    wal = await Wal.open(tmp_path / "p", options())

    async def producer(name: int) -> list[int]:
        return [await wal.append([payload(name * 1000 + n)]) for n in range(10)]

    results = await asyncio.gather(*(producer(name) for name in range(100)))
    stats = wal.stats()
    assert (stats.appends, stats.messages) == (1000, 1000)
    assert stats.fsyncs * 5 <= stats.appends, stats
    assert stats.batches == stats.fsyncs
    assert sorted(o for offsets in results for o in offsets) == list(range(1000))
    await wal.close()


async def test_concurrent_appends_get_contiguous_offsets_in_file_order(tmp_path: Path) -> None:
    directory = tmp_path / "p"
    wal = await Wal.open(directory, options(rotation_max_bytes=8 * 1024, max_batch_bytes=4096))
    sent: dict[int, bytes] = {}

    async def producer(name: int) -> None:
        last = -1
        for n in range(20):
            batch = [f"{name}:{n}:{k}".encode() for k in range(1 + (name + n) % 3)]
            first = await wal.append(batch)
            assert first > last  # one producer's appends stay in its order
            last = first
            sent.update(zip(range(first, first + len(batch)), batch, strict=True))

    await asyncio.gather(*(producer(name) for name in range(50)))
    assert sorted(sent) == list(range(len(sent)))
    await wal.close()
    assert frames_on_disk(directory) == sorted(sent.items())


async def test_durable_listeners_get_each_batch_in_offset_order(tmp_path: Path) -> None:
    wal = await Wal.open(tmp_path / "p", options())
    calls: list[tuple[int, list[bytes]]] = []
    written: list[tuple[int, bytes | None]] = []

    def listener(run: DurableRun) -> None:
        calls.append((run.first, [bytes(p) for p in run.payloads]))
        written.append((run.first, run.frames))
        assert run.payload_bytes == sum(map(len, run.payloads))

    remove = wal.add_durable_listener(listener)
    await wal.append([b"a", b"b"])
    await asyncio.gather(wal.append([b"c"]), wal.append([b"d"]))
    await wal.advance_to(10)
    await wal.append([b"k"])
    remove()
    await wal.append([b"not seen"])
    flat = [(first + i, p) for first, payloads in calls for i, p in enumerate(payloads)]
    assert flat == [(0, b"a"), (1, b"b"), (2, b"c"), (3, b"d"), (10, b"k")]
    # A run one write held comes with those frames, as the codec makes them.
    for (first, payloads), (_, frames) in zip(calls, written, strict=True):
        if frames is not None:
            assert frames == b"".join(encode_frame(first + i, p) for i, p in enumerate(payloads))
    assert written[0][1] is not None  # the first append: one run, one write
    await wal.close()


async def test_the_cache_keeps_the_frames_as_written_without_framing_them_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def framed_again(*_: object) -> bytes:
        raise AssertionError("a written frame was framed again for the cache")

    monkeypatch.setattr(cache_module, "encode_frame", framed_again)
    wal = await Wal.open(tmp_path / "p", options())
    await wal.append([b"a", b"bc"])
    await asyncio.gather(wal.append([b"d"]), wal.append([b"e"]))
    result = await wal.fetch(0, max_bytes=1 << 20, max_count=100)
    assert [(offset, bytes(frame)) for offset, frame in result.frames] == [
        (offset, encode_frame(offset, p)) for offset, p in enumerate([b"a", b"bc", b"d", b"e"])
    ]
    await wal.close()


async def test_wait_for_wakes_when_an_offset_becomes_durable(tmp_path: Path) -> None:
    wal = await Wal.open(tmp_path / "p", options())
    waiter = asyncio.create_task(wal.wait_for(0, timeout_s=5))
    await asyncio.sleep(0)
    assert not waiter.done()
    await wal.append([b"x"])
    assert await waiter is True
    assert await wal.wait_for(5, timeout_s=0.05) is False
    await wal.close()


async def test_a_failed_fsync_fails_the_batch_and_every_later_append(tmp_path: Path) -> None:
    ops = GatedOps()
    directory = tmp_path / "p"
    wal = await Wal.open(directory, options(), file_ops=ops)
    assert await wal.append([payload(0)]) == 0
    ops.fail_fdatasync = True
    results = await asyncio.gather(
        *(wal.append([payload(n)]) for n in range(1, 4)), return_exceptions=True
    )
    assert all(isinstance(r, WalFailedError) and r.code == "wal_failed" for r in results)
    assert wal.stats().failed
    assert wal.durable_next == 1
    ops.fail_fdatasync = False  # even if the disk "recovers", the WAL stays failed
    with pytest.raises(WalFailedError):
        await wal.append([payload(9)])
    assert (await wal.fetch(0, max_bytes=1 << 20, max_count=10)).messages == [(0, payload(0))]
    await wal.close()
    reopened = await Wal.open(directory, options())  # a restart trusts what it reads back
    assert reopened.next_offset >= 1
    assert (await reopened.fetch(0, max_bytes=1 << 20, max_count=1)).messages == [(0, payload(0))]
    await reopened.close()


async def test_close_writes_queued_appends_and_fails_waiting_ones(tmp_path: Path) -> None:
    ops = GatedOps()
    wal = await Wal.open(
        tmp_path / "p",
        options(max_pending_bytes=2 * FRAME_BYTES, max_frame_payload_bytes=PAYLOAD_BYTES),
        file_ops=ops,
    )
    ops.gate.clear()
    tasks = [asyncio.create_task(wal.append([payload(n)])) for n in range(3)]
    await poll(lambda: wal.stats().waiting_appends == 1)
    closing = asyncio.create_task(wal.close())
    await poll(lambda: tasks[2].done())
    ops.gate.set()
    await closing
    assert await tasks[0] == 0
    assert await tasks[1] == 1
    with pytest.raises(WalClosedError):
        await tasks[2]
    with pytest.raises(WalClosedError):
        await wal.append([b"late"])


async def test_a_disk_stuck_past_the_io_deadline_fails_the_wal(tmp_path: Path) -> None:
    ops = GatedOps()
    wal = await Wal.open(tmp_path / "p", options(io_timeout_s=0.2), file_ops=ops)
    ops.gate.clear()
    try:
        with pytest.raises(WalFailedError, match="timed out"):
            await wal.append([payload(0)])
        assert wal.stats().failed
        with pytest.raises(WalFailedError):
            await wal.append([payload(1)])
    finally:
        ops.gate.set()
    await wal.close()


async def test_close_gives_up_on_a_stuck_disk_after_its_deadline(tmp_path: Path) -> None:
    ops = GatedOps()
    wal = await Wal.open(tmp_path / "p", options(), file_ops=ops)
    ops.gate.clear()
    try:
        stuck = asyncio.create_task(wal.append([payload(0)]))
        await poll(lambda: ops.fdatasyncs_entered == 1)
        async with asyncio.timeout(5):
            await wal.close(timeout_s=0.2)
        with pytest.raises(WalClosedError):
            await stuck
    finally:
        ops.gate.set()


async def test_an_append_cancelled_while_it_waits_for_room_is_still_written(
    tmp_path: Path,
) -> None:
    ops = GatedOps()
    wal = await Wal.open(
        tmp_path / "p",
        options(max_pending_bytes=FRAME_BYTES, max_frame_payload_bytes=PAYLOAD_BYTES),
        file_ops=ops,
    )
    try:
        ops.gate.clear()
        queued = asyncio.create_task(wal.append([payload(0)]))
        await poll(lambda: ops.fdatasyncs_entered == 1)
        waiting = asyncio.create_task(wal.append([payload(1)]))
        await poll(lambda: wal.stats().waiting_appends == 1)
        queued.cancel()  # cancelled once queued
        waiting.cancel()  # cancelled while it waits for room
        results = await asyncio.gather(queued, waiting, return_exceptions=True)
        assert all(isinstance(r, asyncio.CancelledError) for r in results)
        ops.gate.set()
        await poll(lambda: wal.durable_next == 2)
        assert await fetch_all(wal, 0) == [(0, payload(0)), (1, payload(1))]
        assert wal.stats().pending_bytes == 0
    finally:
        ops.gate.set()
        await wal.close()


async def test_failure_listeners_hear_a_failure_once_and_never_a_close(tmp_path: Path) -> None:
    ops = GatedOps()
    heard: list[str] = []
    wal = await Wal.open(tmp_path / "p", options(), file_ops=ops)
    wal.add_failure_listener(heard.append)
    await wal.append([payload(0)])
    ops.fail_fdatasync = True
    for n in (1, 2):
        with pytest.raises(WalFailedError):
            await wal.append([payload(n)])
    assert len(heard) == 1
    assert "injected fdatasync failure" in heard[0]
    await wal.close()

    closed = await Wal.open(tmp_path / "q", options())
    remove = closed.add_failure_listener(heard.append)
    await closed.append([payload(0)])
    await closed.close()
    remove()
    assert len(heard) == 1

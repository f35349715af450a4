"""The first offset published at or after a time: segment choice, gaps, both ends, reads bounded."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from danube.frame import Record, encode_frame, encode_record
from danube.ingest.timeseek import offset_for_time
from danube.ingest.wal import BelowWalStartError, FetchResult, segment_name

pytestmark = pytest.mark.unit


class FakeWal:
    """Segments ``{first offset: [(offset, publish time), ...]}``; records every fetch."""

    def __init__(self, segments: dict[int, list[tuple[int, int]]], *, start: int = 0) -> None:
        self.segments = segments
        self.records = sorted(
            (offset, encode_record(Record(payload=b"", publish_time_ms=t, producer="p")))
            for records in segments.values()
            for offset, t in records
        )
        self.start_offset = start
        self.durable_next = self.records[-1][0] + 1 if self.records else start
        self.fetches: list[tuple[int, int]] = []  # (from, count returned)

    def segment_names(self) -> list[str]:
        return [segment_name(first) for first in sorted(self.segments)]

    async def fetch(self, from_offset: int, *, max_bytes: int, max_count: int) -> FetchResult:
        if from_offset < self.start_offset:
            raise BelowWalStartError(offset=from_offset, start_offset=self.start_offset)
        found = [r for r in self.records if r[0] >= from_offset][:max_count]
        self.fetches.append((from_offset, len(found)))
        next_offset = found[-1][0] + 1 if found else max(from_offset, self.durable_next)
        return FetchResult([(o, encode_frame(o, r)) for o, r in found], next_offset)


def _wal(times: list[list[int]], *, first: int = 0, gap: int = 0) -> FakeWal:
    """Segments of consecutive offsets holding these publish times, ``gap`` offsets apart."""
    segments: dict[int, list[tuple[int, int]]] = {}
    offset = first
    for segment in times:
        segments[offset] = [(offset + i, t) for i, t in enumerate(segment)]
        offset += len(segment) + gap
    return FakeWal(segments, start=first)


async def test_the_first_record_at_or_after_the_time_inside_a_segment() -> None:
    wal = _wal([[10, 10, 20], [30, 30, 40], [50, 60, 70]])
    assert await offset_for_time(wal, 35) == 5
    assert await offset_for_time(wal, 30) == 3  # a segment's first record
    assert await offset_for_time(wal, 31) == 5
    assert await offset_for_time(wal, 21) == 3  # crossed between two segments
    assert await offset_for_time(wal, 65) == 8  # in the last segment


async def test_the_ends_wal_start_below_and_next_offset_past() -> None:
    wal = _wal([[10, 20], [30, 40]], first=100)
    assert await offset_for_time(wal, 0) == 100
    assert await offset_for_time(wal, 10) == 100
    assert await offset_for_time(wal, 41) == 104  # durable_next
    assert await offset_for_time(_wal([]), 5) == 0  # an empty WAL: its next offset


async def test_gaps_between_segments_answer_the_next_existing_offset() -> None:
    wal = _wal([[10, 20], [30, 40]], gap=5)  # offsets 0, 1, then 7, 8
    assert await offset_for_time(wal, 25) == 7
    assert await offset_for_time(wal, 31) == 8


async def test_a_dropped_start_moves_the_search_up() -> None:
    wal = _wal([[10, 20], [30, 40], [50, 60]])
    wal.start_offset = 2  # dropped below 2 after the segment list was taken
    assert await offset_for_time(wal, 15) == 2
    assert await offset_for_time(wal, 45) == 4


async def test_probes_read_one_record_per_segment_and_scan_only_one_segment() -> None:
    times = [[s * 100 + i for i in range(50)] for s in range(64)]
    wal = _wal(times)
    assert await offset_for_time(wal, 3725) == 37 * 50 + 25
    probes = [f for f in wal.fetches if f[1] <= 1]
    scans = [f for f in wal.fetches if f[1] > 1]
    assert len(probes) <= 8  # log2(64) + the final probe
    assert [f[0] for f in scans] == [37 * 50]


@settings(max_examples=200)
@given(
    st.lists(st.lists(st.integers(0, 5), min_size=1, max_size=6), min_size=1, max_size=6),
    st.integers(0, 40),
    st.integers(0, 3),
)
async def test_matches_a_linear_scan_when_times_rise(
    steps: list[list[int]], timestamp_ms: int, gap: int
) -> None:
    # Rising times: each record's time is the previous one plus a step.
    times, now = [], 0
    for segment in steps:
        row = []
        for step in segment:
            now += step
            row.append(now)
        times.append(row)
    wal = _wal(times, gap=gap)
    expected = next(
        (
            offset
            for offset, t in sorted(r for s in wal.segments.values() for r in s)
            if t >= timestamp_ms
        ),
        wal.durable_next,
    )
    assert await offset_for_time(wal, timestamp_ms) == expected

"""The first offset of a partition's WAL published at or after a time (``wal.time``).

Records carry their ``publish_time_ms`` (set by discovery when it produces them); segments
are sorted by offset. The search reads the first record of a few segments (a binary search
over the segments' first records) to pick the one segment where the time is crossed, then
scans that segment alone, record by record, from its start. So it reads O(log segments)
single records plus at most one segment.

Answers:

- ``T`` at or below the first record in the WAL: the WAL's first offset. Older data may sit
  in the cloud tier below the WAL start: the dispatcher then asks cloud_reader
  (``cloud.time``) too and takes the earlier answer (danube.dispatcher.positions).
- ``T`` past every record: the next offset (``durable_next``): a subscription placed there
  receives what is published from now on.
- Otherwise the first offset, in offset order, whose record has ``publish_time_ms >= T``.

This assumes that publish times rise with offsets. They do per discovery instance (one
clock); with several instances whose clocks disagree they rise only roughly, and the answer
is then the first record at or after ``T`` in the chosen segment, which may leave a few
records of that skew on either side.
"""

from __future__ import annotations

from typing import Protocol

from danube.frame import record_publish_time_ms
from danube.ingest.wal import BelowWalStartError, FetchResult, parse_segment_name

SCAN_MAX_COUNT = 1000
SCAN_MAX_BYTES = 1 << 20
"""One read of the scan: at most this many records and bytes (bounds its memory)."""


class WalView(Protocol):
    """What the search needs of a :class:`~danube.ingest.wal.Wal` (tests pass a fake)."""

    @property
    def start_offset(self) -> int: ...

    @property
    def durable_next(self) -> int: ...

    def segment_names(self) -> list[str]: ...

    async def fetch(self, from_offset: int, *, max_bytes: int, max_count: int) -> FetchResult: ...


async def offset_for_time(wal: WalView, timestamp_ms: int) -> int:
    """The first offset whose record was published at or after ``timestamp_ms`` (see the
    module docstring for the ends)."""
    start, end = wal.start_offset, wal.durable_next
    if start >= end:
        return end
    named = (parse_segment_name(name) for name in wal.segment_names())
    firsts = sorted({start} | {o for o in named if o is not None and start < o < end})
    # The first segment whose first record is at or after the time (len(firsts): none is).
    low, high = 0, len(firsts)
    while low < high:
        middle = (low + high) // 2
        first = await _first(wal, firsts[middle])
        if first is None or first[1] >= timestamp_ms:
            high = middle
        else:
            low = middle + 1
    if low > 0:
        stop = firsts[low] if low < len(firsts) else end
        found = await _scan(wal, firsts[low - 1], stop, timestamp_ms)
        if found is not None:
            return found
        if low == len(firsts):
            return end
    first = await _first(wal, firsts[low])
    return end if first is None else first[0]


async def _first(wal: WalView, offset: int) -> tuple[int, int] | None:
    """``(offset, publish time)`` of the first record at or after ``offset``; ``None`` when
    nothing durable follows. Data dropped meanwhile counts as older than what is left."""
    try:
        result = await wal.fetch(offset, max_bytes=1, max_count=1)
    except BelowWalStartError as exc:
        result = await wal.fetch(exc.start_offset, max_bytes=1, max_count=1)
    if not result.messages:
        return None
    found, record = result.messages[0]
    return found, record_publish_time_ms(record)


async def _scan(wal: WalView, offset: int, stop: int, timestamp_ms: int) -> int | None:
    """The first offset in ``[offset, stop)`` published at or after the time, if any."""
    position = offset
    while position < stop:
        try:
            result = await wal.fetch(position, max_bytes=SCAN_MAX_BYTES, max_count=SCAN_MAX_COUNT)
        except BelowWalStartError as exc:
            position = exc.start_offset
            continue
        for found, record in result.messages:
            if found >= stop:
                return None
            if record_publish_time_ms(record) >= timestamp_ms:
                return found
        if not result.messages or result.next_offset <= position:
            return None  # nothing more is durable
        position = result.next_offset
    return None

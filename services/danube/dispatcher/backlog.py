"""How many messages a subscription still has to get through: pure arithmetic, no I/O.

A partition's backlog is what lies between its cursor and the end of the partition (ingest's
durable next offset), less what was acked out of order beyond the cursor::

    backlog = end - next_offset - |{a in acked_beyond : next_offset <= a < end}|

It counts offsets, not messages, so it is an upper bound where the partition has gaps
(offsets ingest skipped after an ownership change are never assigned, yet lie inside the
range) and where a stored ``acked_beyond`` was truncated (the dropped acks count as unacked).
It also counts offsets below the WAL start, which only the cloud tier still holds. In a
partition without gaps, read from a live cursor, it is exact.
"""

from __future__ import annotations

from collections.abc import Iterable

from danube.dispatcher.cursor import PartitionCursor
from danube.dispatcher.protocol import PartitionStats
from danube.ingest.client import WalOffsets


def backlog(next_offset: int, acked_beyond: Iterable[int], end_offset: int | None) -> int | None:
    """Unacked offsets in ``[next_offset, end_offset)``; ``None`` when the end is unknown
    (the partition's ingest owner did not answer). A cursor at or past the end has none."""
    if end_offset is None:
        return None
    if end_offset <= next_offset:
        return 0
    acked = sum(1 for offset in acked_beyond if next_offset <= offset < end_offset)
    return end_offset - next_offset - acked


def total(backlogs: Iterable[int | None]) -> int:
    """The sum over partitions whose backlog is known (an unknown one counts as 0: its
    own entry says ``None``)."""
    return sum(b for b in backlogs if b is not None)


def partition_stats(name: str, cursor: PartitionCursor, wal: WalOffsets | None) -> PartitionStats:
    """One partition's line of a subscription's stats: its live cursor, the WAL's ends
    (``None`` when its ingest owner did not answer) and the backlog between them."""
    end = None if wal is None else wal.durable_next
    return PartitionStats(
        partition=name,
        next_offset=cursor.next_offset,
        read_position=cursor.read_position,
        acked_beyond=len(cursor.acked_beyond),
        wal_start=None if wal is None else wal.start_offset,
        wal_next=end,
        backlog=backlog(cursor.next_offset, cursor.acked_beyond, end),
    )

"""How many messages a subscription still has to get through: pure arithmetic, no I/O.

A partition's backlog is what lies between its cursor and the end of the partition (ingest's
committed end, ``durable_next``: the first offset not yet readable), less what was acked out
of order beyond the cursor::

    backlog = end - next_offset - |{a in acked_beyond : next_offset <= a < end}|

A partition's offsets are contiguous for its whole life (one replicated log per partition:
no offsets skipped on a leader change), so every offset in ``[next_offset, end)`` is a
message and the count is exact: the messages not yet acknowledged. Messages below the WAL
start, still in the cloud tier, count like the others. Two things make it a snapshot rather
than a promise: a cursor read from etcd lags the live one by the write batching, and a stored
``acked_beyond`` truncated at its limit counts the dropped acks as unacked (they will be
delivered again after a restart, so they are pending once more).
"""

from __future__ import annotations

from danube.dispatcher.cursor import PartitionCursor
from danube.wire.dispatcher.protocol import PartitionStats
from danube.wire.ingest.client import WalOffsets
from danube.wire.limits import backlog

__all__ = ["partition_stats"]


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

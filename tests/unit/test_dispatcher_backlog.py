"""Backlog arithmetic: cursor to end, less acks beyond it; unknown ends; exact from a live
or a resumed cursor with acks beyond it (offsets are contiguous)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from danube.dispatcher.backlog import partition_stats
from danube.dispatcher.cursor import CursorState, PartitionCursor
from danube.wire.ingest.client import WalOffsets
from danube.wire.limits import backlog, total

pytestmark = pytest.mark.unit


def test_from_the_cursor_to_the_end_less_the_acks_beyond() -> None:
    assert backlog(0, [], 10) == 10
    assert backlog(4, [], 10) == 6
    assert backlog(4, [5, 7], 10) == 4
    # Acks outside [cursor, end) change nothing (stale, or beyond a slow owner's answer).
    assert backlog(4, [2, 3, 10, 12], 10) == 6


def test_a_cursor_at_or_past_the_end_has_none_and_an_unknown_end_is_unknown() -> None:
    assert backlog(10, [], 10) == 0
    assert backlog(15, [16], 10) == 0  # e.g. a seek past the end
    assert backlog(3, [4], None) is None


def test_total_sums_the_known_partitions() -> None:
    assert total([3, None, 4]) == 7
    assert total([None]) == 0
    assert total([]) == 0


@given(st.integers(0, 60), st.sets(st.integers(0, 59)), st.integers(0, 60))
def test_equals_the_offsets_neither_below_the_cursor_nor_acked(
    start: int, acked: set[int], end: int
) -> None:
    # A live cursor over a partition without gaps: read everything up to `end`, ack a set.
    cursor = PartitionCursor(start)
    for offset in range(start, end):
        assert cursor.observe(offset)
    for offset in sorted(acked):
        cursor.ack(offset)
    unacked = [o for o in range(start, end) if o not in acked]
    assert backlog(cursor.next_offset, cursor.acked_beyond, end) == len(unacked)


def test_a_resumed_cursor_with_acks_beyond_counts_exactly_the_pending_messages() -> None:
    # Offsets 0..19 exist (contiguous); 0..4 acked in order, then 7, 8 and 15 out of order.
    cursor = PartitionCursor.from_state(CursorState(next_offset=5, acked_beyond=(7, 8, 15)))
    pending = [o for o in range(20) if o >= 5 and o not in (7, 8, 15)]
    stats = partition_stats("t", cursor, WalOffsets(start_offset=0, durable_next=20))
    assert (stats.backlog, stats.acked_beyond, stats.wal_next) == (len(pending), 3, 20)
    assert stats.backlog == 12
    # Reading on, 7 and 8 are known acked (not delivered again); acking 5 and 6 moves the
    # cursor over them, and the count follows message by message.
    assert [cursor.observe(o) for o in (5, 6, 7, 8)] == [True, True, False, False]
    cursor.ack(5)
    cursor.ack(6)
    assert cursor.next_offset == 9
    assert backlog(cursor.next_offset, cursor.acked_beyond, 20) == 10
    # An unknown end stays unknown.
    assert partition_stats("t", cursor, None).backlog is None

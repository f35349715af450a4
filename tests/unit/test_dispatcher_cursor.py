"""Dispatcher cursors: contiguous advance over out-of-order acks and gaps, storage, flush policy."""

from __future__ import annotations

import heapq

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from danube.dispatcher.cursor import CursorState, FlushPolicy, PartitionCursor

pytestmark = pytest.mark.unit


def observed(
    offsets: list[int], start: int = 0, policy: FlushPolicy | None = None
) -> PartitionCursor:
    cursor = PartitionCursor(start, policy=policy)
    for offset in offsets:
        assert cursor.observe(offset)
    return cursor


def test_out_of_order_acks_advance_the_contiguous_point_when_the_gap_closes() -> None:
    cursor = observed(list(range(10)))
    for offset in (3, 1, 2, 5):
        assert cursor.ack(offset)
    assert (cursor.next_offset, cursor.acked_beyond) == (0, [1, 2, 3, 5])
    assert cursor.ack(0)
    assert (cursor.next_offset, cursor.acked_beyond) == (4, [5])
    assert cursor.ack(4)
    assert (cursor.next_offset, cursor.acked_beyond) == (6, [])


def test_offsets_missing_from_a_read_are_a_gap_the_cursor_moves_over() -> None:
    # Ingest skipped 3..99 after an ownership change: the read returns 0, 1, 2, 100, 101.
    cursor = observed([0, 1, 2, 100, 101])
    for offset in (0, 1, 2):
        cursor.ack(offset)
    assert cursor.next_offset == 100
    cursor.ack(101)
    assert (cursor.next_offset, cursor.acked_beyond) == (100, [101])
    cursor.ack(100)
    assert cursor.next_offset == 102 == cursor.read_position


def test_skip_to_moves_an_idle_cursor_over_a_gap_but_never_backwards() -> None:
    cursor = observed([0])
    cursor.ack(0)
    cursor.skip_to(50)
    assert (cursor.next_offset, cursor.read_position) == (50, 50)
    cursor.skip_to(10)
    assert cursor.read_position == 50
    assert not cursor.observe(20)  # below the read position: already read


def test_a_pending_offset_holds_the_point_while_a_gap_is_skipped() -> None:
    cursor = observed([7], start=7)
    cursor.skip_to(40)
    assert cursor.next_offset == 7
    cursor.ack(7)
    assert cursor.next_offset == 40


def test_acks_of_unread_or_already_acked_offsets_change_nothing() -> None:
    cursor = observed([0, 1])
    assert not cursor.ack(5)
    assert cursor.ack(1)
    assert not cursor.ack(1)
    assert (cursor.next_offset, cursor.acked_beyond, cursor.pending_count) == (0, [1], 1)


def test_state_round_trips_through_json() -> None:
    cursor = observed(list(range(20)))
    for offset in (0, 1, 4, 9, 15):
        cursor.ack(offset)
    state = cursor.state()
    assert state == CursorState(next_offset=2, acked_beyond=(4, 9, 15))
    decoded = CursorState.model_validate_json(state.model_dump_json())
    assert decoded == state
    assert state.model_dump(mode="json", exclude_none=True) == {
        "next_offset": 2,
        "acked_beyond": [4, 9, 15],
    }


def test_restart_from_a_stored_cursor_redelivers_exactly_the_unacked_offsets() -> None:
    cursor = observed(list(range(12)))
    for offset in (0, 1, 2, 5, 6, 10):
        cursor.ack(offset)
    resumed = PartitionCursor.from_state(
        CursorState.model_validate_json(cursor.state().model_dump_json())
    )
    assert resumed.read_position == 3
    to_deliver = [o for o in range(3, 12) if resumed.observe(o)]
    assert to_deliver == [3, 4, 7, 8, 9, 11]
    for offset in to_deliver:
        resumed.ack(offset)
    assert (resumed.next_offset, resumed.acked_beyond) == (12, [])


def test_the_stored_acks_beyond_are_bounded_to_the_lowest_ones() -> None:
    cursor = observed(list(range(100)), policy=FlushPolicy(max_acked_beyond=5))
    for offset in range(1, 100, 2):
        cursor.ack(offset)
    state = cursor.state()
    assert state.next_offset == 0
    assert state.acked_beyond == (1, 3, 5, 7, 9)
    # A lost ack only means a redelivery after a restart, never a skipped offset.
    resumed = PartitionCursor.from_state(state)
    redelivered = [o for o in range(100) if resumed.observe(o)]
    assert set(redelivered) >= set(range(0, 100, 2))
    assert {1, 3, 5, 7, 9}.isdisjoint(redelivered)


def test_a_stored_cursor_is_checked_when_read() -> None:
    with pytest.raises(ValidationError):
        CursorState(next_offset=5, acked_beyond=(5, 6))
    with pytest.raises(ValidationError):
        CursorState(next_offset=0, acked_beyond=(3, 2))
    with pytest.raises(ValidationError):
        CursorState(next_offset=0, acked_beyond=tuple(range(1, 10_002)))


def test_flush_is_due_after_n_acks_or_t_seconds_not_per_ack() -> None:
    cursor = observed(list(range(10)), policy=FlushPolicy(flush_acks=3, flush_interval_s=5.0))
    assert not cursor.should_flush(0.0)  # nothing changed yet
    cursor.ack(0)
    assert cursor.should_flush(0.0)  # never written: due at once
    cursor.mark_flushed(0.0)
    cursor.ack(1)
    cursor.ack(2)
    assert not cursor.should_flush(1.0)
    cursor.ack(3)
    assert cursor.should_flush(1.0)  # three acks
    cursor.mark_flushed(1.0)
    cursor.ack(4)
    assert not cursor.should_flush(5.9)
    assert cursor.should_flush(6.0)  # five seconds
    cursor.mark_flushed(6.0)
    assert not cursor.should_flush(100.0)  # clean
    cursor.mark_dirty()  # the write failed
    assert cursor.should_flush(6.0)


def test_reset_forgets_pending_and_acked_offsets() -> None:
    cursor = observed(list(range(5)))
    cursor.ack(3)
    cursor.reset(2)
    assert (cursor.next_offset, cursor.read_position, cursor.acked_beyond) == (2, 2, [])
    assert cursor.observe(2)
    assert cursor.observe(3)


class _FourLookCursor(PartitionCursor):
    """The cursor with ``observe`` as it was before its one-look fast path, and ``ack`` as
    it was before its in-order fast path: the reference."""

    def ack(self, offset: int) -> bool:
        if offset not in self._pending_set:
            return False
        self._pending_set.discard(offset)
        self._acked.add(offset)
        heapq.heappush(self._acked_heap, offset)
        self._acks_since_flush += 1
        self._dirty = True
        self._compact()
        return True

    def observe(self, offset: int) -> bool:
        if offset < self._read_position:
            return False
        before = self.next_offset
        self._read_position = offset + 1
        if offset in self._acked:
            self._after_move(before)
            return False
        self._pending_set.add(offset)
        self._pending.append(offset)
        self._after_move(before)
        return True


_OPS = st.lists(
    st.tuples(
        # "ack_next": an ack of the contiguous point itself (acks in delivery order).
        st.sampled_from(["observe", "ack", "ack_next", "ack_next", "skip", "flush"]),
        st.integers(0, 40),
    ),
    max_size=60,
)


@settings(max_examples=300, deadline=None)
@given(
    start=st.integers(0, 10),
    acked_beyond=st.lists(st.integers(0, 40), max_size=8),
    ops=_OPS,
)
def test_observe_with_one_look_does_what_the_four_look_observe_did(
    start: int, acked_beyond: list[int], ops: list[tuple[str, int]]
) -> None:
    state = CursorState(
        next_offset=start, acked_beyond=tuple(sorted({a for a in acked_beyond if a > start}))
    )
    cursors = [PartitionCursor.from_state(state), _FourLookCursor.from_state(state)]
    for op, offset in ops:
        outcomes = []
        if op == "ack_next":
            op, offset = "ack", cursors[0].next_offset
        for cursor in cursors:
            if op == "observe":
                outcomes.append(cursor.observe(offset))
            elif op == "ack":
                outcomes.append(cursor.ack(offset))
            elif op == "skip":
                cursor.skip_to(offset)
            else:
                cursor.mark_flushed(0.0)
        new, old = cursors
        assert outcomes[:1] == outcomes[1:]
        assert (new.next_offset, new.read_position, new.dirty) == (
            old.next_offset,
            old.read_position,
            old.dirty,
        )
        assert new.acked_beyond == old.acked_beyond
        assert new.pending_count == old.pending_count
        assert new.state() == old.state()
        assert new.should_flush(0.5) == old.should_flush(0.5)

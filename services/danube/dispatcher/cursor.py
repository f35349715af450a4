"""A subscription's position in one partition: the contiguous acked point plus acks beyond it.

Offsets in a partition may have gaps (after an ownership change ingest starts at its
reservation, skipping offsets that were never assigned), so "every offset below N is acked"
cannot be computed from acks alone. The cursor therefore also tracks what it has *read*:

- ``read_position``: the next offset to read; every existing offset below it has been
  observed (:meth:`PartitionCursor.observe`) or proven absent (:meth:`PartitionCursor.skip_to`,
  or implicitly by observing a later offset of the same contiguous read);
- ``pending``: observed offsets that are not acked yet (buffered, in flight or waiting for a
  redelivery);
- ``next_offset`` (the contiguous point) is the lowest pending offset, or ``read_position``
  when nothing is pending: every existing offset below it is acked, gaps included, because a
  gap is never pending;
- ``acked_beyond``: acked offsets above ``next_offset`` (acks out of order).

Persisted (:class:`CursorState`, JSON in etcd) are ``next_offset`` and ``acked_beyond``. After a
restart the dispatcher reads from ``next_offset`` again and :meth:`observe` answers ``False`` for
an offset in ``acked_beyond``, so exactly the unacked offsets are delivered again.

The stored ``acked_beyond`` is bounded (``max_acked_beyond``): past it only the lowest ones are
kept. Dropping an ack can only cause a redelivery after a restart (the offset is then treated
as unacked), never a loss, because ``next_offset`` itself is exact. The ones kept are the
lowest because they are the ones that let ``next_offset`` advance soonest after a restart.

Writes are batched (:meth:`PartitionCursor.should_flush`): after ``flush_acks`` acks, or
``flush_interval_s`` after the last flush, and on detach (the caller's decision).
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, model_validator

from danube.meta.records import DelaySnapshotRef

OFFSET_MAX = 2**64 - 1
# The hard limit of a stored cursor, whatever the policy says: keeps one etcd value small
# (10k offsets of up to 20 digits is ~210 KB, well under etcd's 1.5 MiB request limit).
ACKED_BEYOND_STORED_MAX = 10_000

Offset = Annotated[int, Field(ge=0, le=OFFSET_MAX)]


class CursorState(BaseModel):
    """The stored form of a cursor: every offset below ``next_offset`` is acked, and so are
    the offsets in ``acked_beyond`` (strictly increasing, each above ``next_offset``)."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    next_offset: Offset
    acked_beyond: Annotated[tuple[Offset, ...], Field(max_length=ACKED_BEYOND_STORED_MAX)] = ()
    # Where the delayed messages not acked yet lie, and their earliest due time (Unix ms):
    # danube.dispatcher.delayed. None: none.
    delay_from: Offset | None = None
    delay_due_ms: Annotated[int, Field(ge=0)] | None = None
    # The sealed delay snapshots holding them (danube.dispatcher.sealed), in offset order.
    delay_snapshots: tuple[DelaySnapshotRef, ...] | None = None

    @model_validator(mode="after")
    def _check_order(self) -> CursorState:
        previous = self.next_offset
        for offset in self.acked_beyond:
            if offset <= previous:
                raise ValueError("acked_beyond must be strictly increasing and above next_offset")
            previous = offset
        return self


@dataclass(frozen=True, slots=True)
class FlushPolicy:
    """When a dirty cursor is written, and how many out-of-order acks a write keeps."""

    flush_acks: int = 1000
    flush_interval_s: float = 1.0
    max_acked_beyond: int = 1000

    def __post_init__(self) -> None:
        if self.flush_acks < 1 or self.flush_interval_s <= 0:
            raise ValueError("flush_acks must be >= 1 and flush_interval_s > 0")
        if not 0 <= self.max_acked_beyond <= ACKED_BEYOND_STORED_MAX:
            raise ValueError(f"max_acked_beyond must be in [0, {ACKED_BEYOND_STORED_MAX}]")


class PartitionCursor:
    """The read, pending and acked offsets of one subscription in one partition."""

    def __init__(
        self,
        next_offset: int = 0,
        acked_beyond: Iterable[int] = (),
        *,
        policy: FlushPolicy | None = None,
    ) -> None:
        if not 0 <= next_offset <= OFFSET_MAX:
            raise ValueError(f"next_offset {next_offset} out of range")
        self.policy = policy or FlushPolicy()
        self._read_position = next_offset
        # Observed offsets arrive in increasing order, so a deque keeps them sorted; acked
        # ones are dropped from the set at once and from the deque lazily (at its head).
        self._pending_set: set[int] = set()
        self._pending: deque[int] = deque()
        self._acked: set[int] = {a for a in acked_beyond if a > next_offset}
        self._acked_heap: list[int] = sorted(self._acked)  # a sorted list is a heap
        self._dirty = False
        self._acks_since_flush = 0
        self._flushed_at_s: float | None = None
        self._flush_seq = 0

    @classmethod
    def from_state(
        cls, state: CursorState, *, policy: FlushPolicy | None = None
    ) -> PartitionCursor:
        """A cursor resumed from what was stored: reading restarts at ``state.next_offset``."""
        return cls(state.next_offset, state.acked_beyond, policy=policy)

    # --- positions ---------------------------------------------------------------------

    @property
    def read_position(self) -> int:
        """The next offset to read: every existing offset below it has been observed."""
        return self._read_position

    @property
    def next_offset(self) -> int:
        """The contiguous acked point: every existing offset below it is acked."""
        pending = self._pending
        while pending and pending[0] not in self._pending_set:
            pending.popleft()
        return pending[0] if pending else self._read_position

    @property
    def acked_beyond(self) -> list[int]:
        """The acked offsets above :attr:`next_offset`, in increasing order."""
        self._compact()
        return sorted(self._acked)

    @property
    def acked_beyond_count(self) -> int:
        """How many acks sit above :attr:`next_offset` (what a stored cursor must carry)."""
        self._compact()
        return len(self._acked)

    @property
    def pending_count(self) -> int:
        """Observed offsets that are not acked yet."""
        return len(self._pending_set)

    def is_acked(self, offset: int) -> bool:
        """Whether ``offset`` is known to be acked (below the contiguous point, or beyond it)."""
        return offset < self.next_offset or offset in self._acked

    # --- changes -----------------------------------------------------------------------

    def observe(self, offset: int) -> bool:
        """Record that ``offset`` exists (it was read); offsets between the read position and
        it do not exist. Returns whether it must be delivered: ``False`` for an offset read
        before (a duplicate) or acked before a restart."""
        read = self._read_position
        if offset < read:
            return False
        # One look at the contiguous point, not four: every op leaves no ack below it
        # (_compact), so it moves (and a compaction has work) only when nothing was pending
        # (the point was the read position) and the read position passes it.
        nothing_pending = self.next_offset == read
        self._read_position = offset + 1
        if offset in self._acked:
            if nothing_pending:  # the point moves past this acked offset
                self._dirty = True
                self._compact()
            return False
        self._pending_set.add(offset)
        self._pending.append(offset)
        if nothing_pending and offset != read:  # the point moves up to this offset
            self._dirty = True
            self._compact()
        return True

    def skip_to(self, offset: int) -> None:
        """Record that no offset in ``[read_position, offset)`` exists (a gap, or data
        already gone from the partition); never moves backwards."""
        if offset <= self._read_position:
            return
        before = self.next_offset
        self._read_position = offset
        self._after_move(before)

    def ack(self, offset: int) -> bool:
        """Acknowledge an observed offset; ``False`` if it was not pending (already acked,
        never read, or not existing), which changes nothing."""
        pending_set = self._pending_set
        if offset not in pending_set:
            return False
        pending_set.discard(offset)
        self._acks_since_flush += 1
        self._dirty = True
        pending = self._pending
        if pending[0] == offset:
            # The contiguous point itself (acks in delivery order): the point moves past
            # it, so there is nothing to remember beyond; acks it now reaches are dropped.
            pending.popleft()
            if self._acked_heap:
                self._compact()
            return True
        self._acked.add(offset)
        heapq.heappush(self._acked_heap, offset)
        self._compact()
        return True

    def reset(self, offset: int) -> None:
        """Move to ``offset`` (a seek): forget everything pending and acked beyond."""
        if not 0 <= offset <= OFFSET_MAX:
            raise ValueError(f"offset {offset} out of range")
        self._read_position = offset
        self._pending_set.clear()
        self._pending.clear()
        self._acked.clear()
        self._acked_heap.clear()
        self._dirty = True

    # --- persistence -------------------------------------------------------------------

    @property
    def dirty(self) -> bool:
        """Whether the cursor changed since the last :meth:`mark_flushed`."""
        return self._dirty

    def should_flush(self, now_s: float) -> bool:
        """Whether a dirty cursor is due for a write: enough acks, or long enough since the
        last write (a cursor never written is due at once)."""
        if not self._dirty:
            return False
        if self._acks_since_flush >= self.policy.flush_acks:
            return True
        last = self._flushed_at_s
        return last is None or now_s - last >= self.policy.flush_interval_s

    def state(self) -> CursorState:
        """What to store: ``next_offset`` and the lowest ``max_acked_beyond`` acks beyond it."""
        floor = self.next_offset
        self._compact()
        beyond = (a for a in self._acked if a > floor)
        kept = heapq.nsmallest(self.policy.max_acked_beyond, beyond)
        return CursorState(next_offset=floor, acked_beyond=tuple(kept))

    @property
    def flush_seq(self) -> int:
        """How many states were handed out for writing (:meth:`mark_flushed` calls): a change
        made now is in write ``flush_seq + 1`` if the cursor is dirty, else in ``flush_seq``."""
        return self._flush_seq

    def mark_flushed(self, now_s: float) -> None:
        """The state returned by :meth:`state` is being written; count from here."""
        self._flush_seq += 1
        self._dirty = False
        self._acks_since_flush = 0
        self._flushed_at_s = now_s

    def touch(self) -> None:
        """Something stored with the cursor changed (the delayed messages' state): count it
        as an ack, so the next write (and an ack waiting for it) holds it."""
        self._dirty = True
        self._acks_since_flush += 1

    def mark_dirty(self) -> None:
        """A write failed: keep the cursor due so the next check writes it again."""
        self._dirty = True
        self._flushed_at_s = None

    # --- internals ---------------------------------------------------------------------

    def _after_move(self, before: int) -> None:
        if self.next_offset != before:
            self._dirty = True
        self._compact()

    def _compact(self) -> None:
        # Acks at or below the contiguous point are implied by it; drop them.
        floor = self.next_offset
        heap = self._acked_heap
        while heap and heap[0] < floor:
            self._acked.discard(heapq.heappop(heap))

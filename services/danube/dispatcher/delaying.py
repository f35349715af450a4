"""Delayed delivery, the subscription machine's share (danube.dispatcher.delivery mixes it
in): on shared and key-shared subscriptions a message carrying a delivery time
(danube.wire.delay) is acknowledged in its cursor as it is read and filed in the
subscription's :class:`~danube.dispatcher.delayed.DelayedMessages` instead of becoming an
entry; once due (``Poll.wall_ms`` / ``Tick.wall_ms``) it becomes an entry like a freshly
read message, delivered, acked, redelivered and dead-lettered as any other. Exclusive and
failover subscriptions deliver it at once, in offset order (as Pulsar does): their one
consumer reads the partition in order, and a hold would stall everything behind it.

**Handed early to consumers that hold.** A consumer that attached with ``hold_delayed``
(the SDK's) keeps a delayed message it is given until its time, by its own clock. On a
shared subscription with such a consumer attached, a message becomes an entry
``delay_lookahead_ms`` before it is due: *early*, taken by holding consumers only (after
everything due), and joining its partition's fresh queue for everyone at its time. So a
message due while its dispatcher is killed and replaced is already in its consumer's hands,
and the timer that gives it out runs in the consumer, not here (docs/policies.md, "Delayed
delivery"). A consumer that does not hold is never given a message before its time: not
early, and not as a redelivery of one that was early (taken back from a holding consumer
that left). Key-shared subscriptions hand nothing early (a key's consumer is decided at
its time).
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable, Mapping

from danube.dispatcher.cursor import CursorState, PartitionCursor
from danube.dispatcher.delayed import DelayedMessages
from danube.dispatcher.due_time import due_of
from danube.dispatcher.entries import Entry, PartitionQueue, Ref
from danube.dispatcher.events import MessagesAvailable
from danube.dispatcher.redelivery import DeliverySettings
from danube.dispatcher.sealed import ResumePlan, plan_resume
from danube.dispatcher.snapshot import SnapshotHead
from danube.frame import RawFrame

DELAYING_TYPES = ("shared", "key_shared")
ExpiryOf = Callable[[object], int | None]
# Early entries: (due ms, a tie-breaking count, the entry), a heap with stale items left
# behind (an entry taken, forgotten or seeked away is skipped when it comes up).
EarlyItem = tuple[int, int, Entry]


class DelayHandling:
    """The delay share of the subscription machine; its state is the machine's."""

    _entries: dict[Ref, Entry]
    _partitions: dict[str, PartitionQueue]
    settings: DeliverySettings
    expiry_of: ExpiryOf
    _expiring: bool
    delivery_type: str
    # Set by the machine for shared and key-shared subscriptions (None: delivered at once).
    delayed: DelayedMessages | None = None
    # Entries handed out early (module docstring), and the attached consumers that hold.
    _early: list[EarlyItem]
    _early_count: itertools.count[int]
    _holders: int

    def _enqueue(self, partition: PartitionQueue, entry: Entry) -> None:
        raise NotImplementedError

    def resume_delayed(
        self, states: Mapping[str, CursorState], heads: Mapping[str, SnapshotHead] | None = None
    ) -> None:
        """The subscription resumed from ``states``: the delayed messages not acked they
        name come from their snapshots whose ``heads`` were read (by key), else from the
        log, read again beside the usual reader (danube.dispatcher.sealed)."""
        if self.delayed is None:
            return
        for name, state in states.items():
            plan = resume_plan(state)
            self.delayed.resume_from(name, plan, heads or {}, state.delay_due_ms)

    def rescan_position(self, name: str) -> int | None:
        """Where partition ``name`` is being read again for its delayed messages not acked
        (None: it is not): a reader of its own does it, beside the usual one."""
        return None if self.delayed is None else self.delayed.rescanning(name)

    def reread(self, event: MessagesAvailable) -> None:
        """A read again of a partition for its delayed messages (from
        :meth:`rescan_position`): files them; a read from elsewhere is ignored (the rescan
        reader asks again from where it is)."""
        delayed, name = self.delayed, event.partition
        position = None if delayed is None else delayed.rescanning(name)
        if delayed is None or position is None or event.next_offset is None:
            return
        if event.from_offset != position:
            return
        delayed.rescan(name, list(event.messages), event.next_offset)

    def _file_if_delayed(
        self, name: str, cursor: PartitionCursor, offset: int, payload: object
    ) -> bool:
        """File an observed message that carries a delivery time (acked in its cursor: it
        never holds the contiguous point back); False for any other message."""
        delayed = self.delayed
        if delayed is None or not isinstance(payload, RawFrame):
            return False
        due = due_of(payload)
        if due is None:
            return False
        cursor.ack(offset)
        delayed.file(name, offset, due, payload)
        return True

    def _lookahead_ms(self) -> int:
        """How long before its time a delayed message becomes an entry: the setting on a
        shared subscription while a consumer that holds is attached, else 0."""
        if self._holders and self.delivery_type == "shared":
            return self.settings.delay_lookahead_ms
        return 0

    def _release_due(self, wall_ms: int | None) -> None:
        """Delayed messages due at ``wall_ms`` become entries, as many as ``max_held``
        leaves room for (the rest wait filed, late rather than over the bound); those due
        within the lookahead become early entries (module docstring)."""
        delayed = self.delayed
        if delayed is None or wall_ms is None:
            return
        if self._early:
            self._early_fall_due(wall_ms)
        if not delayed.filed:
            return
        room = self.settings.max_held - len(self._entries)
        if room <= 0:
            return
        entries, partitions = self._entries, self._partitions
        for due in delayed.take_due(wall_ms + self._lookahead_ms(), room):
            partition = partitions.get(due.partition)
            key = (due.partition, due.offset)
            if partition is None or key in entries:
                delayed.done(due.partition, due.offset)
                continue
            expires_ms = self.expiry_of(due.frame)
            if expires_ms is not None:
                self._expiring = True
            entry = Entry(due.partition, due.offset, due.frame, expires_ms=expires_ms)
            entry.delayed = True
            entries[key] = entry
            if due.due_ms > wall_ms:
                entry.due_ms = due.due_ms
                heapq.heappush(self._early, (due.due_ms, next(self._early_count), entry))
            else:
                self._enqueue(partition, entry)

    def _early_fall_due(self, wall_ms: int) -> None:
        """Early entries no holding consumer took by their time join the fresh queues."""
        early, partitions = self._early, self._partitions
        while early and early[0][0] <= wall_ms:
            _, _, entry = heapq.heappop(early)
            if self._is_early(entry):
                entry.due_ms = 0
                self._enqueue(partitions[entry.partition], entry)

    def _is_early(self, entry: Entry) -> bool:
        """Whether a heap item's ``entry`` still waits as an early entry (not taken,
        forgotten, seeked away or let go since)."""
        key = (entry.partition, entry.offset)
        return entry.state == "fresh" and entry.due_ms > 0 and self._entries.get(key) is entry

    def _delayed_done(self, entry: Entry) -> None:
        """A delayed message is acked, dead-lettered, expired or dropped: its cursor holds
        the change (the delay state is written with it)."""
        if entry.delayed and self.delayed is not None:
            self.delayed.done(entry.partition, entry.offset)
            self._partitions[entry.partition].cursor.touch()

    def _stored_state(self, name: str, cursor: PartitionCursor) -> CursorState:
        """What to store for partition ``name``: its cursor and where its delayed messages
        not acked yet lie."""
        state = cursor.state()
        delayed = self.delayed
        if delayed is None:
            return state
        delay_from = delayed.delay_from(name, _read_again_to(state))
        if delay_from is None:
            return state
        due_ms = delayed.due_floor_ms()
        return state.model_copy(
            update={
                "delay_from": delay_from,
                "delay_due_ms": due_ms,
                "delay_snapshots": delayed.chain(name) or None,
            }
        )

    def next_due_ms(self) -> int | None:
        """The earliest delivery time of a delayed message filed: the runtime ticks then
        rather than at its usual pace. None when none is filed, and while the subscription
        holds ``max_held`` messages: a due one could not be released, so a wait until it
        would be a loop of empty ticks; the usual tick looks again once acks made room."""
        early = self._early[0][0] if self._early else None  # due: to the fresh queues
        if self.delayed is None or len(self._entries) >= self.settings.max_held:
            return early
        due = self.delayed.next_due_ms()
        if due is not None:
            due -= self._lookahead_ms()
        return due if early is None or (due is not None and due < early) else early

    @property
    def delayed_count(self) -> int:
        """Delayed messages held and not acked (filed, or out and not acked yet)."""
        return 0 if self.delayed is None else self.delayed.held


def resume_plan(state: CursorState) -> ResumePlan:
    """Where ``state``'s delayed messages not acked come from (sealed.plan_resume)."""
    return plan_resume(
        state.delay_from, _read_again_to(state), state.delay_due_ms, state.delay_snapshots or ()
    )


def _read_again_to(state: CursorState) -> int:
    """Where a resume's read again of the delayed messages ends. A delayed message is acked
    in its cursor when read, so one read above the contiguous point lies in ``acked_beyond``,
    which the usual reader of a new owner skips: the read again reaches past the highest of
    them, not only to ``next_offset`` (what a stored ``acked_beyond`` left out, the usual
    reader reads again and files itself)."""
    return max(state.next_offset, state.acked_beyond[-1] + 1 if state.acked_beyond else 0)

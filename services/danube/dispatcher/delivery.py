"""The delivery state machine of one subscription over its partitions: no I/O, time passed in.

``SubscriptionMachine.handle(event) -> list[Action]`` (see :mod:`danube.dispatcher.events`).
Each message the subscription holds is an entry in exactly one state::

    fresh ──poll──> in_flight ──ack──> (gone; cursor acked)
                      │  ^
     ack timeout,     │  └──poll── ready <──due── scheduled
     nack, detach ────┴──> (count + 1) ──> scheduled | ready | poison (count > max)

A poison message is disposed of by the failure policy's ``poison_policy``: dead-lettered
or dropped (the cursor moves past it), or ``blocked`` (held at the head of its partition:
danube.dispatcher.poison).

A consumer's window (``max_unacked_per_consumer``) counts the messages it was given and did
not ack: in flight, and also those taken back from it by an ack timeout until they are
delivered again (to it or to another consumer). A consumer that never acks is therefore never
given more than its window, however many ack timeouts pass; it may always take its own
messages back. A nack or a detach gives the messages back for good (they leave the window).

Redeliveries go to another consumer first, and a consumer whose messages keep timing out is
slowed, then detached (danube.dispatcher.slow).

docs/dispatcher.md gives the invariants and the order guarantees; :meth:`validate` checks
those of the data structures (danube.dispatcher.inspection, with the other read-only views;
the fair-redelivery glue is danube.dispatcher.fair; which messages a poll takes, and in what
order, danube.dispatcher.taking).
"""

from __future__ import annotations

import heapq
import itertools
import logging
import random
from collections.abc import Callable, Iterable, Mapping
from typing import Literal

from danube.dispatcher import slow
from danube.dispatcher.cursor import PartitionCursor
from danube.dispatcher.delayed import DelayedMessages
from danube.dispatcher.delaying import DELAYING_TYPES, DelayHandling
from danube.dispatcher.entries import ConsumerWindow, Entry, PartitionQueue, Ref
from danube.dispatcher.events import (
    Ack,
    Action,
    ConsumerAttached,
    ConsumerDetached,
    Deliver,
    Event,
    FlushCursor,
    MessagesAvailable,
    Nack,
    NotInFlight,
    PauseReading,
    Poll,
    ReadFrom,
    ResumeReading,
    Seek,
    Tick,
)
from danube.dispatcher.expiring import ExpiryHandling
from danube.dispatcher.fair import FairRedelivery
from danube.dispatcher.inspection import MachineInspection
from danube.dispatcher.poison import BlockBook, PoisonHandling
from danube.dispatcher.redelivery import DeliverySettings
from danube.dispatcher.taking import PollTaking
from danube.errors import ErrorKind
from danube.wire.dispatcher.errors import (
    ConsumerDetachedError,
    ConsumerExistsError,
    ConsumerNotFoundError,
    DispatcherError,
    SubscriptionTakenError,
    UnknownPartitionError,
)

log = logging.getLogger(__name__)

DeliveryType = Literal["exclusive", "shared", "failover", "key_shared"]


class SubscriptionMachine(
    PoisonHandling, DelayHandling, MachineInspection, FairRedelivery, ExpiryHandling, PollTaking
):
    """Delivery of one subscription: who gets which message, when it comes back, when the
    cursor moves. Deterministic for a given event sequence and ``rng``. Key-shared is the
    subclass :class:`~danube.dispatcher.keyed.KeySharedMachine`."""

    served_types: tuple[DeliveryType, ...] = ("exclusive", "shared", "failover")

    def __init__(
        self,
        delivery_type: DeliveryType,
        cursors: Mapping[str, PartitionCursor],
        settings: DeliverySettings | None = None,
        *,
        rng: Callable[[], float] = random.random,
    ) -> None:
        if delivery_type not in self.served_types:
            raise DispatcherError(
                f"unsupported subscription type {delivery_type!r}",
                code="unsupported_subscription_type",
                kind=ErrorKind.INVALID,
            )
        if not cursors:
            raise ValueError("a subscription reads at least one partition")
        self.delivery_type: DeliveryType = delivery_type
        self.settings = settings or DeliverySettings()
        # Applied to the payload of a message scheduled for a later redelivery: the runtime
        # hands in frames that view a whole fetch reply, and one message held back for long
        # must not keep its whole reply alive (it keeps a copy of its own frame instead).
        self.detach_payload: Callable[[object], object] = _same
        self._rng = rng
        self._partitions = {name: PartitionQueue(cursor) for name, cursor in cursors.items()}
        self._order = list(self._partitions)
        self._next_partition = 0  # round-robin over partitions for fresh messages
        self._consumers: dict[str, ConsumerWindow] = {}  # in attach order: failover's succession
        self._entries: dict[Ref, Entry] = {}
        self._stamp = 0
        # Ack timeouts, one per delivered batch: (deadline, the batch's stamp, its
        # partitions, its offsets).
        self._deadlines: list[tuple[float, int, list[str], list[int]]] = []
        self._scheduled: list[tuple[float, int, str, int]] = []  # redeliveries not yet due
        self._ready: list[tuple[int, str, int]] = []  # due redeliveries, lowest offset first
        self._over_held = False
        self._blocked = BlockBook()  # poison messages held at their partition's head
        self._detached_slow = slow.DetachedBook()  # detached for their ack timeouts
        self._now_s = 0.0  # the time of the event being handled (polls read it)
        if delivery_type in DELAYING_TYPES:
            self.delayed = DelayedMessages()
        self._early = []  # delayed messages handed early to holding consumers (delaying.py)
        self._early_count = itertools.count()
        self._holders = 0  # attached consumers that hold a delayed message until its time

    def add_partitions(self, cursors: Mapping[str, PartitionCursor]) -> None:
        """Read more partitions (the topic grew): each joins the round robin of fresh
        messages; one read already is left as it is."""
        for name, cursor in cursors.items():
            if name not in self._partitions:
                self._partitions[name] = PartitionQueue(cursor)
                self._order.append(name)

    # --- flushing on demand --------------------------------------------------------------

    def flush_dirty(self, partitions: Iterable[str], now_s: float) -> list[Action]:
        """A write of every dirty cursor among ``partitions`` now, whatever the flush policy
        (the caller wants them durable: acks answered only once stored)."""
        actions: list[Action] = []
        for name in partitions:
            partition = self._partition(name)
            if partition.cursor.dirty:
                self._flush(name, partition, now_s, actions)
        return actions

    # --- events --------------------------------------------------------------------------

    def handle(self, event: Event) -> list[Action]:
        """Apply ``event``; return what the caller must do, in order."""
        actions: list[Action] = []
        match event:
            case ConsumerAttached():
                self._attach(event)
            case ConsumerDetached():
                self._detach(event, actions)
            case MessagesAvailable():
                self._available(event)
            case Poll():
                self._wall_ms = event.wall_ms
                self._poll(event, actions)
            case Ack():
                self._ack(event, actions)
            case Nack():
                self._nack(event, actions)
            case Tick():
                self._wall_ms = event.wall_ms
                self._tick(event.now_s, actions)
            case Seek():
                self._seek(event, actions)
        self._backpressure(actions)
        return actions

    def _attach(self, event: ConsumerAttached) -> None:
        if event.consumer_id in self._consumers:
            raise ConsumerExistsError(
                f"consumer {event.consumer_id!r} is already attached",
                consumer_id=event.consumer_id,
            )
        if self.delivery_type == "exclusive" and self._consumers:
            holder = next(iter(self._consumers))
            raise SubscriptionTakenError(
                f"the exclusive subscription is taken by consumer {holder!r}", holder=holder
            )
        self._detached_slow.forget(event.consumer_id)
        self._consumers[event.consumer_id] = ConsumerWindow(
            event.consumer_id, event.name, holds_delayed=event.holds_delayed
        )
        self._holders += event.holds_delayed

    def _detach(self, event: ConsumerDetached, actions: list[Action]) -> None:
        consumer = self._consumers.get(event.consumer_id)
        if consumer is None:
            return  # detaching twice is not an error: sessions expire and clients retry
        # Taken back at once (no delay): the messages are not at fault, their consumer left.
        # Those an ack timeout already took back just leave its window.
        for entry in sorted(consumer.held.values(), key=lambda e: (e.offset, e.partition)):
            if entry.state == "in_flight":
                self._redeliver(entry, 0.0, event.now_s, actions)
            else:
                self._release(entry)
        del self._consumers[event.consumer_id]
        self._holders -= consumer.holds_delayed
        for name, partition in self._partitions.items():
            if partition.cursor.dirty:
                self._flush(name, partition, event.now_s, actions)

    def _available(self, event: MessagesAvailable) -> None:
        partition = self._partition(event.partition)
        cursor = partition.cursor
        messages = event.messages
        if not messages and event.next_offset is None:
            return
        start = event.from_offset if event.from_offset is not None else messages[0][0]
        if start > cursor.read_position:
            # Offsets between the read position and this read were never read: taking these
            # would skip them. The caller reads from cursor.read_position instead.
            log.debug(
                "ignoring a read of %s from %d: read position is %d",
                event.partition,
                start,
                cursor.read_position,
            )
            return
        # A read is up to thousands of messages: the lookups are made once per read.
        name, entries = event.partition, self._entries
        observe, enqueue, expiry_of = cursor.observe, self._enqueue, self.expiry_of
        delaying = self._file_if_delayed if self.delayed is not None else None
        for offset, payload in messages:
            if observe(offset):
                if delaying is not None and delaying(name, cursor, offset, payload):
                    continue
                expires_ms = expiry_of(payload)
                if expires_ms is not None:
                    self._expiring = True  # ticks sweep from now on
                entry = Entry(name, offset, payload, expires_ms=expires_ms)
                entries[(name, offset)] = entry
                enqueue(partition, entry)
        if event.next_offset is not None:
            cursor.skip_to(event.next_offset)

    def _poll(self, event: Poll, actions: list[Action]) -> None:
        consumer = self._consumer(event.consumer_id)
        consumer.polled_s = self._now_s = event.now_s
        if self.active_consumer not in (None, event.consumer_id):
            return  # a failover standby receives nothing until it becomes active
        self._promote(event.now_s)
        self._release_due(event.wall_ms)
        # One stamp and one ack deadline for the whole batch (its messages leave together
        # and time out together): no heap item per message, which a full collection would
        # walk for the ack timeout's length, and no Message per message.
        stamp = self._new_stamp()
        batch = self._take(consumer, event.max_messages, stamp)
        if batch:
            partitions = [entry.partition for entry in batch]
            offsets = [entry.offset for entry in batch]
            deadline = event.now_s + self.settings.ack_timeout_s
            heapq.heappush(self._deadlines, (deadline, stamp, partitions, offsets))
            payloads = [entry.payload for entry in batch]
            counts = [entry.redelivery_count for entry in batch]
            actions.append(Deliver(consumer.consumer_id, partitions, offsets, payloads, counts))

    def _ack(self, event: Ack, actions: list[Action]) -> None:
        consumer = self._consumer(event.consumer_id)
        ignored: dict[Ref, None] = {}
        counted = len(event.refs)
        # An ack is up to thousands of refs: the lookups are made once per ack.
        entries, partitions = self._entries, self._partitions
        forget, unblock = self._forget, self._blocked.release
        for key in event.refs:
            entry = entries.get(key)
            # Any consumer may ack a delivered message (a late ack after a redelivery to
            # another consumer still means it was processed); a never-delivered one may not.
            if entry is None or entry.state == "fresh":
                partition = partitions.get(key[0])
                # Acking twice is fine (a retried ack): only what was never delivered is told.
                if partition is None or not partition.cursor.is_acked(key[1]):
                    ignored[key] = None
                counted -= 1
                continue
            forget(entry)
            unblock(entry.partition, entry.offset)  # an operator's way out
            partitions[entry.partition].cursor.ack(entry.offset)
        if counted:
            slow.acked(consumer)  # it acks: its streak ends, its window grows back
        if ignored:
            actions.append(NotInFlight(event.consumer_id, tuple(ignored)))

    def _nack(self, event: Nack, actions: list[Action]) -> None:
        consumer = self._consumer(event.consumer_id)
        delay_s = max(event.delay_ms, 0) / 1000.0
        for key in event.refs:
            entry = consumer.held.get(key)
            if entry is None:
                continue
            entry.refused_by = consumer.consumer_id  # another consumer first (slow.py)
            if entry.state == "in_flight":
                self._redeliver(entry, delay_s, event.now_s, actions)
            else:
                self._release(entry)  # already coming back: it only leaves the window

    def _tick(self, now_s: float, actions: list[Action]) -> None:
        deadlines, entries = self._deadlines, self._entries
        if not entries:  # what the time heaps hold belongs to entries gone: nothing to walk
            deadlines.clear()
            self._scheduled.clear()
        struck: list[ConsumerWindow] = []
        while deadlines and deadlines[0][0] <= now_s:
            _, stamp, names, offsets = heapq.heappop(deadlines)
            holder: ConsumerWindow | None = None
            for name, offset in zip(names, offsets, strict=True):
                entry = entries.get((name, offset))
                # Acked, or sent again since (a new stamp): not this deadline's any more.
                if entry is None or entry.stamp != stamp or entry.state != "in_flight":
                    continue
                if holder is None and entry.consumer_id is not None:
                    holder = self._consumers[entry.consumer_id]
                entry.refused_by = entry.consumer_id  # another consumer first (slow.py)
                delay_s = self.settings.delay_s(entry.redelivery_count, self._rng)
                # Still the consumer's (it may still work on it): counted in its window
                # until it is delivered again, so one that never acks is never given more.
                self._redeliver(entry, delay_s, now_s, actions, keep_window=True)
            if holder is not None and slow.strike(self.settings, holder, stamp, self._stamp):
                struck.append(holder)
        for consumer in struck:
            self._detach_if_slow(consumer, now_s, actions)
        self._promote(now_s)
        self._release_due(self._wall_ms)
        self._sweep_expired()
        for name, partition in self._partitions.items():
            if partition.cursor.should_flush(now_s):
                self._flush(name, partition, now_s, actions)

    def _seek(self, event: Seek, actions: list[Action]) -> None:
        for name, offset in event.offsets.items():
            partition = self._partition(name)
            for key in [k for k in self._entries if k[0] == name]:
                entry = self._entries[key]
                self._forget(entry)
                entry.stamp = -1  # heap items of a dropped entry must never match again
            partition.fresh.clear()
            if self.delayed is not None:
                self.delayed.drop_partition(name)  # read again from the new offset
            self._blocked.clear(name)
            partition.cursor.reset(offset)
            actions.append(ReadFrom(name, offset))
            self._flush(name, partition, event.now_s, actions)

    # --- transitions ---------------------------------------------------------------------

    def _send(self, entry: Entry, consumer: ConsumerWindow, stamp: int) -> Entry:
        """``entry`` in flight to ``consumer`` with its batch's ``stamp`` (whose one ack
        deadline :meth:`_poll` sets)."""
        if entry.consumer_id != consumer.consumer_id:
            self._release(entry)  # leaves the window of the consumer an ack timeout took it from
        entry.state = "in_flight"
        entry.consumer_id = consumer.consumer_id
        entry.stamp = stamp
        consumer.held[(entry.partition, entry.offset)] = entry
        return entry

    def _enqueue(self, partition: PartitionQueue, entry: Entry) -> None:
        partition.fresh.append(entry)

    def _forget(self, entry: Entry) -> None:
        """The entry is done with (acked, dead-lettered, dropped by a seek)."""
        self._release(entry)
        del self._entries[(entry.partition, entry.offset)]
        if entry.delayed:
            self._delayed_done(entry)

    def _release(self, entry: Entry) -> None:
        if entry.consumer_id is not None:
            consumer = self._consumers.get(entry.consumer_id)
            if consumer is not None:
                consumer.held.pop((entry.partition, entry.offset), None)
            entry.consumer_id = None

    def _redeliver(
        self,
        entry: Entry,
        delay_s: float,
        now_s: float,
        actions: list[Action],
        *,
        keep_window: bool = False,
    ) -> None:
        """Take a delivered message back: count it, then dead-letter or schedule it. With
        ``keep_window`` it stays in its consumer's window until delivered again."""
        if not keep_window:
            self._release(entry)
        entry.redelivery_count += 1
        entry.stamp = self._new_stamp()
        if entry.redelivery_count > self.settings.max_redeliveries:
            self._poison(entry, actions)
        elif delay_s <= 0:
            self._make_ready(entry)
        else:
            entry.state = "scheduled"
            entry.payload = self.detach_payload(entry.payload)
            due = now_s + delay_s
            heapq.heappush(self._scheduled, (due, entry.stamp, entry.partition, entry.offset))

    def _promote(self, now_s: float) -> None:
        scheduled = self._scheduled
        while scheduled and scheduled[0][0] <= now_s:
            _, stamp, name, offset = heapq.heappop(scheduled)
            entry = self._entries.get((name, offset))
            if entry is None or entry.stamp != stamp or entry.state != "scheduled":
                continue
            self._make_ready(entry)

    def _make_ready(self, entry: Entry) -> None:
        entry.state = "ready"
        item = (entry.offset, entry.partition, entry.stamp)
        heapq.heappush(self._ready, item)
        holder = None if entry.consumer_id is None else self._consumers.get(entry.consumer_id)
        if holder is not None:
            heapq.heappush(holder.ready, item)

    def _flush(
        self, name: str, partition: PartitionQueue, now_s: float, actions: list[Action]
    ) -> None:
        cursor = partition.cursor
        state = self._stored_state(name, cursor)
        cursor.mark_flushed(now_s)
        actions.append(FlushCursor(name, state, cursor.flush_seq))

    def _backpressure(self, actions: list[Action]) -> None:
        held, high = len(self._entries), self.settings.max_held
        if not self._over_held and held >= high:
            self._over_held = True
        elif self._over_held and held <= high // 2:
            self._over_held = False
        for name, partition in self._partitions.items():
            # Too many acks beyond the contiguous point would not fit a stored cursor: stop
            # reading until the stuck message is acked or dead-lettered.
            cursor = partition.cursor
            beyond_max = cursor.policy.max_acked_beyond
            pause = self._over_held or 0 < beyond_max <= cursor.acked_beyond_count
            if pause != partition.paused:
                partition.paused = pause
                actions.append(PauseReading(name) if pause else ResumeReading(name))

    # --- helpers -------------------------------------------------------------------------

    def _new_stamp(self) -> int:
        self._stamp += 1
        return self._stamp

    def _consumer(self, consumer_id: str) -> ConsumerWindow:
        consumer = self._consumers.get(consumer_id)
        if consumer is None:
            reason = self._detached_slow.reason(consumer_id)
            if reason is not None:
                raise ConsumerDetachedError(
                    f"consumer {consumer_id!r} was {reason}",
                    consumer_id=consumer_id,
                    reason=reason,
                )
            raise ConsumerNotFoundError(
                f"consumer {consumer_id!r} is not attached", consumer_id=consumer_id
            )
        return consumer

    def _partition(self, name: str) -> PartitionQueue:
        partition = self._partitions.get(name)
        if partition is None:
            raise UnknownPartitionError(f"the subscription does not read {name!r}", partition=name)
        return partition


def _same(payload: object) -> object:
    return payload

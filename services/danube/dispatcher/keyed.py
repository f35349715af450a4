"""Key-shared delivery: :class:`SubscriptionMachine` with keyed messages routed by
:mod:`danube.dispatcher.keyshared` (docs/dispatcher.md, "Key-shared").

A keyed message does not wait in its partition's fresh queue nor in the ready heaps: it is
filed under its key (the key's held messages, in offset order) and the key is listed as
waiting under its owner while one of them is fresh or ready. A poll walks its consumer's
waiting keys and hands out what :func:`~danube.dispatcher.keyshared.deliverable` allows.
A consumer joining or leaving re-computes the owner of every key held (consistent hashing
moves only the arcs that changed). Messages without a key go as in shared.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping

from danube.dispatcher import slow
from danube.dispatcher.cursor import PartitionCursor
from danube.dispatcher.delivery import DeliveryType, SubscriptionMachine
from danube.dispatcher.entries import ConsumerWindow, Entry, PartitionQueue, Ref
from danube.dispatcher.events import Action, ConsumerAttached, ConsumerDetached
from danube.dispatcher.keyshared import (
    POINTS_PER_CONSUMER,
    HashRing,
    KeyFilter,
    deliverable,
)
from danube.dispatcher.redelivery import DeliverySettings
from danube.frame import FrameError, RawFrame, decode_record_fields

_PENDING = ("fresh", "ready")


class KeySharedMachine(SubscriptionMachine):
    """The delivery of a key-shared subscription; ``key_of`` reads a payload's key (``None``:
    no key)."""

    served_types = ("key_shared",)

    def __init__(
        self,
        cursors: Mapping[str, PartitionCursor],
        settings: DeliverySettings | None = None,
        *,
        key_of: Callable[[object], str | None],
        rng: Callable[[], float] = random.random,
        points_per_consumer: int = POINTS_PER_CONSUMER,
    ) -> None:
        super().__init__("key_shared", cursors, settings, rng=rng)
        self._key_of = key_of
        self._ring = HashRing(points_per_consumer)
        self._keyed: dict[str, dict[Ref, Entry]] = {}  # held messages by key, offset order
        self._owner: dict[str, str | None] = {}  # of each key held; None: no filter matches
        self._waiting: dict[str | None, dict[str, None]] = {}  # by owner: keys with pending

    # --- inspection ----------------------------------------------------------------------

    def owner(self, key: str) -> str | None:
        """The consumer ``key`` goes to now (``None``: no consumer's filter matches it)."""
        return self._owner[key] if key in self._owner else self._ring.owner(key)

    def unmatched_count(self) -> int:
        """Keyed messages held that no consumer's filters match (they wait)."""
        return sum(len(self._keyed[k]) for k in self._waiting.get(None, {}))

    def validate(self) -> None:
        """The base invariants, and: every keyed entry is filed under its key, no key is in
        flight to two consumers, owners are the ring's."""
        super().validate()
        filed = 0
        for key, entries in self._keyed.items():
            assert entries, f"key {key!r} filed with no entries"
            assert self._owner[key] == self._ring.owner(key), f"stale owner of {key!r}"
            holders = {e.consumer_id for e in entries.values() if e.state == "in_flight"}
            assert len(holders) <= 1, f"key {key!r} in flight to {holders}"
            for ref, entry in entries.items():
                assert self._entries.get(ref) is entry, f"{ref} filed but not held"
                assert entry.key == key, f"{ref} filed under {key!r}, its key is {entry.key!r}"
            filed += len(entries)
            pending = any(e.state in _PENDING for e in entries.values())
            if pending:
                assert key in self._waiting.get(self._owner[key], {}), f"{key!r} not waiting"
        assert filed == sum(1 for e in self._entries.values() if e.key is not None)

    # --- hooks of the base machine -------------------------------------------------------

    def _attach(self, event: ConsumerAttached) -> None:
        key_filter = KeyFilter(event.key_filters)  # ValueError before anything changes
        super()._attach(event)
        self._ring.join(event.consumer_id, key_filter)
        self._reroute()

    def _detach(self, event: ConsumerDetached, actions: list[Action]) -> None:
        # Its in-flight messages come back ready (filed as waiting under their old owner,
        # re-filed just below): the keys' new owners take them first, in offset order.
        super()._detach(event, actions)
        self._ring.leave(event.consumer_id)
        self._reroute()

    def _enqueue(self, partition: PartitionQueue, entry: Entry) -> None:
        key = self._key_of(entry.payload)
        if key is None:
            super()._enqueue(partition, entry)
            return
        entry.key = key
        self._keyed.setdefault(key, {})[(entry.partition, entry.offset)] = entry
        self._wait(key)

    def _make_ready(self, entry: Entry) -> None:
        if entry.key is None:
            super()._make_ready(entry)
            return
        entry.state = "ready"
        self._wait(entry.key)

    def _forget(self, entry: Entry) -> None:
        super()._forget(entry)
        key = entry.key
        if key is None:
            return
        entries = self._keyed[key]
        del entries[(entry.partition, entry.offset)]
        if not entries:
            del self._keyed[key]
            self._waiting.get(self._owner.pop(key), {}).pop(key, None)

    def _take(self, consumer: ConsumerWindow, wanted: int, stamp: int) -> list[Entry]:
        batch: list[Entry] = []
        keys = self._waiting.get(consumer.consumer_id)
        window = slow.window(self.settings, consumer)  # shrunk while its messages time out
        cleared: list[str] = []
        for key in keys or ():
            if len(batch) >= wanted:
                break
            entries = list(self._keyed[key].values())
            for entry in deliverable(entries, consumer.consumer_id):
                if self._expire(entry):
                    continue
                # One taken back from this consumer by an ack timeout is in its window already.
                full = entry.consumer_id != consumer.consumer_id and len(consumer.held) >= window
                if len(batch) >= wanted or full:
                    break
                batch.append(self._send(entry, consumer, stamp))
            if not any(e.state in _PENDING for e in entries):
                cleared.append(key)
        for key in cleared:  # an expired key's last message took it off already
            self._waiting[consumer.consumer_id].pop(key, None)
        # Then messages without a key, as in shared.
        return batch + super()._take(consumer, wanted - len(batch), stamp)

    # --- routing -------------------------------------------------------------------------

    def _wait(self, key: str) -> None:
        owner = self._owner.get(key)
        if key not in self._owner:
            owner = self._owner[key] = self._ring.owner(key)
        self._waiting.setdefault(owner, {})[key] = None

    def _reroute(self) -> None:
        """Every held key's owner again, after the ring changed."""
        self._owner = {key: self._ring.owner(key) for key in self._keyed}
        self._waiting = {}
        for key, entries in self._keyed.items():
            if any(e.state in _PENDING for e in entries.values()):
                self._waiting.setdefault(self._owner[key], {})[key] = None


def record_key(payload: object) -> str | None:
    """The key of a record as the runtime hands it to the machine (its frame as read, or the
    record bytes); ``None`` for a record without a key, or one that does not decode (it is
    delivered as keyless: the consumer's own check of the frame reports it)."""
    if isinstance(payload, RawFrame):
        payload = payload.record
    if not isinstance(payload, bytes | bytearray | memoryview):
        return None
    try:
        return decode_record_fields(payload, decompress=False).key
    except FrameError:
        return None


def new_machine(
    delivery_type: DeliveryType,
    cursors: Mapping[str, PartitionCursor],
    settings: DeliverySettings | None = None,
) -> SubscriptionMachine:
    """The machine of a subscription of ``delivery_type`` (key-shared reads record keys)."""
    if delivery_type == "key_shared":
        return KeySharedMachine(cursors, settings, key_of=record_key)
    return SubscriptionMachine(delivery_type, cursors, settings)

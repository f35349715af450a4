"""What a subscription machine can be asked without changing it: its consumers, their
windows, its cursors, and :meth:`~MachineInspection.validate`, the invariants of its data
structures (docs/dispatcher.md). No I/O.

danube.dispatcher.delivery.SubscriptionMachine mixes it in; the state it reads is the
machine's.
"""

from __future__ import annotations

from danube.dispatcher import slow
from danube.dispatcher.cursor import CursorState, PartitionCursor
from danube.dispatcher.delayed import DelayedMessages
from danube.dispatcher.entries import ConsumerWindow, Entry, PartitionQueue, Ref
from danube.dispatcher.poison import BlockBook
from danube.dispatcher.redelivery import DeliverySettings


class MachineInspection:
    """The read-only share of the subscription machine (danube.dispatcher.delivery mixes it
    in; its state and the lookups it uses are the machine's)."""

    delivery_type: str
    settings: DeliverySettings
    _consumers: dict[str, ConsumerWindow]
    _entries: dict[Ref, Entry]
    _partitions: dict[str, PartitionQueue]
    _blocked: BlockBook
    _detached_slow: slow.DetachedBook
    delayed: DelayedMessages | None

    # The machine's own lookups (danube.dispatcher.delivery.SubscriptionMachine).
    def _consumer(self, consumer_id: str) -> ConsumerWindow:
        raise NotImplementedError

    def _partition(self, name: str) -> PartitionQueue:
        raise NotImplementedError

    def _stored_state(self, name: str, cursor: PartitionCursor) -> CursorState:
        raise NotImplementedError

    @property
    def consumers(self) -> list[str]:
        """Attached consumer ids, in attach order."""
        return list(self._consumers)

    @property
    def active_consumer(self) -> str | None:
        """The consumer that receives (exclusive, failover); ``None`` for (key) shared."""
        if self.delivery_type in ("shared", "key_shared") or not self._consumers:
            return None
        return next(iter(self._consumers))

    @property
    def held_count(self) -> int:
        """Messages held in memory: buffered, in flight and awaiting redelivery."""
        return len(self._entries)

    def consumer_details(self) -> list[tuple[str, str, int]]:
        """``(consumer id, name, unacked count)`` of each attached consumer, in attach order."""
        return [(c.consumer_id, c.name, len(c.held)) for c in self._consumers.values()]

    def unacked(self, consumer_id: str) -> list[tuple[str, int]]:
        """The ``(partition, offset)`` a consumer was given and did not ack (its window:
        those an ack timeout took back and not yet delivered again included), in delivery
        order."""
        return list(self._consumer(consumer_id).held)

    def in_flight(self, consumer_id: str) -> list[tuple[str, int]]:
        """Of :meth:`unacked`, those in flight (no ack timeout took them back)."""
        held = self._consumer(consumer_id).held
        return [key for key, entry in held.items() if entry.state == "in_flight"]

    def cursor(self, partition: str) -> PartitionCursor:
        """The cursor of ``partition``."""
        return self._partition(partition).cursor

    def cursor_states(self) -> dict[str, CursorState]:
        """Every partition's cursor as it would be stored (for a final write on shutdown)."""
        return {name: self._stored_state(name, p.cursor) for name, p in self._partitions.items()}

    def quiet(self) -> bool:
        """Whether a Tick has nothing to do but look: no message held (so no ack deadline or
        redelivery can fall due) and no cursor waiting to be written. Delayed messages filed
        fall due at a time the caller asks for (``next_due_ms``), not at a tick."""
        return not self._entries and not any(p.cursor.dirty for p in self._partitions.values())

    def validate(self) -> None:
        """Check the invariants of the data structures (tests call it after every event);
        AssertionError naming the first one broken."""
        window = self.settings.max_unacked_per_consumer
        for consumer in self._consumers.values():
            assert len(consumer.held) <= window, f"{consumer.consumer_id} holds over {window}"
            assert self._detached_slow.reason(consumer.consumer_id) is None, "detached, attached"
            for key, entry in consumer.held.items():
                assert self._entries.get(key) is entry, f"{key} held but not an entry"
                assert entry.consumer_id == consumer.consumer_id, f"{key} held by two"
        for key in self._blocked.held():
            assert self._entries[key].state == "blocked", f"{key} held but not blocked"
        for key, entry in self._entries.items():
            assert key == (entry.partition, entry.offset), f"{key} filed as {entry}"
            if entry.state == "blocked":
                assert entry.consumer_id is None, f"{key} blocked in a window"
                keyed = entry.key is not None  # a keyed one holds back its key only
                assert keyed or not self._blocked.passable(*key), f"{key} blocked, not held"
            if entry.state == "fresh" or entry.consumer_id is None:
                assert entry.state != "in_flight", f"{key} in flight to nobody"
                continue
            holder = self._consumers.get(entry.consumer_id)
            assert holder is not None, f"{key} counted for a detached consumer"
            assert holder.held.get(key) is entry, f"{key} not in its consumer's window"

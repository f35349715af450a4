"""Poison messages held at the head of their partition (failure policy ``block``): no I/O.

A message refused more than ``max_redeliveries`` times under ``poison_policy: block`` is not
delivered again and not acked: it stays held by the subscription, and its partition is
*blocked* at the lowest such offset. Nothing at or past that offset in the partition is
delivered any more (fresh messages, and redeliveries of messages past it that were in
flight when it blocked); offsets below it still are (redeliveries of earlier messages).
Under key-shared, a poison message with a key is not filed here: it blocks only its key
(danube.dispatcher.keyshared.deliverable stops at it). A partition unblocks when its held
poison messages are acked (by any consumer of the subscription), skipped or sought past by
an operator (their entries are dropped), or judged again under a changed policy (a higher
``max_redeliveries`` delivers them again; ``drop`` or ``dead_letter`` disposes of them).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Literal

from danube.dispatcher.entries import Entry, PartitionQueue, Ref
from danube.dispatcher.events import Action, DeadLetter
from danube.dispatcher.redelivery import DeliverySettings


class BlockBook:
    """The poison messages held, by partition (their offsets)."""

    def __init__(self) -> None:
        self._held: dict[str, set[int]] = {}

    def block(self, partition: str, offset: int) -> None:
        """Hold ``offset`` of ``partition`` at the head."""
        self._held.setdefault(partition, set()).add(offset)

    def release(self, partition: str, offset: int) -> bool:
        """Forget ``offset`` (acked, dropped, judged again); whether it was held."""
        held = self._held.get(partition)
        if held is None or offset not in held:
            return False
        held.discard(offset)
        if not held:
            del self._held[partition]
        return True

    def clear(self, partition: str) -> list[int]:
        """Forget every offset held of ``partition`` (a seek or skip); the offsets."""
        return sorted(self._held.pop(partition, ()))

    def boundary(self, partition: str) -> int | None:
        """The offset ``partition`` is blocked at (its lowest held), ``None`` if it is not."""
        held = self._held.get(partition)
        return None if not held else min(held)

    def passable(self, partition: str, offset: int) -> bool:
        """Whether ``offset`` of ``partition`` may be delivered (it is before the block)."""
        at = self.boundary(partition)
        return at is None or offset < at

    def held(self) -> Iterator[tuple[str, int]]:
        """Every ``(partition, offset)`` held, in partition then offset order."""
        for partition in sorted(self._held):
            for offset in sorted(self._held[partition]):
                yield partition, offset

    def __len__(self) -> int:
        return sum(len(offsets) for offsets in self._held.values())


class PoisonHandling:
    """The failure policy's share of the subscription machine (danube.dispatcher.delivery
    mixes it in; its state and the transitions it uses are the machine's): what becomes
    of a poison message, the blocks it holds, and a policy changed on a live machine."""

    settings: DeliverySettings
    _entries: dict[Ref, Entry]
    _partitions: dict[str, PartitionQueue]
    _blocked: BlockBook

    # The machine's own transitions (danube.dispatcher.delivery.SubscriptionMachine).
    def _release(self, entry: Entry) -> None:
        raise NotImplementedError

    def _forget(self, entry: Entry) -> None:
        raise NotImplementedError

    def _make_ready(self, entry: Entry) -> None:
        raise NotImplementedError

    def _new_stamp(self) -> int:
        raise NotImplementedError

    def _backpressure(self, actions: list[Action]) -> None:
        raise NotImplementedError

    def blocked(self) -> dict[str, tuple[int, int]]:
        """By partition, ``(offset, redelivery count)`` of its lowest poison message held
        (failure policy ``block``): it blocks the partition, or under key-shared its key."""
        found: dict[str, tuple[int, int]] = {}
        for entry in self._entries.values():
            if entry.state == "blocked":
                lowest = found.get(entry.partition)
                if lowest is None or entry.offset < lowest[0]:
                    found[entry.partition] = (entry.offset, entry.redelivery_count)
        return found

    def blocked_at(self, partition: str) -> tuple[int, int] | None:
        """:meth:`blocked` of one partition."""
        return self.blocked().get(partition)

    def _poison(self, entry: Entry, actions: list[Action]) -> None:
        """Dispose of a message refused more than ``max_redeliveries`` times by the
        failure policy: hold it at its partition's head (a keyed one of a key-shared
        subscription: at its key's, keyshared.deliverable), or move the cursor past it and
        have it dead-lettered or dropped."""
        self._release(entry)
        if self.settings.poison_policy == "block":
            entry.state = "blocked"
            if entry.key is None:
                self._blocked.block(entry.partition, entry.offset)
            return
        self._forget(entry)
        self._partitions[entry.partition].cursor.ack(entry.offset)
        dispose: Literal["dead_letter", "drop"] = (
            "drop" if self.settings.poison_policy == "drop" else "dead_letter"
        )
        actions.append(DeadLetter(entry.message(), dispose=dispose))

    def apply_settings(self, settings: DeliverySettings) -> list[Action]:
        """Take new limits (a failure policy changed) from now on: later deliveries and
        ack timeouts use them (deadlines already set stay). Poison messages held under
        ``block`` are judged again: delivered once more when the new maximum allows it,
        disposed of when the new policy no longer blocks."""
        self.settings = settings
        actions: list[Action] = []
        for entry in [e for e in self._entries.values() if e.state == "blocked"]:
            if entry.redelivery_count <= settings.max_redeliveries:
                self._blocked.release(entry.partition, entry.offset)
                entry.stamp = self._new_stamp()
                self._make_ready(entry)
            elif settings.poison_policy != "block":
                self._blocked.release(entry.partition, entry.offset)
                self._poison(entry, actions)
        self._backpressure(actions)
        return actions

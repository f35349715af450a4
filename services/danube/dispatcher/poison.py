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

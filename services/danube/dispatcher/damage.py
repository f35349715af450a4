"""Ranges no copy holds intact, per subscription: what blocks which partition, what a poll
answers, and where an operator's skip goes. Pure, no I/O: the reader reports, the runtime
asks.

A partition reader that finds no intact copy of a range (:mod:`danube.dispatcher.tiers`)
reports it here and stops that partition there; it keeps asking both tiers (a range can be
repaired: an object re-uploaded, a leader change to an intact replica), and clears the
report once a read gets past it. Reported once per range: one log line and one count, not
one per retry.

A poll with nothing to deliver while a partition is blocked answers
:class:`DataDamagedError` naming the partition, the range and the files, so a consumer is
never left with empty polls and no reason. ``danube admin subscriptions skip`` moves the
partition's cursor past the range on purpose (:func:`skip_target`).
"""

from __future__ import annotations

from danube.dispatcher.tiers import Damage
from danube.wire.dispatcher.errors import DataDamagedError
from danube.wire.dispatcher.protocol import BadRequestError


class DamageBook:
    """The blocking damage of each partition of one subscription."""

    def __init__(self) -> None:
        self._by_partition: dict[str, Damage] = {}

    def report(self, damage: Damage) -> bool:
        """Record ``damage``; True when it is news (log it and count it then)."""
        known = self._by_partition.get(damage.partition)
        self._by_partition[damage.partition] = damage
        return known != damage

    def clear(self, partition: str) -> Damage | None:
        """The partition reads on (repaired, or skipped): forget its damage, if any."""
        return self._by_partition.pop(partition, None)

    def get(self, partition: str) -> Damage | None:
        """The damage blocking ``partition``, if any."""
        return self._by_partition.get(partition)

    def __len__(self) -> int:
        return len(self._by_partition)

    def error(self) -> DataDamagedError | None:
        """What a poll with nothing to deliver answers: the lowest blocked partition's
        damage (others are named in the message), or None when nothing is blocked."""
        if not self._by_partition:
            return None
        ordered = [self._by_partition[p] for p in sorted(self._by_partition)]
        first = ordered[0]
        message = "; ".join(d.describe() for d in ordered)
        return DataDamagedError(
            f"{message}; repair it or skip it (danube admin subscriptions skip)",
            partition=first.partition,
            from_offset=first.from_offset,
            to_offset=first.to_offset,
            files=list(first.files),
        )


def skip_target(
    partition: str, next_offset: int, to_offset: int | None, damage: Damage | None
) -> int:
    """Where a skip of ``partition`` moves its cursor (now at ``next_offset``): to
    ``to_offset`` when given, else past the damage that blocks it. Forward only: going back
    is a seek."""
    if to_offset is None:
        if damage is None:
            raise BadRequestError(
                f"partition {partition} is not stopped at damaged offsets; name the offset "
                "to skip to",
                code="nothing_to_skip",
            )
        to_offset = damage.to_offset
    if to_offset <= next_offset:
        raise BadRequestError(
            f"a skip moves forward only: the cursor of {partition} is at {next_offset}, "
            f"not below {to_offset} (use seek to go back)",
            code="skip_backwards",
        )
    return to_offset

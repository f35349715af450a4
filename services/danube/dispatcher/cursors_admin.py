"""An operator moving a served subscription's cursors: ``seek`` (every partition to a
position) and ``skip`` (one partition forward on purpose, past damage no copy holds
intact). What is held of the partitions moved is dropped; delivery goes on from there.

The subscription's runtime owns one :class:`CursorMoves`, built with what it needs: the
partitions read, the damage book, how a position resolves to offsets, how a move reaches
the machine, and the check that it is still served."""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Mapping

from danube.dispatcher import metrics
from danube.dispatcher.damage import DamageBook, skip_target
from danube.dispatcher.delivery import SubscriptionMachine
from danube.dispatcher.events import Seek
from danube.dispatcher.positions import Resolve
from danube.meta import TopicName
from danube.wire.dispatcher import protocol

log = logging.getLogger(__name__)

Move = Callable[[Seek], Awaitable[object]]
"""Hands a seek to the machine and carries out what it decides."""


class CursorMoves:
    """Seek and skip for one served subscription (``topic``/``sub``): ``partitions`` is the
    runtime's own map of the partitions read (it grows with the topic)."""

    def __init__(
        self,
        topic: TopicName,
        sub: str,
        partitions: Mapping[str, TopicName],
        damage: DamageBook,
        *,
        resolve: Resolve,
        move: Move,
        check_serving: Callable[[], None],
    ) -> None:
        self._topic = topic
        self._where = f"{topic}/{sub}"
        self._partitions = partitions
        self._damage = damage
        self._resolve = resolve
        self._move = move
        self._check_serving = check_serving

    async def seek(self, position: protocol.StartPosition) -> dict[str, int]:
        """Move the cursor of every partition to ``position``, dropping what is held
        (unacked messages included), and write the cursors at once; the offsets it
        resolved to."""
        partitions = self._partitions
        names = list(partitions)
        offsets = await self._resolve([partitions[n] for n in names], position)
        self._check_serving()  # a delete may have begun while ingest answered
        resolved = dict(zip(names, offsets, strict=True))
        await self._move(Seek(resolved, time.monotonic()))
        log.info("seek of %s to %s: %s", self._where, position, resolved)
        return resolved

    async def skip(
        self, machine: SubscriptionMachine, name: str, to_offset: int | None
    ) -> protocol.SkipReply:
        """Move partition ``name``'s cursor forward on purpose (to ``to_offset``, or past
        the damage stopping it: damage.skip_target, or past the poison message blocking it
        when it is at the cursor); what is held of it is dropped."""
        partition = self._partitions.get(name)
        if partition is None:
            raise protocol.BadRequestError(f"no partition {name!r} in {self._topic}")
        before = machine.cursor(name).next_offset
        damage = self._damage.get(str(partition))
        blocked = machine.blocked_at(name)
        if to_offset is None and damage is None and blocked is not None and blocked[0] == before:
            to_offset = before + 1  # past the poison message at the head (failure policy block)
        target = skip_target(str(partition), before, to_offset, damage)
        await self._resolve([partition], {"offset": target})  # refused past the end
        self._check_serving()
        await self._move(Seek({name: target}, time.monotonic()))
        if self._damage.clear(str(partition)) is not None:
            metrics.DAMAGED_PARTITIONS.dec()
        metrics.SKIPPED_OFFSETS.inc(target - before)
        log.warning("%s: skipped %s %d..%d", self._where, partition, before, target - 1)
        return protocol.SkipReply(partition=name, from_offset=before, to_offset=target)

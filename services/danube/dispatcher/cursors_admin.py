"""An operator moving a served subscription's cursors: ``seek`` (every partition to a
position) and ``skip`` (one partition forward on purpose, past damage no copy holds
intact). What is held of the partitions moved is dropped; delivery goes on from there."""

from __future__ import annotations

import logging
import time
from typing import Protocol

from danube.dispatcher import metrics
from danube.dispatcher.damage import DamageBook, skip_target
from danube.dispatcher.delivery import SubscriptionMachine
from danube.dispatcher.events import Action, Event, Seek
from danube.dispatcher.positions import resolve_all
from danube.dispatcher.store import SubscriptionStore
from danube.meta import TopicName
from danube.wire.cloud.client import CloudClient
from danube.wire.dispatcher import protocol
from danube.wire.ingest.client import IngestClient

log = logging.getLogger(__name__)


class Served(Protocol):
    """What of a served subscription (danube.dispatcher.runtime) seek and skip use."""

    store: SubscriptionStore
    ingest: IngestClient
    cloud: CloudClient
    damage: DamageBook

    @property
    def partitions(self) -> dict[str, TopicName]:
        """Its partitions by short name."""
        ...

    def check_serving(self) -> None:
        """NotOwnerError once it is being deleted or stopped."""
        ...

    def subscription(self) -> SubscriptionMachine:
        """Its state machine (SubscriptionNotFoundError before the first attach)."""
        ...

    async def handle(self, event: Event) -> list[Action]:
        """Feed ``event`` to the machine and carry out what it decides."""
        ...


async def seek(served: Served, position: protocol.StartPosition) -> dict[str, int]:
    """Move the cursor of every partition to ``position``, dropping what is held (unacked
    messages included), and write the cursors at once; the offsets it resolved to."""
    served.check_serving()
    served.subscription()
    partitions = served.partitions
    names = list(partitions)
    offsets = await resolve_all(
        served.ingest, served.cloud, [partitions[n] for n in names], position
    )
    served.check_serving()  # a delete may have begun while ingest answered
    resolved = dict(zip(names, offsets, strict=True))
    await served.handle(Seek(resolved, time.monotonic()))
    where = f"{served.store.topic}/{served.store.sub}"
    log.info("seek of %s to %s: %s", where, position, resolved)
    return resolved


async def skip(served: Served, name: str, to_offset: int | None) -> protocol.SkipReply:
    """Move partition ``name``'s cursor forward on purpose (to ``to_offset``, or past the
    damage stopping it: damage.skip_target, or past the poison message blocking it when it
    is at the cursor); what is held of it is dropped."""
    served.check_serving()
    machine = served.subscription()
    partition = served.partitions.get(name)
    if partition is None:
        raise protocol.BadRequestError(f"no partition {name!r} in {served.store.topic}")
    before = machine.cursor(name).next_offset
    damage = served.damage.get(str(partition))
    blocked = machine.blocked_at(name)
    if to_offset is None and damage is None and blocked is not None and blocked[0] == before:
        to_offset = before + 1  # past the poison message at the head (failure policy block)
    target = skip_target(str(partition), before, to_offset, damage)
    await resolve_all(served.ingest, served.cloud, [partition], {"offset": target})  # <= end
    served.check_serving()
    await served.handle(Seek({name: target}, time.monotonic()))
    if served.damage.clear(str(partition)) is not None:
        metrics.DAMAGED_PARTITIONS.dec()
    metrics.SKIPPED_OFFSETS.inc(target - before)
    where = f"{served.store.topic}/{served.store.sub}"
    log.warning("%s: skipped %s %d..%d", where, partition, before, target - 1)
    return protocol.SkipReply(partition=name, from_offset=before, to_offset=target)

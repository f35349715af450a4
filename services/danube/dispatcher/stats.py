"""A served subscription's live state, as ``stats`` answers it: cursors, the WAL's ends and
the backlog per partition (danube.dispatcher.backlog), damage that stops a partition, and
the consumers with what they hold."""

from __future__ import annotations

import asyncio

from danube.bus import BusError
from danube.dispatcher.backlog import partition_stats
from danube.dispatcher.damage import DamageBook
from danube.dispatcher.delivery import SubscriptionMachine
from danube.meta import TopicName
from danube.wire.dispatcher import protocol
from danube.wire.ingest.client import IngestClient, WalOffsets

# Stats ask each partition's ingest owner for its WAL ends; a slow one is shown as unknown.
WAL_STATS_TIMEOUT_S = 1.0


async def subscription_stats(
    ingest: IngestClient,
    machine: SubscriptionMachine,
    partitions: dict[str, TopicName],
    damage: DamageBook,
) -> protocol.SubscriptionStats:
    """Cursors, WAL ends, backlog and damage per partition; consumers and what they hold."""
    names = list(partitions)
    poison = machine.blocked()  # poison messages held (failure policy block)
    ends = await asyncio.gather(*(_wal_offsets(ingest, partitions[n]) for n in names))
    lines = []
    for name, wal in zip(names, ends, strict=True):
        line = partition_stats(name, machine.cursor(name), wal)
        found = damage.get(str(partitions[name]))
        if found is not None:
            line = line.model_copy(update={"damaged": found.describe()})
        blocked = poison.get(name)
        if blocked is not None:
            offset, count = blocked
            line = line.model_copy(update={"blocked_offset": offset, "blocked_redeliveries": count})
        lines.append(line)
    consumers = [
        protocol.ConsumerStats(consumer_id=cid, name=name, unacked=unacked)
        for cid, name, unacked in machine.consumer_details()
    ]
    return protocol.SubscriptionStats(
        type=machine.delivery_type, partitions=lines, consumers=consumers
    )


async def _wal_offsets(ingest: IngestClient, partition: TopicName) -> WalOffsets | None:
    try:
        return await ingest.wal_offsets(partition, timeout_s=WAL_STATS_TIMEOUT_S)
    except (BusError, TimeoutError, protocol.BadRequestError):
        return None  # no owner right now, or a slow one: unknown

"""Subscription admin routes (DESIGN §5): list with backlog, delete, seek, skip.

A listing reads etcd (``subscriptions/<ns>/<t>/``: configs, cursors, owners) in one range and
each partition's WAL end from its ingest owner, so it works for subscriptions no dispatcher
serves, without claiming them. For a subscription that has an owner it also asks that
dispatcher for its live state (``stats``, which never claims): consumers, and the cursors as
they are now rather than as last written (cursor writes are batched). No answer (none
serving it after all, or a slow one) falls back to what etcd says, with no consumers.

Delete, seek and skip go to the dispatcher that serves the subscription, claiming it when none
does: both must be fenced on the subscription's owner key (docs/dispatcher.md).
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from fastapi import APIRouter, Response

from danube.discovery.doors.bodies.api import SeekRequest, SkipRequest
from danube.discovery.doors.http.params import Namespace, Subscription, Topic
from danube.discovery.doors.http.state import Services, ServicesDep
from danube.discovery.errors import BadRequestError, NotFoundError
from danube.errors import DanubeError
from danube.meta import KeyValue, TopicName, decode_model
from danube.meta import keys as meta_keys
from danube.meta.records import Owner, SubscriptionConfig, SubscriptionCursor, TopicConfig
from danube.names import user_topic, validate_segment
from danube.wire import codes
from danube.wire.api.catalog import (
    OwnerOut,
    SeekPartitionOut,
    SeekResponse,
    SkipResponse,
    SubscriptionConsumerOut,
    SubscriptionList,
    SubscriptionOut,
    SubscriptionPartitionOut,
)
from danube.wire.consume.ids import consumer_id
from danube.wire.dispatcher import protocol
from danube.wire.dispatcher.client import DispatcherClient
from danube.wire.ingest.client import IngestClient
from danube.wire.limits import backlog, total

router = APIRouter(prefix="/v1", tags=["subscriptions"])

# A listing asks each partition's ingest owner and each serving dispatcher; one that does not
# answer in this time is shown from etcd (unknown end, no consumers) rather than failing all.
STATS_TIMEOUT_S = 1.0
STATS_CONCURRENCY = 32


@dataclass
class StoredSubscription:
    """What etcd holds of one subscription; cursors by partition (its topic segment)."""

    name: str
    config: SubscriptionConfig | None = None
    owner: Owner | None = None
    cursors: dict[str, SubscriptionCursor] = field(default_factory=dict)


def group_records(kvs: Sequence[KeyValue]) -> dict[str, StoredSubscription]:
    """The records of a ``subscriptions/<ns>/<t>/`` range, by subscription name. Only
    subscriptions with a config exist (an owner key alone is a claim of nothing)."""
    found: dict[str, StoredSubscription] = {}
    for kv in kvs:
        _, sub, record = meta_keys.parse_subscription_key(kv.key)
        stored = found.setdefault(sub, StoredSubscription(sub))
        if record == "config":
            stored.config = decode_model(kv, SubscriptionConfig)
        elif record == "owner":
            stored.owner = decode_model(kv, Owner)
        elif record.startswith("cursors/"):
            stored.cursors[record.removeprefix("cursors/")] = decode_model(kv, SubscriptionCursor)
    return {name: s for name, s in sorted(found.items()) if s.config is not None}


def summarize(
    topic: TopicName,
    stored: StoredSubscription,
    partitions: Sequence[TopicName],
    ends: Mapping[TopicName, int | None],
    live: protocol.SubscriptionStats | None,
) -> SubscriptionOut:
    """One subscription as listed: from the dispatcher's live state where it answered,
    else from the stored cursors and the partitions' ends."""
    assert stored.config is not None
    by_partition = {} if live is None else {p.partition: p for p in live.partitions}
    rows = []
    for partition in partitions:
        now = by_partition.get(partition.topic)
        if now is not None:
            row = SubscriptionPartitionOut(
                name=str(partition),
                cursor=now.next_offset,
                acked_beyond=now.acked_beyond,
                end_offset=now.wal_next,
                backlog=now.backlog,
                blocked_offset=now.blocked_offset,
            )
        else:
            cursor = stored.cursors.get(partition.topic)
            end = ends.get(partition)
            row = SubscriptionPartitionOut(
                name=str(partition),
                cursor=None if cursor is None else cursor.next_offset,
                acked_beyond=0 if cursor is None else len(cursor.acked_beyond),
                end_offset=end,
                backlog=None
                if cursor is None
                else backlog(cursor.next_offset, cursor.acked_beyond, end),
            )
        rows.append(row)
    consumers = [] if live is None else live.consumers
    owner = stored.owner
    return SubscriptionOut(
        name=stored.name,
        type=stored.config.type,
        created_ms=stored.config.created_ms,
        owner=None if owner is None else OwnerOut(node_id=owner.node_id, epoch=owner.epoch),
        backlog=total(row.backlog for row in rows),
        partitions=rows,
        consumers=[
            SubscriptionConsumerOut(
                consumer_id=consumer_id(topic, stored.name, c.consumer_id),
                name=c.name,
                unacked=c.unacked,
            )
            for c in consumers
        ],
        failure_policy=stored.config.failure_policy,
        effective_failure_policy=None if live is None else live.failure_policy,
        expired=None if live is None else live.expired,
        delayed=None if live is None else live.delayed,
    )


async def list_subscriptions(
    services: Services,
    topic: TopicName,
    partitions: Sequence[TopicName],
    ends: Mapping[TopicName, int | None] | None = None,
) -> list[SubscriptionOut]:
    """Every subscription of ``topic`` with its backlog; ``ends`` (each partition's next
    durable offset) when the caller already asked ingest for them."""
    stored = group_records(await services.store.range(meta_keys.subscriptions_prefix(topic)))
    if not stored:
        return []
    gate = asyncio.Semaphore(STATS_CONCURRENCY)
    if ends is None:
        ingest = IngestClient(services.bus)
        found = await asyncio.gather(*(_wal_end(ingest, p, gate) for p in partitions))
        ends = dict(zip(partitions, found, strict=True))
    subs = list(stored.values())
    live = await asyncio.gather(*(_live(services.dispatcher, topic, s, gate) for s in subs))
    return [summarize(topic, s, partitions, ends, now) for s, now in zip(subs, live, strict=True)]


async def _wal_end(
    ingest: IngestClient, partition: TopicName, gate: asyncio.Semaphore
) -> int | None:
    async with gate:
        try:
            offsets = await ingest.wal_offsets(partition, timeout_s=STATS_TIMEOUT_S)
        except (DanubeError, TimeoutError):
            return None  # no owner right now, or a slow one: unknown
        return offsets.durable_next


async def _live(
    dispatcher: DispatcherClient,
    topic: TopicName,
    stored: StoredSubscription,
    gate: asyncio.Semaphore,
) -> protocol.SubscriptionStats | None:
    if stored.owner is None:
        return None  # nobody serves it: nothing live to ask for
    async with gate:
        try:
            return await dispatcher.stats(topic, stored.name, timeout_s=STATS_TIMEOUT_S)
        except (DanubeError, TimeoutError):
            return None  # stopping, deleted meanwhile, or slow: what etcd says


async def _existing(services: Services, topic: TopicName, sub: str) -> TopicConfig:
    """The topic's config; NotFoundError unless the topic and the subscription exist."""
    config = await services.catalog.get_topic(topic)
    key = meta_keys.subscription_key(topic, sub)
    if await services.store.get(key) is None:
        raise NotFoundError(
            f"subscription {sub!r} of {topic} does not exist", code=codes.SUBSCRIPTION_NOT_FOUND
        )
    return config


@router.get("/topics/{ns}/{topic}/subscriptions", response_model=SubscriptionList)
async def list_topic_subscriptions(
    ns: Namespace, topic: Topic, services: ServicesDep
) -> SubscriptionList:
    """Every subscription of a topic: type, cursor and backlog per partition, consumers."""
    name = user_topic(ns, topic)
    config = await services.catalog.get_topic(name)
    subs = await list_subscriptions(services, name, name.partitions(config.partitions))
    return SubscriptionList(topic=str(name), subscriptions=subs)


@router.delete("/topics/{ns}/{topic}/subscriptions/{sub}", status_code=204)
async def delete_subscription(
    ns: Namespace, topic: Topic, sub: Subscription, services: ServicesDep
) -> Response:
    """Delete a subscription: its consumers are detached, its config and cursors removed;
    the next attach creates it afresh."""
    name = user_topic(ns, topic)
    validate_segment("subscription", sub)
    await _existing(services, name, sub)
    await services.dispatcher.delete(name, sub)
    return Response(status_code=204)


@router.post("/topics/{ns}/{topic}/subscriptions/{sub}/seek", response_model=SeekResponse)
async def seek_subscription(
    ns: Namespace, topic: Topic, sub: Subscription, body: SeekRequest, services: ServicesDep
) -> SeekResponse:
    """Move the subscription's cursor in every partition to ``position``; messages held
    unacked are dropped, and delivery goes on from there."""
    name = user_topic(ns, topic)
    validate_segment("subscription", sub)
    config = await _existing(services, name, sub)
    position: protocol.StartPosition = (
        body.position if isinstance(body.position, str) else body.position.model_dump()
    )
    offsets = await services.dispatcher.seek(name, sub, position)
    partitions = [
        SeekPartitionOut(name=str(p), offset=offsets[p.topic])
        for p in name.partitions(config.partitions)
        if p.topic in offsets
    ]
    return SeekResponse(partitions=partitions)


@router.post("/topics/{ns}/{topic}/subscriptions/{sub}/skip", response_model=SkipResponse)
async def skip_partition(
    ns: str, topic: str, sub: str, body: SkipRequest, services: ServicesDep
) -> SkipResponse:
    """Move one partition's cursor forward on purpose: to ``to_offset``, or past the range
    no copy holds intact that stops it (docs/http-api.md, "Damaged data")."""
    name = user_topic(ns, topic)
    validate_segment("subscription", sub)
    config = await _existing(services, name, sub)
    partitions = name.partitions(config.partitions)
    index = body.partition or 0
    if index >= len(partitions) or (body.partition is not None and config.partitions == 0):
        raise BadRequestError(f"{name} has no partition {body.partition}", code="invalid_partition")
    partition = partitions[index]
    done = await services.dispatcher.skip(name, sub, partition.topic, body.to_offset)
    return SkipResponse(
        partition=str(partition),
        from_offset=done.from_offset,
        to_offset=done.to_offset,
        skipped=done.to_offset - done.from_offset,
    )

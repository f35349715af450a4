"""Read-only routes the admin console polls (docs/console.md), public like the rest of v1:

- ``GET /v1/topics/{ns}/{topic}/stats``: a topic's counters (next offsets, WAL bytes
  written, subscription backlog) for rates computed by the reader from two answers;
- ``GET /v1/topics/{ns}/{topic}/peek?count=N``: the newest ``N`` messages of the WAL tier,
  read through ``wal.fetch`` like a catching-up dispatcher reads, with no subscription and no
  cursor: nothing is delivered, nothing moves;
- ``GET /v1/console/placement``: partitions per ingest node and replication health, from one
  etcd range read.

Every bus request has the describe route's deadline (1 s), so a silent leader shows as
unknown instead of holding the page.
"""

from __future__ import annotations

import asyncio
import base64
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Annotated, Any

import orjson
from fastapi import APIRouter, Query

from danube.bus import Bus, BusError
from danube.discovery.doors.bodies.console import (
    NodePlacementOut,
    PartitionStatsOut,
    PeekedMessage,
    PeekOut,
    PlacementOut,
    TopicStatsOut,
)
from danube.discovery.doors.http.admin import STATS_CONCURRENCY, STATS_TIMEOUT_S
from danube.discovery.doors.http.params import Namespace, Topic
from danube.discovery.doors.http.state import ServicesDep
from danube.discovery.doors.http.subscriptions import list_subscriptions
from danube.errors import DanubeError
from danube.frame import FrameError, decode_record
from danube.meta import MetaDecodeError, TopicName, decode_model
from danube.meta import keys as meta_keys
from danube.meta.records import Assignment, PartitionState
from danube.names import user_topic
from danube.wire.ingest.client import IngestClient

router = APIRouter(prefix="/v1", tags=["console"])

PEEK_COUNT_MAX = 100
# One partition's peek reads at most this much (the newest messages of a topic of large
# messages come back fewer than asked rather than as a huge answer).
PEEK_BYTES_MAX = 1 << 20
# The placement view reads at most this many partition records (four per partition).
PLACEMENT_KEYS_MAX = 200_000


async def _partition_stats(bus: Bus, name: TopicName, gate: asyncio.Semaphore) -> PartitionStatsOut:
    async with gate:
        try:
            reply = await bus.request(bus.subjects.wal_stats(name), b"", timeout_s=STATS_TIMEOUT_S)
            doc = orjson.loads(reply.body)
            wal = doc["wal"]
            return PartitionStatsOut(
                name=str(name),
                next_offset=int(doc["high_watermark"]),
                wal_start=int(wal["start_offset"]),
                bytes_written=int(wal["bytes_written"]),
                leader=str(doc["node_id"]),
            )
        except (BusError, KeyError, ValueError, TypeError):
            # No leader right now, or a slow one: unknown, not an error of the whole answer.
            return PartitionStatsOut(
                name=str(name), next_offset=None, wal_start=None, bytes_written=None, leader=None
            )


def _sum(values: Iterable[int | None]) -> int | None:
    total = 0
    for value in values:
        if value is None:
            return None
        total += value
    return total


@router.get("/topics/{ns}/{topic}/stats", response_model=TopicStatsOut)
async def topic_stats(ns: Namespace, topic: Topic, services: ServicesDep) -> TopicStatsOut:
    """A topic's counters now: per partition its next offset and the WAL bytes its leader
    wrote; the total backlog of its subscriptions (as ``GET …/subscriptions`` computes it)."""
    name = user_topic(ns, topic)
    config = await services.catalog.get_topic(name)
    names = name.partitions(config.partitions)
    gate = asyncio.Semaphore(STATS_CONCURRENCY)
    parts = await asyncio.gather(*(_partition_stats(services.bus, p, gate) for p in names))
    ends = {p: s.next_offset for p, s in zip(names, parts, strict=True)}
    subs = await list_subscriptions(services, name, names, ends)
    return TopicStatsOut(
        name=str(name),
        time_ms=int(time.time() * 1000),
        partitions=list(parts),
        messages=_sum(s.next_offset for s in parts),
        bytes_written=_sum(s.bytes_written for s in parts),
        backlog=sum(s.backlog or 0 for s in subs),
        subscriptions=len(subs),
    )


def _peeked(partition: TopicName, offset: int, payload: memoryview) -> PeekedMessage:
    record = decode_record(payload)
    try:
        text, encoding = record.payload.decode("utf-8"), "utf8"
    except UnicodeDecodeError:
        text, encoding = base64.b64encode(record.payload).decode("ascii"), "base64"
    return PeekedMessage(
        partition=str(partition),
        offset=offset,
        payload=text,
        encoding=encoding,
        size_bytes=len(record.payload),
        key=record.key,
        attributes=dict(record.attributes),
        publish_time_ms=record.publish_time_ms,
        producer=record.producer,
        schema_id=record.schema_id,
        schema_version=record.schema_version,
    )


async def _peek_partition(
    ingest: IngestClient, partition: TopicName, count: int, gate: asyncio.Semaphore
) -> list[PeekedMessage] | None:
    """The newest ``count`` messages of one partition's WAL (None: no answer, or damaged)."""
    async with gate:
        try:
            ends = await ingest.wal_offsets(partition, timeout_s=STATS_TIMEOUT_S)
            start = max(ends.start_offset, ends.durable_next - count)
            if start >= ends.durable_next:
                return []
            reply = await ingest.fetch(
                partition,
                start,
                max_bytes=PEEK_BYTES_MAX,
                max_count=ends.durable_next - start,
                timeout_s=STATS_TIMEOUT_S,
            )
            if reply.damaged is not None:
                return None
            return [
                _peeked(partition, frame.offset, frame.payload)
                for frame in reply.frames
                if frame.offset < ends.durable_next
            ]
        except (DanubeError, TimeoutError, FrameError):
            return None


@router.get("/topics/{ns}/{topic}/peek", response_model=PeekOut)
async def peek(
    ns: Namespace,
    topic: Topic,
    services: ServicesDep,
    count: Annotated[int, Query(ge=1, le=PEEK_COUNT_MAX)] = 10,
) -> PeekOut:
    """The newest ``count`` messages of a topic still in the WAL tier, newest first (by
    publish time across partitions). Read-only: no subscription, no cursor, no delivery."""
    name = user_topic(ns, topic)
    config = await services.catalog.get_topic(name)
    names = name.partitions(config.partitions)
    ingest = IngestClient(services.bus)
    gate = asyncio.Semaphore(STATS_CONCURRENCY)
    found = await asyncio.gather(*(_peek_partition(ingest, p, count, gate) for p in names))
    messages: list[PeekedMessage] = []
    unavailable: list[str] = []
    for partition, got in zip(names, found, strict=True):
        if got is None:
            unavailable.append(str(partition))
        else:
            messages.extend(got)
    messages.sort(key=lambda m: (m.publish_time_ms, m.offset, m.partition), reverse=True)
    return PeekOut(name=str(name), messages=messages[:count], unavailable=unavailable)


# --- placement ---------------------------------------------------------------------------


@dataclass
class _Partition:
    replicas: tuple[str, ...] = ()
    state: PartitionState | None = None
    has_owner: bool = False


@dataclass
class Placement:
    """Partitions per ingest node, counted from the ``partitions/`` records (pure)."""

    partitions: dict[TopicName, _Partition] = field(default_factory=dict)

    def add(self, partition: TopicName, record: str, value: Any) -> None:
        """Take one record (``assignment``, ``state`` or ``owner``) of ``partition``."""
        entry = self.partitions.setdefault(partition, _Partition())
        if record == "assignment" and isinstance(value, Assignment):
            entry.replicas = value.replicas
        elif record == "state" and isinstance(value, PartitionState):
            entry.state = value
        elif record == "owner":
            entry.has_owner = True

    def out(self, *, truncated: bool) -> PlacementOut:
        """The counts: a partition is under-replicated when its ISR is smaller than its
        replica set, without a leader when it has replicas but no owner key."""
        leaders: dict[str, int] = {}
        replicas: dict[str, int] = {}
        under = without = 0
        placed = [p for p in self.partitions.values() if p.replicas]
        for entry in placed:
            for node in entry.replicas:
                replicas[node] = replicas.get(node, 0) + 1
            if entry.state is not None and entry.has_owner:
                leaders[entry.state.leader] = leaders.get(entry.state.leader, 0) + 1
            if not entry.has_owner:
                without += 1
            if entry.state is None or len(entry.state.isr) < len(entry.replicas):
                under += 1
        nodes = [
            NodePlacementOut(node_id=n, leader_of=leaders.get(n, 0), replica_of=replicas[n])
            for n in sorted(replicas)
        ]
        return PlacementOut(
            partitions=len(placed),
            under_replicated=under,
            without_leader=without,
            nodes=nodes,
            truncated=truncated,
        )


@router.get("/console/placement", response_model=PlacementOut)
async def placement(services: ServicesDep) -> PlacementOut:
    """Partitions per ingest node (leader of, replica of) and how many partitions are short
    of in-sync replicas or without a leader."""
    kvs = await services.store.range(meta_keys.partitions_prefix(), limit=PLACEMENT_KEYS_MAX)
    counted = Placement()
    for kv in kvs:
        try:
            partition, record = meta_keys.parse_partition_key(kv.key)
            value: Any = None
            if record == "assignment":
                value = decode_model(kv, Assignment)
            elif record == "state":
                value = decode_model(kv, PartitionState)
        except (DanubeError, MetaDecodeError):
            continue  # a record of another shape: not counted
        counted.add(partition, record, value)
    return counted.out(truncated=len(kvs) >= PLACEMENT_KEYS_MAX)

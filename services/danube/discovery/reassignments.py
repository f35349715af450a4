"""An operator's reassignments and drains (docs/replication.md, "Moving partitions";
docs/operations.md, "Draining a node"): what the admin routes ask of etcd.

A reassignment is one compare-and-swap of the partition's ``assignment`` record
(:mod:`danube.meta.reassign` builds it); the partition's leader carries it out. A drain is one
key, ``drains/ingest/<node>``, that the controller's balancer acts on and placement honours.
Progress is read from etcd (the record, ``state``) and from each partition's leader
(``wal.stats``: the followers' ends and lag).
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from typing import Any

import orjson

from danube.bus import Bus, BusError
from danube.discovery import metrics
from danube.discovery.errors import BadRequestError, ConflictError, NotFoundError
from danube.discovery.partition_records import read_drained, read_partition_records
from danube.meta import MetaStore, TopicName, encode_model
from danube.meta import keys as meta_keys
from danube.meta.reassign import cancel, check_target, reassign
from danube.meta.records import Assignment, DrainRecord
from danube.meta.topics import live_nodes

log = logging.getLogger(__name__)

# The leader of each partition is asked for its followers' progress; one that does not
# answer in this time shows unknown progress rather than failing the whole answer.
STATS_TIMEOUT_S = 1.0
STATS_CONCURRENCY = 32
# Partitions a listing names at most (then ``truncated``): bounded answers.
LIST_PARTITIONS_MAX = 1000


@dataclass(frozen=True)
class Progress:
    """A replica of a reassignment: in the ISR or not, and its lag behind the leader."""

    node_id: str
    in_isr: bool
    end: int | None = None
    lag: int | None = None


@dataclass(frozen=True)
class Reassignment:
    """One partition's reassignment as etcd and its leader show it now."""

    partition: TopicName
    assignment: Assignment
    leader: str | None
    isr: tuple[str, ...]
    progress: tuple[Progress, ...]  # one per node being added


async def start(
    store: MetaStore,
    partition: TopicName,
    replicas: tuple[str, ...],
    *,
    catchup_bytes_s: int | None,
) -> tuple[Assignment, bool]:
    """Reassign ``partition`` to ``replicas`` (preferred leader first); return the record
    now stored and whether this call changed it. 400 for a target the cluster cannot hold
    (danube.meta.reassign codes), 409 ``not_placed`` for a partition with no replica set yet,
    ``conflict`` when the record changed meanwhile."""
    key = meta_keys.partition_assignment_key(partition)
    found = await store.get_model_kv(key, Assignment)
    if found is None:
        raise ConflictError(
            f"{partition} has no replica set yet (it is placed at its first produce)",
            code="not_placed",
        )
    current, kv = found
    live = await live_nodes(store, "ingest")
    check_target(replicas, live=live, drained=await read_drained(store), factor=len(current.target))
    record = reassign(
        current, replicas, catchup_bytes_s=catchup_bytes_s, now_ms=int(time.time() * 1000)
    )
    if record is current:
        return current, False
    await _swap(store, key, kv.mod_revision, record, partition)
    metrics.REASSIGNMENTS_STARTED.labels(reason="operator").inc()
    log.info("%s: reassignment to %s asked", partition, ", ".join(replicas))
    return record, True


async def stop(store: MetaStore, partition: TopicName) -> Assignment:
    """Cancel the reassignment under way (409 ``not_reassigning`` when there is none):
    the partition goes back to its original set; return the record now stored."""
    key = meta_keys.partition_assignment_key(partition)
    found = await store.get_model_kv(key, Assignment)
    if found is None:
        raise ConflictError(f"{partition} has no replica set yet", code="not_reassigning")
    current, kv = found
    record = cancel(current, now_ms=int(time.time() * 1000))
    await _swap(store, key, kv.mod_revision, record, partition)
    metrics.REASSIGNMENTS_STARTED.labels(reason="cancel").inc()
    log.info("%s: reassignment cancelled, back to %s", partition, ", ".join(record.target))
    return record


async def _swap(
    store: MetaStore, key: str, revision: int, record: Assignment, partition: TopicName
) -> None:
    txn = store.txn().if_mod_revision(key, "==", revision).then_put(key, encode_model(record))
    if not (await txn.commit()).succeeded:
        raise ConflictError(f"the assignment of {partition} changed; ask again", code="conflict")


async def _followers(bus: Bus, partition: TopicName, gate: asyncio.Semaphore) -> dict[str, Any]:
    """The leader's view of its followers (``{node: {end, lag}}``), or {} when it does not
    answer in time."""
    async with gate:
        try:
            reply = await bus.request(
                bus.subjects.wal_stats(partition), b"", timeout_s=STATS_TIMEOUT_S
            )
            followers = orjson.loads(reply.body)["followers"]
        except (BusError, KeyError, ValueError, TypeError):
            return {}
    return followers if isinstance(followers, dict) else {}


def _progress(node: str, isr: tuple[str, ...], followers: dict[str, Any]) -> Progress:
    follower = followers.get(node)
    end = lag = None
    if isinstance(follower, dict):
        end = follower.get("end") if isinstance(follower.get("end"), int) else None
        lag = follower.get("lag") if isinstance(follower.get("lag"), int) else None
    return Progress(node, node in isr, end, lag)


async def under_way(bus: Bus, store: MetaStore) -> tuple[list[Reassignment], bool]:
    """Every partition with a reassignment under way (by name, at most
    :data:`LIST_PARTITIONS_MAX`; the flag says some were left out), with its progress."""
    records = await read_partition_records(store)
    moving = sorted(
        (p for p, r in records.items() if r.assignment is not None and r.assignment.moving),
        key=str,
    )
    truncated = len(moving) > LIST_PARTITIONS_MAX
    moving = moving[:LIST_PARTITIONS_MAX]
    gate = asyncio.Semaphore(STATS_CONCURRENCY)
    stats = await asyncio.gather(*(_followers(bus, p, gate) for p in moving))
    found = []
    for partition, followers in zip(moving, stats, strict=True):
        kept = records[partition]
        assert kept.assignment is not None
        isr = () if kept.state is None else kept.state.isr
        found.append(
            Reassignment(
                partition,
                kept.assignment,
                None if kept.owner is None else kept.owner.node_id,
                isr,
                tuple(_progress(n, isr, followers) for n in kept.assignment.adding),
            )
        )
    return found, truncated


@dataclass(frozen=True)
class DrainStatus:
    """A node's drain: asked when (None: not drained), the partitions it still holds a
    replica of, and those of them leaving it now."""

    node_id: str
    requested_ms: int | None
    replicas: tuple[TopicName, ...]
    leaving: tuple[TopicName, ...]

    @property
    def done(self) -> bool:
        """Drained and holding nothing."""
        return self.requested_ms is not None and not self.replicas


async def drain(store: MetaStore, node_id: str) -> tuple[DrainRecord, bool]:
    """Drain ``node_id``: the balancer moves every replica off it, placement skips it.
    400 ``node_not_live`` for a node that is neither live nor holds a replica (a dead node
    holding replicas may be drained: its replicas are copied from their leaders). Returns
    the record and whether this call wrote it (draining twice changes nothing)."""
    meta_keys.validate_node_id(node_id)
    key = meta_keys.drain_key("ingest", node_id)
    existing = await store.get_model(key, DrainRecord)
    if existing is not None:
        return existing, False
    if node_id not in await live_nodes(store, "ingest"):
        held = await status(store, node_id)
        if not held.replicas:
            raise BadRequestError(
                f"{node_id} is not a live ingest node and holds no replica", code="node_not_live"
            )
    record = DrainRecord(node_id=node_id, requested_ms=int(time.time() * 1000))
    if not await store.create_model(key, record):
        again = await store.get_model(key, DrainRecord)
        return (record, False) if again is None else (again, False)
    log.warning("ingest node %s drained by an operator", node_id)
    return record, True


async def undrain(store: MetaStore, node_id: str) -> None:
    """Lift a drain (404 ``not_drained`` when there is none); moves under way go on."""
    meta_keys.validate_node_id(node_id)
    if not await store.delete(meta_keys.drain_key("ingest", node_id)):
        raise NotFoundError(f"{node_id} is not drained", code="not_drained")
    log.warning("ingest node %s undrained by an operator", node_id)


async def status(store: MetaStore, node_id: str) -> DrainStatus:
    """Where a node's drain stands (also for a node that is not drained)."""
    meta_keys.validate_node_id(node_id)
    record = await store.get_model(meta_keys.drain_key("ingest", node_id), DrainRecord)
    held, leaving = [], []
    records = await read_partition_records(store)
    for partition in sorted(records, key=str):
        assignment = records[partition].assignment
        if assignment is not None and node_id in assignment.replicas:
            held.append(partition)
            if node_id in assignment.removing:
                leaving.append(partition)
    return DrainStatus(
        node_id, None if record is None else record.requested_ms, tuple(held), tuple(leaving)
    )

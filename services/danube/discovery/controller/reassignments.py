"""An operator's reassignments and drains (docs/replication.md, "Moving partitions";
docs/operations.md, "Draining a node"): what the admin routes ask of etcd.

A reassignment is one compare-and-swap of the partition's ``assignment`` record
(:mod:`danube.meta.reassign` builds it); the partition's leader carries it out. A drain is one
key, ``drains/<kind>/<node>``: for an ingest node the controller's balancer acts on it and
placement honours it; a dispatcher hands its subscriptions over (docs/dispatcher.md).
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
from danube.discovery.controller.partition_records import read_drained, read_partition_records
from danube.discovery.errors import BadRequestError, ConflictError, NotFoundError
from danube.meta import MetaStore, TopicName, encode_model
from danube.meta import keys as meta_keys
from danube.meta.keys import ServiceKind
from danube.meta.reassign import cancel, check_target, reassign
from danube.meta.records import Assignment, DrainRecord, Owner
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
    replica of and those of them leaving it now, and (a dispatcher) the subscriptions it
    still serves."""

    node_id: str
    requested_ms: int | None
    replicas: tuple[TopicName, ...]
    leaving: tuple[TopicName, ...]
    subscriptions: tuple[str, ...] = ()
    kinds: tuple[ServiceKind, ...] = ()

    @property
    def done(self) -> bool:
        """Drained and holding nothing."""
        return self.requested_ms is not None and not self.replicas and not self.subscriptions


# The kinds of node a drain applies to: ingest (its replicas move by reassignment) and
# dispatcher (its subscriptions are handed over: docs/dispatcher.md, "Balancing").
DRAINABLE: tuple[ServiceKind, ...] = ("ingest", "dispatcher")


async def _kinds_of(store: MetaStore, node_id: str) -> list[ServiceKind]:
    """The drainable kinds ``node_id`` is: live as, or (ingest) still holding replicas as."""
    kinds: list[ServiceKind] = [
        kind for kind in DRAINABLE if node_id in await live_nodes(store, kind)
    ]
    if "ingest" not in kinds and (await _held(store, node_id))[0]:
        kinds.insert(0, "ingest")  # a dead node holding replicas: they are copied elsewhere
    return kinds


async def drain(store: MetaStore, node_id: str) -> tuple[DrainRecord, bool]:
    """Drain ``node_id``: an ingest node's replicas move off it (the balancer) and placement
    skips it; a dispatcher hands its subscriptions over and claims no more. 400
    ``node_not_live`` for a node that is none of these kinds (a dead ingest node holding
    replicas may be drained: they are copied from their leaders). Returns the record and
    whether this call wrote it (draining twice changes nothing)."""
    meta_keys.validate_node_id(node_id)
    kinds = await _kinds_of(store, node_id)
    if not kinds:
        raise BadRequestError(
            f"{node_id} is not a live ingest node or dispatcher and holds no replica",
            code="node_not_live",
        )
    record = DrainRecord(node_id=node_id, requested_ms=int(time.time() * 1000))
    created = False
    for kind in kinds:
        key = meta_keys.drain_key(kind, node_id)
        if await store.create_model(key, record):
            created = True
            log.warning("%s node %s drained by an operator", kind, node_id)
        else:
            record = await store.get_model(key, DrainRecord) or record
    return record, created


async def undrain(store: MetaStore, node_id: str) -> None:
    """Lift a drain (404 ``not_drained`` when there is none); moves under way go on."""
    meta_keys.validate_node_id(node_id)
    lifted = [kind for kind in DRAINABLE if await store.delete(meta_keys.drain_key(kind, node_id))]
    if not lifted:
        raise NotFoundError(f"{node_id} is not drained", code="not_drained")
    log.warning("%s node %s undrained by an operator", "/".join(lifted), node_id)


async def _held(store: MetaStore, node_id: str) -> tuple[list[TopicName], list[TopicName]]:
    """The partitions ``node_id`` holds a replica of, and those leaving it now."""
    held, leaving = [], []
    records = await read_partition_records(store)
    for partition in sorted(records, key=str):
        assignment = records[partition].assignment
        if assignment is not None and node_id in assignment.replicas:
            held.append(partition)
            if node_id in assignment.removing:
                leaving.append(partition)
    return held, leaving


async def _served(store: MetaStore, node_id: str) -> list[str]:
    """The subscriptions (``/ns/topic/sub``) whose owner key names dispatcher ``node_id``."""
    served = []
    for kv in await store.range(meta_keys.SUBSCRIPTIONS_PREFIX):
        try:
            topic, subscription, record = meta_keys.parse_subscription_key(kv.key)
            if record != "owner":
                continue
            owner = Owner.model_validate_json(kv.value)
        except ValueError:
            continue
        if owner.node_id == node_id:
            served.append(f"{topic}/{subscription}")
    return sorted(served)


async def status(store: MetaStore, node_id: str) -> DrainStatus:
    """Where a node's drain stands (also for a node that is not drained)."""
    meta_keys.validate_node_id(node_id)
    requested: list[int] = []
    kinds: list[ServiceKind] = []
    for kind in DRAINABLE:
        record = await store.get_model(meta_keys.drain_key(kind, node_id), DrainRecord)
        if record is not None:
            requested.append(record.requested_ms)
            kinds.append(kind)
    held, leaving = await _held(store, node_id)
    return DrainStatus(
        node_id,
        min(requested) if requested else None,
        tuple(held),
        tuple(leaving),
        tuple(await _served(store, node_id)),
        tuple(kinds),
    )

"""The partitions this ingest node keeps a replica of, and the claim requests it answers.

A replica (danube.ingest.replica) exists here for every partition whose assignment names
this node; the node's watch on ``partitions/`` creates them and wakes them when their
partition's assignment, state or owner key changes.
"""

from __future__ import annotations

import asyncio
import logging
import shutil
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import orjson

from danube.bus import Bus, Request
from danube.config import DanubeSettings
from danube.ingest import leadership, metrics
from danube.ingest.buswatch import BusWatch, round_trip
from danube.ingest.handlers import PartitionHandlers
from danube.ingest.nodelease import NodeLease
from danube.ingest.partition import Partition
from danube.ingest.replica import NodeContext, Replica
from danube.ingest.throttle import TokenBucket
from danube.ingest.wal import BoundedFileOps
from danube.meta import Lease, MetaStore, TopicName, WatchEvent
from danube.meta import keys as meta_keys
from danube.meta.follow import follow_prefix
from danube.meta.records import Assignment, NamespacePolicy, Owner, TopicConfig
from danube.meta.topics import live_nodes
from danube.runtime.liveness import GoneNodes
from danube.runtime.owned import Owned
from danube.tasks import TaskSet
from danube.wire.ingest import control

log = logging.getLogger(__name__)

_CLAIM_POLL_S = 0.05
_SLOW_DELETE_S = 2.0  # a delete slower than this is logged with where its time went
# A claim request waits this long for a leader before it answers that there is none.
CLAIM_WAIT_S = 3.0


class TimedFileOps(BoundedFileOps):
    """The real disk with the node's limits (open segment files, free space), every
    write and fdatasync timed into their latency histograms."""

    # Timed by hand: a Timer object per call costs more than the two clock reads.
    def write(self, fd: int, data: bytes | bytearray | memoryview) -> None:
        started_s = time.perf_counter()
        super().write(fd, data)
        metrics.WRITE_SECONDS.observe(time.perf_counter() - started_s)

    def write_at(self, fd: int, data: bytes | bytearray | memoryview, position: int) -> None:
        started_s = time.perf_counter()
        super().write_at(fd, data, position)
        metrics.WRITE_SECONDS.observe(time.perf_counter() - started_s)

    def fdatasync(self, fd: int) -> None:
        started_s = time.perf_counter()
        super().fdatasync(fd)
        metrics.FSYNC_SECONDS.observe(time.perf_counter() - started_s)


class Node:
    """Keeps the replicas of one ingest process."""

    def __init__(
        self, settings: DanubeSettings, *, node_id: str, bus: Bus, store: MetaStore, lease: Lease
    ) -> None:
        self.settings = settings
        self.node_id = node_id
        self.bus = bus
        self.store = store
        self.leases = NodeLease(lease)
        self.failed = asyncio.Event()  # a WAL failed: the process must restart
        wal_root = settings.wal_cloud.wal.dir
        ops = TimedFileOps(
            open_max=settings.ingest.open_segments_max,
            free_min_bytes=settings.ingest.disk_free_min_bytes,
            wal_root=wal_root,
        )
        # A leader gives way once the bus is lost for the lease's TTL: as soon as one cut
        # from etcd would (danube.ingest.buswatch).
        self.bus_watch = BusWatch(
            round_trip(bus),
            grace_s=float(settings.ingest.lease_ttl_s),
            on_change=self._bus_changed,
            reconnect=bus.reconnect_stale,
        )
        rate_bytes_s = settings.ingest.catchup_bytes_s
        catchup = TokenBucket(rate_bytes_s, rate_bytes_s / 4, time.monotonic())
        self.ctx = NodeContext(
            settings,
            node_id,
            bus,
            store,
            self.leases,
            ops,
            on_fatal=self.failed.set,
            catchup=catchup,
            bus_watch=self.bus_watch,
            gone_leaders=GoneNodes(store, "ingest", on_ended=_leader_ended),
        )
        metrics.LEASELESS_SECONDS.set_function(self.leases.leaseless_s)
        metrics.REPLICA_LINKS_HELD.set_function(lambda: self.ctx.links.held)
        metrics.OPEN_SEGMENT_FILES.set_function(lambda: ops.open_count)
        metrics.SEGMENT_FILE_REOPENS.set_function(lambda: ops.reopens)
        metrics.WAL_DISK_FULL.labels(str(wal_root)).set_function(lambda: int(ops.disk_full))
        metrics.WAL_DISK_FREE.labels(str(wal_root)).set_function(lambda: _free_bytes(wal_root))
        # Not fenced on a lost lease: each leader serves on while its followers confirm it
        # (danube.ingest.partition), and takes its owner key back under the next lease.
        self._tasks = TaskSet(f"ingest {node_id}")
        self._replicas: Owned[TopicName, _Kept] = Owned(
            None, fence=_fence_leader, on_count=metrics.PARTITIONS.set
        )
        metrics.SEGMENTS.set_function(lambda: sum(p.wal.stats().segments for p in self.partitions))
        metrics.UNDER_REPLICATED.set_function(
            lambda: sum(1 for p in self.partitions if p.under_replicated)
        )
        metrics.FOLLOWER_LAG_MAX.set_function(
            lambda: max((p.max_follower_lag() for p in self.partitions), default=0)
        )

    def lease_renewed(self, lease: Lease) -> None:
        """The session took a new node lease after losing the last one (an etcd outage):
        every replica reconciles now, so leaders write their owner keys again under it."""
        self.leases.renew(lease)
        log.info(
            "ingest %s: new node lease; %d replicas reconcile", self.node_id, len(self._replicas)
        )
        for kept in self._replicas.values():
            kept.replica.kick()

    def _bus_changed(self, lost: bool) -> None:
        """The bus was lost (leaders give way) or is back (replicas may claim): every
        replica reconciles now."""
        for kept in self._replicas.values():
            kept.replica.kick()

    def get(self, name: TopicName) -> Partition | None:
        """The partition if this node leads it."""
        kept = self._replicas.get(name)
        return None if kept is None else kept.replica.partition

    def leader_of(self, name: TopicName) -> PartitionHandlers | None:
        """The handlers of ``name`` while this node leads it (the data door's way in)."""
        kept = self._replicas.get(name)
        leading = None if kept is None else kept.replica.leading
        return None if leading is None else leading.handlers

    @property
    def partitions(self) -> list[Partition]:
        """The partitions this node leads."""
        return [p for k in self._replicas.values() if (p := k.replica.partition) is not None]

    @property
    def replicas(self) -> dict[TopicName, Replica]:
        return {kept.replica.name: kept.replica for kept in self._replicas.values()}

    def wal_dir(self, name: TopicName) -> Path:
        return self.settings.wal_cloud.wal.dir / name.namespace / name.topic

    def ensure_replica(self, name: TopicName) -> Replica:
        """Start keeping a replica of ``name`` here (idempotent)."""
        kept = self._replicas.get(name)
        if kept is not None:
            kept.replica.kick()
            return kept.replica
        replica = Replica(name, self.wal_dir(name), self.ctx)
        # The task first runs once this returns: it is kept before it can end.
        # _run logs a replica that failed and lets it go: its failure is its own.
        task = self._tasks.spawn(self._run(replica), name=f"replica-{name}", on_failure="log")
        self._replicas.add(name, _Kept(replica, task))
        return replica

    async def _run(self, replica: Replica) -> None:
        try:
            await replica.run()
        except Exception:
            log.exception("replica of %s failed", replica.name)
        finally:
            kept = self._replicas.get(replica.name)
            if kept is not None and kept.replica is replica:
                self._replicas.discard(replica.name, kept)

    async def _stop_replica(self, name: TopicName, *, release: bool, deleted: bool = False) -> None:
        kept = self._replicas.get(name)
        if kept is None:
            return
        kept.replica.stop(release=release, deleted=deleted)
        await asyncio.wait({kept.task}, timeout=30.0)
        await self._tasks.cancel(kept.task)

    # --- following etcd ------------------------------------------------------------------

    async def load(self) -> int:
        """Start a replica for every assignment naming this node; return the revision read
        at (watch from the next one so no change is missed)."""
        snapshot = await self.store.snapshot(meta_keys.partitions_prefix())
        for kv in snapshot.kvs:
            name, record = meta_keys.parse_partition_key(kv.key)
            if record != "assignment":
                continue
            if self._names_me(kv.value):
                self.ensure_replica(name)
            elif self._retired_me(kv.value) and name not in self.replicas:
                await self._delete_retired(name)
        return snapshot.revision

    def _names_me(self, value: bytes) -> bool:
        try:
            return self.node_id in Assignment.model_validate_json(value).replicas
        except ValueError as exc:
            log.warning("bad assignment: %s", exc)
            return False

    def _retired_me(self, value: bytes) -> bool:
        try:
            return self.node_id in Assignment.model_validate_json(value).retired
        except ValueError:
            return False

    async def _delete_retired(self, name: TopicName) -> None:
        """A reassignment completed while this node was away moved ``name`` off it: its
        copy is of no use any more (the new replica set holds everything)."""
        directory = self.wal_dir(name)
        if await asyncio.to_thread(directory.exists):
            await asyncio.to_thread(shutil.rmtree, directory, True)
            metrics.RETIRED_COPIES.inc()
            log.info("%s: moved away by a reassignment while down; local copy deleted", name)

    def _on_partition_event(self, event: WatchEvent) -> None:
        name, record = meta_keys.parse_partition_key(event.key)
        kept = self._replicas.get(name)
        replica = None if kept is None else kept.replica
        if record == "assignment" and event.kind == "put" and self._names_me(event.value):
            self.ensure_replica(name)
        elif replica is not None and record in ("assignment", "state", "owner"):
            if record == "owner" and replica.partition is not None and event.kind == "put":
                owner = Owner.model_validate_json(event.value)
                if (owner.node_id, owner.epoch) != (self.node_id, replica.partition.term.epoch):
                    # Fence at once, before the replica's next read: never two writers.
                    replica.partition.fence(f"now led by {owner.node_id} (epoch {owner.epoch})")
            replica.kick()

    async def watch(self, *, start_revision: int | None = None) -> None:
        """Pass every change under ``partitions/`` to the replicas. Runs until cancelled;
        a broken watch resumes where it stopped (or, when etcd compacted that away,
        :meth:`resync` first)."""
        await follow_prefix(
            self.store,
            meta_keys.partitions_prefix(),
            self._on_partition_event,
            start_revision=start_revision,
            on_resync=self.resync,
        )

    async def resync(self) -> int:
        """After changes were lost to the watch: the assignments read again (a replica
        started for each new one) and every replica reconciling at once; the revision read
        at."""
        revision = await self.load()
        for kept in self._replicas.values():
            kept.replica.kick()
        return revision

    # --- claim requests -------------------------------------------------------------------

    async def answer_claim(self, request: Request) -> bytes:
        """Place the partition if it has no replica set yet, start our replica if we hold
        one, and wait (briefly) for a leader: PartitionUnavailableError when none can come
        (no in-sync replica is alive), LeaderPendingError when one is slow to.

        When the leader is this node's replica, the answer waits until its handlers serve
        (the requester retries at once, danube.wire.claim), woken by the replica itself
        rather than by the next poll of etcd."""
        name = self.bus.subjects.parse(request.subject).name
        factor, min_insync, volatile = await self._replication_of(name)
        if volatile:
            await leadership.replace_volatile(self.store, name, self.node_id)
        assignment = await leadership.place(
            self.store, name, first=self.node_id, factor=factor, min_insync=min_insync
        )
        if self.node_id in assignment.replicas:
            self.ensure_replica(name)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + CLAIM_WAIT_S
        while True:
            kept = self._replicas.get(name)
            # Taken before the read: a start of leading after it ends the wait below at once.
            leading = None if kept is None else kept.replica.next_leading()
            view = await leadership.read(self.store, name)
            owner = view.owner
            if owner is not None and (kept is None or self._serves(name, owner)):
                return orjson.dumps({"leader": owner.node_id, "epoch": owner.epoch})
            if owner is None and not await self._may_get_leader(view):
                raise _unavailable(name, assignment.replicas, view)
            if loop.time() >= deadline:
                raise leadership.LeaderPendingError(
                    f"{name} has no leader yet (replicas {', '.join(assignment.replicas)})"
                )
            if leading is None:
                await asyncio.sleep(_CLAIM_POLL_S)
            else:
                await asyncio.wait({leading}, timeout=_CLAIM_POLL_S)

    def _serves(self, name: TopicName, owner: Owner) -> bool:
        """Whether ``owner``'s handlers serve: another node's are its own business; ours
        once our replica leads at the owner's epoch."""
        if owner.node_id != self.node_id:
            return True
        partition = self.get(name)
        return partition is not None and partition.term.epoch == owner.epoch

    async def answer_probe(self, request: Request) -> bytes:
        """Whether the partition has a leader, or may get one (read-only, at once):
        PartitionUnavailableError when no in-sync replica is alive."""
        name = self.bus.subjects.parse(request.subject).name
        view = await leadership.read(self.store, name)
        if view.owner is not None:
            owner = view.owner
            return control.encode_probe_reply(owner.node_id, owner.epoch, owner.assigned_ms)
        if await self._may_get_leader(view) or (await self._replication_of(name))[2]:
            # A non-reliable partition holds nothing to lose: a claim moves it to a live node.
            return control.encode_probe_reply(None)
        replicas = [] if view.assignment is None else view.assignment.replicas
        raise _unavailable(name, replicas, view)

    async def _may_get_leader(self, view: leadership.PartitionView) -> bool:
        """Whether a leader may come without an operator: the partition never had one, an
        unclean move restarts it, or an in-sync replica is a live node."""
        state = view.state
        if state is None or state.restart_at is not None:
            return True
        return bool(await live_nodes(self.store, "ingest") & set(state.isr))

    async def _replication_of(self, name: TopicName) -> tuple[int, int, bool]:
        """Replication factor and min in-sync replicas: the topic's, else its namespace's,
        else the cluster's (``ingest.*``); and whether the topic is non-reliable."""
        ingest = self.settings.ingest
        config = await self.store.get_model(meta_keys.topic_key(name.parent), TopicConfig)
        policy = await self.store.get_model(
            meta_keys.namespace_key(name.namespace), NamespacePolicy
        )
        if config is not None and config.dispatch == "non_reliable":
            return 1, 1, True  # nothing stored: nothing to replicate
        factor = (
            (config.replication_factor if config else None)
            or (policy.replication_factor if policy else None)
            or ingest.replication_factor
        )
        min_insync = (
            (config.min_insync_replicas if config else None)
            or (policy.min_insync_replicas if policy else None)
            or ingest.min_insync_replicas
        )
        return factor, min(min_insync, factor), False

    # --- deletes and the end -----------------------------------------------------------------

    async def delete_local(self, name: TopicName) -> bool:
        """The partition's topic was deleted: stop its replica and remove its WAL directory.
        Idempotent; returns whether there was a copy to delete."""
        started_s = time.monotonic()
        had_replica = name in self.replicas
        await self._stop_replica(name, release=False, deleted=True)
        stopped_s = time.monotonic()
        directory = self.wal_dir(name)
        removed = await asyncio.to_thread(directory.exists)
        if removed:  # no replica (it removes its own copy), or one that could not
            await asyncio.to_thread(shutil.rmtree, directory)
        took_s = time.monotonic() - started_s
        if took_s > _SLOW_DELETE_S:
            log.warning(
                "deleting the WAL of %s took %.1f s (stopping its replica %.1f s)",
                name,
                took_s,
                stopped_s - started_s,
            )
        if removed or had_replica:
            log.info("deleted the WAL of %s", name)
        return removed or had_replica

    def fence_all(self, reason: str) -> None:
        """Fence every partition this node leads: no more appends."""
        self._replicas.fence_all(reason)

    async def close(self, *, release: bool) -> None:
        """Stop every replica, all at once; ``release`` (a clean shutdown) hands each
        leadership to an in-sync follower and takes this node out of its leaders' ISRs."""
        kept = [k for name in self._replicas.served() if (k := self._replicas.get(name))]
        for k in kept:
            k.replica.stop(release=release)
        tasks = {k.task for k in kept}
        if tasks:
            await asyncio.wait(tasks, timeout=30.0)
        await self._tasks.close()


@dataclass(frozen=True)
class _Kept:
    """A replica kept here and the task that runs it."""

    replica: Replica
    task: asyncio.Task[None]


def _fence_leader(kept: _Kept, reason: str) -> None:
    if kept.replica.partition is not None:
        kept.replica.partition.fence(reason)


def _leader_ended(node_id: str, door: str) -> None:
    metrics.DEAD_LEADER_LEASES_ENDED.inc()
    log.warning("ingest node %s's door %s refuses connections: ended its lease", node_id, door)


def _free_bytes(path: Path) -> float:
    """Free bytes on the WAL's file system (at scrape time; NaN before the directory exists)."""
    try:
        return float(shutil.disk_usage(path).free)
    except OSError:
        return float("nan")


def _unavailable(
    name: TopicName, replicas: Sequence[str], view: leadership.PartitionView
) -> leadership.PartitionUnavailableError:
    in_sync = "none yet" if view.state is None else ", ".join(view.state.isr)
    return leadership.PartitionUnavailableError(
        f"{name} has no leader: replicas {', '.join(replicas)}, in sync {in_sync}; no in-sync "
        "replica is alive (it comes back when one does)"
    )

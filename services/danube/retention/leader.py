"""One retention leader: campaign on ``elections/retention``, then run a pass every interval.

A pass reads the topic configs, and for every partition of every reliable topic runs the WAL
step (danube.retention.wal) and the cloud step (danube.retention.cloud), a few partitions at a
time. A failed step is logged and counted by stage and the pass goes on with the next one; a
pass stops early only when the term ends (the next leader runs the next pass).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field

from danube.aio import wait_any
from danube.bus import Bus, BusError
from danube.config import DanubeSettings
from danube.meta import (
    DeposedError,
    Election,
    Leadership,
    MetaError,
    MetaStore,
    TopicName,
    run_as_leader,
)
from danube.meta import keys as meta_keys
from danube.meta.topics import read_namespaces, read_topics
from danube.retention import metrics
from danube.retention.cloud import CloudRetention, Fence
from danube.retention.floors import ack_floor
from danube.retention.policy import Limits, PartitionPolicy, reliable_partitions
from danube.retention.wal import enforce_wal
from danube.runtime.topic_metrics import GaugeSnapshot, topic_label
from danube.storage import ObjectStore, StorageError
from danube.wire.ingest.client import IngestClient

log = logging.getLogger(__name__)

PARTITION_CONCURRENCY = 8
"""Partitions one pass works on at once: bounds the load on ingest nodes, etcd and storage."""
WAL_REQUEST_TIMEOUT_S = 30.0
"""Deadline of one ``wal.stats`` or ``wal.drop`` request (a drop deletes files and fsyncs)."""
# What a step may fail with and still leave the pass going (anything else is a bug).
_STEP_ERRORS = (BusError, MetaError, StorageError)


@dataclass
class PassReport:
    """What one pass did (also in the metrics and logs). ``errors`` counts the failed steps;
    problems a step gets past on its own (an unreadable checkpoint or descriptor, an object
    left to delete again) show only in ``danube_retention_errors_total``."""

    partitions: int = 0
    segments_dropped: int = 0
    wal_bytes_dropped: int = 0
    objects_deleted: int = 0
    object_bytes_deleted: int = 0
    # Of the above, what every subscription had acknowledged (queue retention).
    wal_acked_bytes_dropped: int = 0
    object_acked_bytes_deleted: int = 0
    errors: dict[str, int] = field(default_factory=dict)
    deposed: bool = False
    # The objects kept, per partition: ``(objects, bytes)``.
    cloud_tier: dict[TopicName, tuple[int, int]] = field(default_factory=dict)
    # The WAL bytes of each partition that was listed (its owner's copy).
    wal_tier: dict[TopicName, int] = field(default_factory=dict)

    def failed(self, stage: str) -> None:
        """Count a failed step of ``stage``."""
        self.errors[stage] = self.errors.get(stage, 0) + 1
        metrics.RUN_ERRORS.labels(stage).inc()


class Retention:
    """Campaign for retention leadership; while leader, run a pass every interval."""

    def __init__(
        self,
        settings: DanubeSettings,
        *,
        node_id: str,
        store: MetaStore,
        bus: Bus,
        objects: ObjectStore,
        clock: Callable[[], float] = time.time,
    ) -> None:
        wal_policy = settings.wal_cloud.wal.retention
        self.node_id = node_id
        self.interval_s = settings.retention.check_interval_s or (
            wal_policy.check_interval_minutes * 60.0
        )
        self.wal_limits = Limits.of(wal_policy.time_minutes, wal_policy.size_mb)
        self._store = store
        self._ingest = IngestClient(bus)
        self._cloud = CloudRetention(store, objects)
        self._cloud_bytes = GaugeSnapshot(metrics.TOPIC_CLOUD_BYTES)
        self._cloud_objects = GaugeSnapshot(metrics.TOPIC_CLOUD_OBJECTS)
        self._wal_bytes = GaugeSnapshot(metrics.TOPIC_WAL_BYTES)
        self._clock = clock
        self._election = Election(
            store, meta_keys.RETENTION_ELECTION, node_id, ttl_s=settings.retention.lease_ttl_s
        )
        self.passes = 0  # completed passes, for tests and logs

    @property
    def is_leader(self) -> bool:
        """Whether this node leads retention right now (as far as it can know)."""
        return self._election.is_leader

    async def run(self, stop: asyncio.Event) -> None:
        """Campaign, lead while elected, campaign again; return once ``stop`` is set."""
        await run_as_leader(
            self._election,
            self._lead,
            stop,
            cancel_timeout_s=self._store.request_timeout_s,
            role="retention",
        )

    async def _lead(self, term: Leadership, stop: asyncio.Event) -> None:
        log.info("retention %s leads (term revision %d)", self.node_id, term.revision)
        metrics.LEADER.set(1)
        try:
            await self._passes(term, stop)
        finally:
            metrics.LEADER.set(0)

    async def _passes(self, term: Leadership, stop: asyncio.Event) -> None:
        loop = asyncio.get_running_loop()
        while term.active and not stop.is_set():
            started = loop.time()
            try:
                await self.run_pass(term)
            except DeposedError as exc:
                log.warning("retention %s deposed: %s", self.node_id, exc)
                return
            # The interval runs from start to start; a pass longer than it is followed at once.
            await wait_any(stop, term.lost, timeout_s=started + self.interval_s - loop.time())

    async def run_pass(self, term: Leadership) -> PassReport:
        """Look at every partition of every reliable topic once; return what was done."""
        report = PassReport()
        fence = Fence(meta_keys.election_key(meta_keys.RETENTION_ELECTION), term.revision)
        with metrics.RUN_SECONDS.time():
            try:
                topics = await read_topics(self._store)
                namespaces = await read_namespaces(self._store)
            except MetaError as exc:
                log.warning("retention pass: cannot read topics: %s", exc)
                report.failed("topics")
                return report
            partitions = reliable_partitions(topics.items(), namespaces)
            report.partitions = len(partitions)
            await self._cloud.retry_orphans()

            async def step(item: PartitionPolicy) -> None:
                if term.active and not report.deposed:
                    await self._partition(item, fence, report)

            await _for_each(iter(partitions), step, PARTITION_CONCURRENCY)
        if report.deposed or not term.active:
            raise DeposedError(f"the term ended ({term.lost_reason}) during a pass")
        self.passes += 1
        metrics.RUNS.inc()
        self._cloud_bytes.publish(
            ((topic_label(p),), size) for p, (_, size) in report.cloud_tier.items()
        )
        self._cloud_objects.publish(
            ((topic_label(p),), count) for p, (count, _) in report.cloud_tier.items()
        )
        self._wal_bytes.publish(((topic_label(p),), size) for p, size in report.wal_tier.items())
        log.debug("retention pass done: %s", report)
        return report

    async def _partition(self, item: PartitionPolicy, fence: Fence, report: PassReport) -> None:
        partition, policy = item.partition, item.retention
        floor: int | None = None
        if item.queue:
            try:
                floor = await ack_floor(self._store, partition)
            except MetaError as exc:  # then only the limits apply this pass
                log.warning("cursors of %s unreadable: %s", partition, exc)
                report.failed("cursor")
        try:
            outcome = await enforce_wal(
                partition,
                store=self._store,
                ingest=self._ingest,
                limits=self.wal_limits,
                timeout_s=WAL_REQUEST_TIMEOUT_S,
                ack_floor=floor,
                ack_hold_ms=item.ack_hold_ms,
            )
        except _STEP_ERRORS as exc:
            log.warning("WAL retention of %s failed: %s", partition, exc)
            report.failed("wal")
        else:
            if outcome is not None:
                report.wal_tier[partition] = outcome.held_bytes
                report.segments_dropped += outcome.segments
                report.wal_bytes_dropped += outcome.size_bytes
                report.wal_acked_bytes_dropped += outcome.acked.size_bytes
        try:
            now_ms = int(self._clock() * 1000)
            deleted = await self._cloud.enforce(
                partition, policy, fence=fence, now_ms=now_ms, ack_floor=floor
            )
        except DeposedError:
            report.deposed = True  # raised once the pass's other steps are done
        except _STEP_ERRORS as exc:
            log.warning("cloud retention of %s failed: %s", partition, exc)
            report.failed("cloud")
        else:
            report.objects_deleted += deleted.objects
            report.object_bytes_deleted += deleted.size_bytes
            report.object_acked_bytes_deleted += deleted.acked.size_bytes
            report.cloud_tier[partition] = (deleted.kept_objects, deleted.kept_bytes)


async def _for_each(
    items: Iterator[PartitionPolicy],
    work: Callable[[PartitionPolicy], Awaitable[None]],
    concurrency: int,
) -> None:
    """Run ``work`` on every item, at most ``concurrency`` at a time (workers share the
    iterator, so no more than that many tasks ever exist)."""

    async def worker() -> None:
        for item in items:
            await work(item)

    async with asyncio.TaskGroup() as tg:
        for index in range(concurrency):
            tg.create_task(worker(), name=f"retention-worker-{index}")

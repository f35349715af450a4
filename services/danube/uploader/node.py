"""Which partitions this uploader uploads, and one worker task per partition.

Assignment through etcd leases, no coordinator: every ``ASSIGN_INTERVAL_S`` each uploader
reads the reliable partitions and the live uploaders (``nodes/uploader/``), computes its fair
share ``ceil(partitions / uploaders)``, releases what it holds beyond that (and partitions
whose topic is gone), and claims free partitions up to it by creating
``partitions/<ns>/<p>/uploader`` on its node lease. A crashed uploader's keys vanish with its
lease and the others pick its partitions up; a new uploader gets partitions as the others
release their surplus. Every write of a worker is fenced on its assignment key's revision.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import random
import time

from danube.bus import Bus, Message, MessageCallback, NoRespondersError, Subscription, TopicName
from danube.config import DanubeSettings
from danube.meta import Lease, MetaStore, encode_model
from danube.meta import keys as meta_keys
from danube.meta.backoff import backoff_s
from danube.meta.records import Owner
from danube.meta.topics import read_topics
from danube.runtime.topic_metrics import GaugeSnapshot, partition_labels
from danube.storage import ObjectStore
from danube.tasks import TaskSet
from danube.uploader import metrics
from danube.uploader.upload import (
    DataLostError,
    PartitionUploader,
    UploadFencedError,
    WalDamagedError,
)
from danube.wire.ingest import protocol
from danube.wire.ingest.client import IngestClient

log = logging.getLogger(__name__)

ASSIGN_INTERVAL_S = 2.0
MAX_CONCURRENT_UPLOADS = 4
_RETRY_BASE_S = 0.5
_RETRY_CAP_S = 10.0


class _Worker:
    def __init__(self, uploader: PartitionUploader, task: asyncio.Task[None]) -> None:
        self.uploader = uploader
        self.task = task
        self.wake = asyncio.Event()
        self.live: Subscription | None = None
        self.live_bytes = 0
        self.lag_offsets = 0
        self.caught_up_at = time.monotonic()


class UploaderNode:
    """The partitions one uploader process holds and their workers."""

    def __init__(
        self,
        settings: DanubeSettings,
        *,
        node_id: str,
        bus: Bus,
        store: MetaStore,
        lease: Lease,
        objects: ObjectStore,
    ) -> None:
        self.settings = settings
        self.config = settings.wal_cloud.uploader
        self.node_id = node_id
        self.bus = bus
        self.store = store
        self.lease = lease
        self.objects = objects
        self.ingest = IngestClient(bus)
        self._workers: dict[TopicName, _Worker] = {}
        self._uploads = asyncio.Semaphore(MAX_CONCURRENT_UPLOADS)
        self._lag_offsets = GaugeSnapshot(metrics.PARTITION_LAG_OFFSETS)
        self._lag_seconds = GaugeSnapshot(metrics.PARTITION_LAG_SECONDS)
        # Releases a fenced worker started from inside itself (it cannot await its own
        # cancel): held here so they are not garbage-collected, their errors logged, and
        # close() waits for them.
        # A worker that dies (an error out of its own handling: etcd failing while it skips
        # lost data, say) would hold its partition and upload nothing: it is let go, so an
        # uploader (this one, next pass) claims it again with a fresh worker.
        self._tasks = TaskSet(f"uploader {node_id}", on_failure=self._worker_failed)
        self._releases = TaskSet(f"uploader {node_id} releases")

    @property
    def partitions(self) -> list[TopicName]:
        """The partitions this node uploads."""
        return list(self._workers)

    async def run(self) -> None:
        """Rebalance every ASSIGN_INTERVAL_S until cancelled."""
        while True:
            try:
                await self.rebalance()
            except Exception as exc:  # etcd away: keep the workers, try again
                log.warning("uploader %s: rebalance failed: %s", self.node_id, exc)
            self._publish_lag()
            await asyncio.sleep(ASSIGN_INTERVAL_S * random.uniform(0.8, 1.2))

    async def rebalance(self) -> None:
        """Release what is beyond the fair share or gone, claim free partitions up to it."""
        if not self.config.enabled or not self.lease.alive:
            return
        topics = await read_topics(self.store)
        partitions = sorted(
            (
                p
                for t, c in topics.items()
                if c.dispatch == "reliable"
                for p in t.partitions(c.partitions)
            ),
            key=str,
        )
        uploaders = len(await self.store.range(meta_keys.nodes_prefix("uploader")))
        share = math.ceil(len(partitions) / max(uploaders, 1))
        existing = set(partitions)
        for partition in [p for p in self._workers if p not in existing]:
            await self.release(partition)
        for partition in sorted(self._workers, key=str, reverse=True)[share:]:
            await self.release(partition)
        free = [p for p in partitions if p not in self._workers]
        random.shuffle(free)  # uploaders starting together do not all race for the same ones
        for partition in free:
            if len(self._workers) >= share:
                break
            await self._claim(partition)

    async def _claim(self, partition: TopicName) -> None:
        key = meta_keys.uploader_assignment_key(partition)
        owner = Owner(node_id=self.node_id, epoch=1, assigned_ms=int(time.time() * 1000))
        txn = self.store.txn().if_absent(key).then_put(key, encode_model(owner), lease=self.lease)
        result = await txn.commit()
        if not result.succeeded:
            return  # another uploader holds it
        uploader = PartitionUploader(
            partition,
            store=self.store,
            objects=self.objects,
            ingest=self.ingest,
            config=self.config,
            assignment_revision=result.revision,
        )
        task = self._tasks.spawn(self._work(partition), name=_worker_name(partition))
        worker = self._workers[partition] = _Worker(uploader, task)
        worker.live = await self.bus.subscribe(
            self.bus.subjects.live(partition), self._on_live(worker), pending_msgs_limit=256
        )
        metrics.PARTITIONS.set(len(self._workers))
        log.info("uploader %s: uploading %s", self.node_id, partition)

    def _on_live(self, worker: _Worker) -> MessageCallback:
        limit = self.config.max_object_mb << 20

        async def on_live(message: Message) -> None:
            # Durable bytes since the last cycle: a full object's worth starts one early.
            # A reliable partition's live subject carries a durable_next wake-up that
            # says how many bytes its batch held; anything else is frames.
            wakeup = protocol.Wakeup.decode(message.body)
            worker.live_bytes += len(message.body) if wakeup is None else wakeup.payload_bytes
            if worker.live_bytes >= limit:
                worker.wake.set()

        return on_live

    async def release(self, partition: TopicName) -> None:
        """Stop uploading ``partition`` (after the object under way) and free its key."""
        worker = self._workers.pop(partition, None)
        if worker is None:
            return
        await self._tasks.cancel(worker.task)
        if worker.live is not None:
            await worker.live.unsubscribe()
        key = meta_keys.uploader_assignment_key(partition)
        with contextlib.suppress(Exception):
            await self.store.compare_and_delete(
                key, expected_mod_revision=worker.uploader.assignment_revision
            )
        metrics.PARTITIONS.set(len(self._workers))
        log.info("uploader %s: released %s", self.node_id, partition)

    async def close(self) -> None:
        """Stop every worker and free the keys (a clean stop hands partitions on at once)."""
        for partition in list(self._workers):
            await self.release(partition)
        await self._releases.join()
        await self._releases.close()
        await self._tasks.close()

    def _release_later(self, partition: TopicName) -> None:
        self._releases.spawn(self.release(partition), name=f"release-{partition}")

    def _worker_failed(self, name: str, exc: BaseException) -> None:
        for partition, worker in self._workers.items():
            if worker.task.get_name() == name:
                metrics.ERRORS.labels(type(exc).__name__).inc()
                self._release_later(partition)
                return

    async def _work(self, partition: TopicName) -> None:
        # Created just before its entry in _workers, which exists by the time this runs.
        worker = self._workers[partition]
        uploader = worker.uploader
        interval_s = float(self.config.interval_seconds)
        failures = 0
        while True:
            worker.live_bytes = 0
            worker.wake.clear()
            started = time.monotonic()
            try:
                async with self._uploads:
                    await self._measure_lag(worker)
                    await uploader.cycle()
                    await self._measure_lag(worker)  # what arrived during the cycle
                worker.caught_up_at = started
                self._publish_lag()
                failures = 0
            except DataLostError as exc:
                log.error("%s", exc)
                await uploader.skip_lost(exc.wal_start)
                continue
            except WalDamagedError as exc:  # the prefix is up; wait for a repair or a skip
                await uploader.record_damage(exc.damaged)
            except UploadFencedError as exc:
                log.warning("uploader %s: %s; letting %s go", self.node_id, exc, partition)
                self._release_later(partition)
                return
            except NoRespondersError:
                pass  # no ingest owns the partition right now: nothing durable to read
            except Exception as exc:  # storage or etcd down: retry with backoff
                failures += 1
                metrics.ERRORS.labels(type(exc).__name__).inc()
                cap_s = min(_RETRY_CAP_S, interval_s)
                delay_s = backoff_s(failures - 1, base_s=_RETRY_BASE_S, cap_s=cap_s)
                log.warning(
                    "uploader %s: %s failed (%s); retry in %.1f s",
                    self.node_id,
                    partition,
                    exc,
                    delay_s,
                )
                await asyncio.sleep(delay_s)
                continue
            finally:
                metrics.CYCLE_SECONDS.observe(time.monotonic() - started)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(interval_s):
                    await worker.wake.wait()

    async def _measure_lag(self, worker: _Worker) -> None:
        uploader = worker.uploader
        try:
            durable_next = (await self.ingest.wal_offsets(uploader.partition)).durable_next
        except NoRespondersError:
            return  # nobody serves the partition: nothing new is durable
        checkpoint = await uploader.load_checkpoint()
        worker.lag_offsets = max(durable_next - 1 - checkpoint.value.uploaded_through, 0)

    def _publish_lag(self) -> None:
        now = time.monotonic()
        workers = self._workers.values()
        metrics.LAG_SECONDS.set(max((now - w.caught_up_at for w in workers), default=0.0))
        metrics.LAG_OFFSETS.set(max((w.lag_offsets for w in workers), default=0))
        self._lag_offsets.publish(
            (partition_labels(p), w.lag_offsets) for p, w in self._workers.items()
        )
        self._lag_seconds.publish(
            (partition_labels(p), now - w.caught_up_at) for p, w in self._workers.items()
        )


def _worker_name(partition: TopicName) -> str:
    return f"upload-{partition}"

"""The partitions this ingest node owns: claiming, opening, serving and fencing them."""

from __future__ import annotations

import asyncio
import logging
import random
import shutil
from dataclasses import dataclass
from pathlib import Path

from danube.bus import Bus, Responder
from danube.config import DanubeSettings
from danube.ingest import epoch_file, metrics, ownership
from danube.ingest.follower import AssignmentFollower
from danube.ingest.handlers import PartitionHandlers
from danube.ingest.partition import RECORD_OVERHEAD_BYTES, Partition
from danube.ingest.wal import Durability, OsFileOps, Wal, WalOptions
from danube.meta import Lease, MetaError, MetaStore, TopicName, WatchError, WatchEvent
from danube.meta import keys as meta_keys
from danube.meta.records import Owner, TopicConfig

log = logging.getLogger(__name__)

OWNER_FILE = "owner.json"
# Frame bytes accepted but not yet durable, per partition: producers wait beyond it.
PENDING_BYTES_MIN = 64 * 1024 * 1024


class TimedFileOps(OsFileOps):
    """The real disk, with every fdatasync timed into the fsync latency histogram."""

    def fdatasync(self, fd: int) -> None:
        with metrics.FSYNC_SECONDS.time():
            super().fdatasync(fd)


@dataclass
class _Served:
    partition: Partition
    responders: list[Responder]
    live_task: asyncio.Task[None]


class Node:
    """Owns partitions on behalf of one ingest process."""

    def __init__(
        self, settings: DanubeSettings, *, node_id: str, bus: Bus, store: MetaStore, lease: Lease
    ) -> None:
        self.settings = settings
        self.node_id = node_id
        self.bus = bus
        self.store = store
        self.lease = lease
        self._served: dict[TopicName, _Served] = {}
        self._locks: dict[TopicName, asyncio.Lock] = {}
        self._file_ops = TimedFileOps()
        self._retiring: set[asyncio.Task[None]] = set()
        self.failed = asyncio.Event()  # a WAL failed: the process must restart
        self.follower = AssignmentFollower(self, store)
        metrics.SEGMENTS.set_function(lambda: sum(p.wal.stats().segments for p in self.partitions))
        lease.on_lost(lambda _: self.fence_all("node lease lost"))

    def get(self, name: TopicName) -> Partition | None:
        served = self._served.get(name)
        return None if served is None else served.partition

    @property
    def partitions(self) -> list[Partition]:
        return [served.partition for served in self._served.values()]

    def wal_dir(self, name: TopicName) -> Path:
        return self.settings.wal_cloud.wal.dir / name.namespace / name.topic

    async def ensure_serving(self, name: TopicName) -> Partition:
        """Claim ``name`` (if not ours yet), open its WAL and answer its subjects."""
        lock = self._locks.setdefault(name, asyncio.Lock())
        async with lock:
            served = self._served.get(name)
            if served is not None and not served.partition.fenced:
                return served.partition
            if served is not None:
                await self._stop_serving(name)
            partition = await self._start_serving(name)
        if self.follower.assigned_elsewhere(name):
            # Reassigned while we were claiming (a claim on request can race the controller):
            # the follower hands it over.
            self.follower.kick(name)
        return partition

    async def _start_serving(self, name: TopicName) -> Partition:
        durability = await self._durability(name)
        directory = self.wal_dir(name)
        max_message_bytes = self.settings.ingest.max_message_bytes + RECORD_OVERHEAD_BYTES
        options = WalOptions.from_config(
            self.settings.wal_cloud.wal,
            durability,
            max_frame_payload_bytes=max_message_bytes,
            max_pending_bytes=max(PENDING_BYTES_MIN, 2 * max_message_bytes),
        )
        # Memory-only WALs make no directory; the epoch file still needs one.
        await asyncio.to_thread(directory.mkdir, parents=True, exist_ok=True)
        wal = await Wal.open(directory, options, file_ops=self._file_ops)
        try:
            local = ownership.LocalState(
                next_offset=wal.next_offset,
                epoch=epoch_file.read_epoch(directory / OWNER_FILE),
                exact_resume_safe=durability is Durability.FSYNC,
            )
            claim = await ownership.claim(self.store, self.node_id, self.lease, name, local)
            # Record the epoch before acknowledging anything under it: only then may a
            # restart of this node resume right after its own WAL (ownership.start_offset).
            await asyncio.to_thread(epoch_file.write_epoch, directory / OWNER_FILE, claim.epoch)
            if claim.start_offset > wal.next_offset:
                await wal.advance_to(claim.start_offset)
        except BaseException:
            await wal.close()
            raise
        partition = Partition(
            name,
            wal,
            claim,
            store=self.store,
            bus=self.bus,
            node_id=self.node_id,
            lease=self.lease,
            on_fenced=self._on_fenced,
        )
        handlers = PartitionHandlers(partition, self.settings, node_id=self.node_id)
        responders = await handlers.serve(self.bus)
        live_task = asyncio.create_task(partition.publish_live(), name=f"live-{name}")
        self._served[name] = _Served(partition, responders, live_task)
        metrics.PARTITIONS.set(len(self._served))
        return partition

    def _on_fenced(self, partition: Partition, fatal: bool) -> None:
        """Stop answering a fenced partition's subjects, so requests find the real owner."""
        if fatal:
            self.failed.set()
        task = asyncio.get_running_loop().create_task(self._retire(partition))
        self._retiring.add(task)
        task.add_done_callback(self._retiring.discard)

    async def _retire(self, partition: Partition) -> None:
        async with self._locks.setdefault(partition.name, asyncio.Lock()):
            served = self._served.get(partition.name)
            if served is not None and served.partition is partition:
                await self._stop_serving(partition.name)

    async def _durability(self, name: TopicName) -> Durability:
        config = await self.store.get_model(meta_keys.topic_key(name.parent), TopicConfig)
        if config is None or (config.dispatch == "reliable" and config.durability == "fsync"):
            return Durability.FSYNC
        if config.dispatch == "non_reliable":
            return Durability.MEMORY
        return Durability.INTERVAL

    async def _stop_serving(self, name: TopicName) -> None:
        served = self._served.pop(name, None)
        if served is None:  # already retired
            return
        for responder in served.responders:
            await responder.drain()
        served.live_task.cancel()
        await asyncio.gather(served.live_task, return_exceptions=True)
        await served.partition.wal.close()
        metrics.PARTITIONS.set(len(self._served))

    async def hand_over(self, name: TopicName) -> None:
        """Stop serving ``name`` and delete our owner key, so the node it is assigned to
        can claim it (in-flight produces finish first: the responders drain)."""
        async with self._locks.setdefault(name, asyncio.Lock()):
            if name in self._served:
                log.info("handing %s over: it is assigned elsewhere", name)
                await self._stop_serving(name)
            if self.lease.alive:
                await ownership.release(self.store, self.node_id, name)

    async def resume_owned(self) -> None:
        """Take back the partitions etcd still lists as this node's (after a restart), but
        those now assigned to another node (the follower hands them over instead)."""
        for name in await ownership.owned_by(self.store, self.node_id):
            if self.follower.assigned_elsewhere(name):
                continue
            try:
                await self.ensure_serving(name)
            except Exception:
                log.exception("could not resume %s", name)

    async def watch_ownership(self, *, start_revision: int | None = None) -> None:
        """Fence a partition the moment its owner key stops naming this node's epoch (it
        was claimed elsewhere, or an operator deleted it): never two writers; and pass every
        change to the assignment follower. Runs until cancelled; a broken watch resumes
        where it stopped."""
        revision = start_revision
        failures = 0
        while True:
            try:
                async with self.store.watch_prefix(
                    meta_keys.partitions_prefix(), start_revision=revision
                ) as events:
                    async for event in events:
                        failures = 0
                        revision = event.mod_revision + 1
                        self._on_partition_event(event)
                        self.follower.on_event(event)
            except WatchError as exc:
                revision = exc.resume_revision or revision
            except MetaError as exc:
                log.warning("ownership watch failed: %s", exc)
            failures += 1
            await asyncio.sleep(min(5.0, 0.1 * 2**failures) * random.uniform(0.5, 1.0))

    def _on_partition_event(self, event: WatchEvent) -> None:
        name, record = meta_keys.parse_partition_key(event.key)
        served = self._served.get(name)
        if record != "owner" or served is None or served.partition.fenced:
            return
        if event.kind == "delete":
            served.partition.fence("its owner key was deleted")
            return
        owner = Owner.model_validate_json(event.value)
        if (owner.node_id, owner.epoch) != (self.node_id, served.partition.claim.epoch):
            served.partition.fence(f"now owned by {owner.node_id} (epoch {owner.epoch})")

    async def delete_local(self, name: TopicName) -> bool:
        """The partition's topic was deleted: stop serving it and remove its WAL directory.
        Idempotent; returns whether a directory was removed."""
        async with self._locks.setdefault(name, asyncio.Lock()):
            served = self._served.get(name)
            if served is not None:
                served.partition.fence("its topic was deleted")
                await self._stop_serving(name)
            directory = self.wal_dir(name)
            if not directory.exists():
                return False
            await asyncio.to_thread(shutil.rmtree, directory)
        log.info("deleted the WAL of %s", name)
        return True

    def fence_all(self, reason: str) -> None:
        for served in self._served.values():
            served.partition.fence(reason)

    async def close(self, *, release: bool) -> None:
        """Stop serving everything; ``release`` hands the partitions on (clean shutdown)."""
        await self.follower.close()
        for name in list(self._served):
            await self._stop_serving(name)
            if release and self.lease.alive:
                try:
                    await ownership.release(self.store, self.node_id, name)
                except Exception as exc:
                    log.warning("could not release %s: %s", name, exc)

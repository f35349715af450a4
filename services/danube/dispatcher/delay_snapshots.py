"""Delay snapshots, the I/O edge (the logic is danube.dispatcher.sealed, the format
danube.dispatcher.snapshot): one subscription's snapshots written to and read from the
mesh's object storage, under ``delayed/<ns>/<topic>/<sub>/<partition>/``.

- :meth:`DelaySnapshots.heads`: on a resume, the head and table of each stored snapshot, one
  ranged read each; one that cannot be read or fails its check is left out (its range is
  read from the log).
- :meth:`DelaySnapshots.seal_once`: every seal interval, each partition's seal buffer
  written as a snapshot, referenced once written; then the garbage deleted.
- :meth:`DelaySnapshots.load_once`: the parts of snapshots falling due within PREFETCH_MS,
  one ranged read each, checked; a part that fails sends its snapshot's range to the log.

Every call has the object store's deadline; reads run at most ``READS_MAX`` at a time.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping

from danube.dispatcher import metrics
from danube.dispatcher.delayed import DelayedMessages
from danube.dispatcher.sealed import Part, Sealed
from danube.dispatcher.snapshot import CorruptSnapshotError, SnapshotHead, check_bucket, read_head
from danube.meta import TopicName
from danube.meta.records import DelaySnapshotRef
from danube.storage import ObjectStore, StorageError

log = logging.getLogger(__name__)

READS_MAX = 8  # ranged reads under way at once, per subscription
_FAILURES = (StorageError, CorruptSnapshotError, TimeoutError)


def snapshot_prefix(topic: TopicName, sub: str) -> str:
    """Where the snapshots of subscription ``sub`` of ``topic`` go (no trailing ``/``)."""
    return f"delayed/{topic.namespace}/{topic.topic}/{sub}"


class DelaySnapshots:
    """Writes and reads the snapshots of one subscription, owned under the claim of etcd
    revision ``claim`` (in every key written: unique to one claim, where an epoch is not
    once the owner key went with its lease; a former owner never writes over, nor collects,
    a key of the new one)."""

    def __init__(self, objects: ObjectStore, prefix: str, claim: int) -> None:
        self.objects = objects
        self.prefix = prefix
        self.claim = claim
        self._reads = asyncio.Semaphore(READS_MAX)

    def key(self, sealed: Sealed) -> str:
        """The object key of a seal: sorts by partition, then offset."""
        return (
            f"{self.prefix}/{sealed.partition}/"
            f"{sealed.from_offset:020d}-{sealed.to_offset:020d}-{self.claim}.dly"
        )

    async def heads(self, refs: list[DelaySnapshotRef]) -> dict[str, SnapshotHead]:
        """The checked head of each of ``refs`` that could be read, by key."""

        async def one(ref: DelaySnapshotRef) -> tuple[str, SnapshotHead | None]:
            async with self._reads:
                try:
                    data = await self.objects.read_range(ref.key, 0, ref.head_bytes)
                    return ref.key, read_head(data)
                except _FAILURES as exc:
                    log.warning("delay snapshot %s unusable, read from the log: %s", ref.key, exc)
                    metrics.DELAYED_SNAPSHOTS.labels("read_failed").inc()
                    return ref.key, None

        found = await asyncio.gather(*(one(ref) for ref in refs))
        return {key: head for key, head in found if head is not None}

    async def seal_once(self, delayed: DelayedMessages, positions: Mapping[str, int]) -> set[str]:
        """Write the snapshot of each partition read past its last seal (``positions``:
        read positions by partition), delete the garbage; the partitions whose chain grew
        (their cursors are to be written)."""
        grown: set[str] = set()
        # Every partition sealed at once, before any write: a write waits, the readers file
        # on meanwhile, and a seal up to a position taken before that would hold messages
        # past its end (and the next one would start after them).
        seals = [delayed.seal(name, position) for name, position in positions.items()]
        for sealed in seals:
            if sealed is None:
                continue
            key = self.key(sealed)
            try:
                await self.objects.write(key, sealed.data)
            except (StorageError, TimeoutError) as exc:
                log.warning("delay snapshot %s not written (a hole: the log): %s", key, exc)
                metrics.DELAYED_SNAPSHOTS.labels("write_failed").inc()
                continue
            metrics.DELAYED_SNAPSHOTS.labels("written").inc()
            metrics.DELAYED_SNAPSHOT_BYTES.inc(len(sealed.data))
            ref = DelaySnapshotRef(
                key=key,
                from_offset=sealed.from_offset,
                to_offset=sealed.to_offset,
                due_max_ms=sealed.due_max_ms,
                head_bytes=sealed.head_bytes,
                size_bytes=len(sealed.data),
            )
            if delayed.sealed(sealed, ref):
                grown.add(sealed.partition)
            else:
                await self._delete(key)
        for ref in delayed.collect_garbage():
            await self._delete(ref.key)
        return grown

    async def _delete(self, key: str) -> None:
        try:
            await self.objects.delete(key)
            metrics.DELAYED_SNAPSHOTS.labels("deleted").inc()
        except (StorageError, TimeoutError) as exc:
            log.warning("delay snapshot %s not deleted: %s", key, exc)

    async def load_once(self, delayed: DelayedMessages, now_ms: int) -> int:
        """Load the snapshot parts falling due by ``now_ms`` (plus PREFETCH_MS); how many."""
        parts = delayed.wanted(now_ms)
        if parts:
            await asyncio.gather(*(self._load(delayed, part) for part in parts))
        return len(parts)

    async def _load(self, delayed: DelayedMessages, part: Part) -> None:
        entry = part.entry
        async with self._reads:
            try:
                data = await self.objects.read_range(part.key, entry.position, entry.length)
                delayed.loaded(part, check_bucket(entry, data))
            except _FAILURES as exc:
                log.warning("delay snapshot %s unusable, read from the log: %s", part.key, exc)
                metrics.DELAYED_SNAPSHOTS.labels("read_failed").inc()
                delayed.failed(part)


# How often the loader looks for parts falling due (it reads PREFETCH_MS ahead: seconds).
LOAD_INTERVAL_S = 0.1


async def seal_loop(
    snapshots: DelaySnapshots,
    delayed: DelayedMessages,
    positions: Callable[[], dict[str, int]],
    touch: Callable[[str], None],
    interval_s: float,
) -> None:
    """Seal every ``interval_s`` (``positions``: each partition's read position now);
    ``touch`` a partition whose chain grew, so its next cursor write stores it."""
    while True:
        await asyncio.sleep(interval_s)
        for name in await snapshots.seal_once(delayed, positions()):
            touch(name)


async def load_loop(
    snapshots: DelaySnapshots, delayed: DelayedMessages, wake: Callable[[], None]
) -> None:
    """Load the snapshot parts falling due; ``wake`` waiting polls after each load (the
    messages of a bucket that waited for it may be due)."""
    while True:
        if await snapshots.load_once(delayed, int(time.time() * 1000)):
            wake()
        else:
            await asyncio.sleep(LOAD_INTERVAL_S)

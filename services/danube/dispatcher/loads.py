"""The snapshot parts a resumed delay index loads (danube.dispatcher.sealed): per due bucket,
the parts of snapshots holding records of it, which are asked for PREFETCH_MS before the
bucket falls due, loaded (or failed), and merged into the index when it does. Pure
bookkeeping: the index (danube.dispatcher.delayed) merges the records, the I/O edge
(danube.dispatcher.delay_snapshots) reads the bytes.

A bucket with a part not loaded *waits*: the index does not take it (never early), and
says its time only once loaded. A snapshot whose part fails drops every part of it not
merged yet; its range is read from the log instead, for those parts' buckets only.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass

from danube.dispatcher.sealed import Part
from danube.dispatcher.snapshot import SnapshotHead
from danube.meta.records import DelaySnapshotRef


@dataclass(frozen=True, slots=True)
class Dropped:
    """A snapshot that failed: its range, to read from the log again for ``buckets`` (due at
    or after ``due_min_ms``), and how many records its dropped parts held."""

    partition: str
    from_offset: int
    to_offset: int
    due_min_ms: int
    buckets: frozenset[int]
    count: int


class SnapshotLoads:
    """The snapshot parts of one index, by bucket, from registered to merged."""

    def __init__(self) -> None:
        self._parts: dict[int, list[Part]] = {}  # by bucket
        self._waiting: dict[int, int] = {}  # by bucket: its parts not loaded yet
        self._asked: list[int] = []  # a heap of buckets with parts not asked for
        # Per partition, per snapshot key: its first offset (a bound of the partition's
        # delay_from while any part of it is not merged) and those parts.
        self._unmerged: dict[str, dict[str, tuple[int, list[Part]]]] = {}

    def add(
        self, partition: str, slot: int, ref: DelaySnapshotRef, head: SnapshotHead, bound: int
    ) -> dict[int, int]:
        """Register the parts of ``ref`` (its checked ``head``) holding records due at or
        after ``bound``; their buckets and record counts."""
        added: dict[int, int] = {}
        parts = []
        for entry in head.buckets:
            if (entry.bucket + 1) * 1000 <= bound:
                continue  # every record in it is due before the bound: delivered
            part = Part(partition, slot, ref.key, entry, ref.from_offset, ref.to_offset, bound)
            parts.append(part)
            self._parts.setdefault(entry.bucket, []).append(part)
            self._waiting[entry.bucket] = self._waiting.get(entry.bucket, 0) + 1
            heapq.heappush(self._asked, entry.bucket)
            added[entry.bucket] = added.get(entry.bucket, 0) + entry.count
        if parts:
            self._unmerged.setdefault(partition, {})[ref.key] = (ref.from_offset, parts)
        return added

    def waiting(self, bucket: int) -> bool:
        """Whether ``bucket`` has a part not loaded yet (it is not taken before)."""
        return bucket in self._waiting

    def ready(self, buckets: list[int]) -> list[int]:
        """Those of ``buckets`` not waiting."""
        return [bucket for bucket in buckets if bucket not in self._waiting]

    def wanted(self, until_ms: int) -> list[Part]:
        """The parts of buckets due by ``until_ms`` not asked for yet, earliest first."""
        asked, found = self._asked, []
        while asked and asked[0] * 1000 <= until_ms:
            for part in self._parts.get(heapq.heappop(asked), ()):
                if not part.requested:
                    part.requested = True
                    found.append(part)
        return found

    def loaded(self, part: Part, data: bytes) -> None:
        """``part``'s bytes, read and checked."""
        if not part.dropped:
            part.data = data
            self._done(part)

    def failed(self, part: Part) -> Dropped | None:
        """``part`` could not be read whole: every part of its snapshot not merged yet is
        dropped; what to read from the log instead (None: done already)."""
        held = self._unmerged.get(part.partition, {}).pop(part.key, None)
        if held is None or part.dropped:
            return None
        _, parts = held
        for dropped in parts:
            dropped.dropped = True
            self._parts[dropped.entry.bucket].remove(dropped)
            if dropped.data is None:
                self._done(dropped)
        return Dropped(
            part.partition,
            part.from_offset,
            part.to_offset,
            part.due_min_ms,
            frozenset(p.entry.bucket for p in parts),
            sum(p.entry.count for p in parts),
        )

    def take(self, bucket: int) -> list[Part]:
        """The parts of ``bucket``, falling due now (all loaded): to merge."""
        parts = self._parts.pop(bucket, [])
        for part in parts:
            unmerged = self._unmerged.get(part.partition, {})
            held = unmerged.get(part.key)
            if held is not None:
                held[1].remove(part)
                if not held[1]:
                    del unmerged[part.key]
        return parts

    def low_offset(self, partition: str) -> int | None:
        """The lowest first offset of ``partition``'s snapshots with parts not merged."""
        unmerged = self._unmerged.get(partition)
        return min((start for start, _ in unmerged.values()), default=None) if unmerged else None

    def drop_partition(self, partition: str) -> None:
        """A seek: its parts are no bound of delay_from any more (they are still loaded and
        merged, under a slot that drops their records)."""
        self._unmerged.pop(partition, None)

    def _done(self, part: Part) -> None:
        bucket = part.entry.bucket
        left = self._waiting.get(bucket, 0) - 1
        if left > 0:
            self._waiting[bucket] = left
        else:
            self._waiting.pop(bucket, None)

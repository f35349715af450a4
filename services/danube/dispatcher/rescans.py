"""The ranges of a subscription's partitions that its delay index reads from the log again
(danube.dispatcher.delayed, "Recovery"): a resumed subscription's delayed messages that no
sealed snapshot holds, and those of a snapshot that failed to load (for its buckets only).
Pure: the runtime does the reading, :meth:`Rescans.read` says which of the messages read
are to be filed again, the index files them.

Per partition the ranges are kept in offset order and read one after the other; until every
range of every partition is read, the due bound the cursor stored (``delay_due_ms``) holds.
"""

from __future__ import annotations

from dataclasses import dataclass

from danube.dispatcher.due_time import due_of
from danube.frame import RawFrame


@dataclass(slots=True)
class Rescan:
    """One range of a partition to read again."""

    position: int  # the next offset to read again
    end: int  # where this range ends (the last one: the stored cursor's next_offset)
    due_min_ms: int  # files again only what is due at or after this
    buckets: frozenset[int] | None = None  # and, when set, due in one of these buckets


class Rescans:
    """What is left to read again, per partition, and the due bound it keeps."""

    def __init__(self, bucket_ms: int) -> None:
        """``bucket_ms``: the span of the index's buckets (a range's ``buckets``)."""
        self._bucket_ms = bucket_ms
        self._ranges: dict[str, list[Rescan]] = {}  # per partition, in offset order
        self.restored_due_ms: int | None = None  # the stored bound until rescans end
        self.reread_frames = 0  # frames read from the log again since start

    def position(self, partition: str) -> int | None:
        """Where ``partition`` is read again from (None: not being read again)."""
        ranges = self._ranges.get(partition)
        return ranges[0].position if ranges else None

    def low_offset(self, partition: str) -> int | None:
        """The lowest offset of ``partition`` still to read again (None: none)."""
        ranges = self._ranges.get(partition)
        return min(rescan.position for rescan in ranges) if ranges else None

    def read(
        self, partition: str, messages: list[tuple[int, object]], next_offset: int
    ) -> tuple[list[tuple[int, int, RawFrame]], int]:
        """A read of ``partition`` again, from :meth:`position` (one must be under way) up
        to ``next_offset``: ``(offset, due_ms, frame)`` of each delayed message in the range
        read and due at or after its bound (a copy, to file again), and where the next read
        again starts (or the offset the last range stopped at)."""
        rescan = self._ranges[partition][0]
        end, buckets, bucket_ms = rescan.end, rescan.buckets, self._bucket_ms
        found: list[tuple[int, int, RawFrame]] = []
        for offset, payload in messages:
            if offset >= end:
                break
            if offset < rescan.position:
                continue
            self.reread_frames += 1
            due = due_of(payload)
            if due is None or due < rescan.due_min_ms or not isinstance(payload, RawFrame):
                continue
            if buckets is None or due // bucket_ms in buckets:
                found.append((offset, due, RawFrame(offset, memoryview(bytes(payload.data)))))
        return found, self._advance(partition, next_offset)

    def add(self, partition: str, added: list[Rescan]) -> None:
        """Read these ranges of ``partition`` again (in offset order with those pending);
        the due bound stored holds until every read again ends."""
        if not added:
            return
        ranges = self._ranges.setdefault(partition, [])
        ranges.extend(added)
        ranges.sort(key=lambda r: r.position)
        bound = min(rescan.due_min_ms for rescan in added)
        restored = self.restored_due_ms
        self.restored_due_ms = bound if restored is None else min(restored, bound)

    def _advance(self, partition: str, next_offset: int) -> int:
        """``partition``'s current range was read up to ``next_offset``: where the next read
        again starts (or the offset the last range stopped at)."""
        ranges = self._ranges[partition]
        rescan = ranges[0]
        end = rescan.end
        rescan.position = max(rescan.position, min(next_offset, end))
        if rescan.position < end:
            return rescan.position
        ranges.pop(0)
        if ranges:
            return ranges[0].position
        del self._ranges[partition]
        if not self._ranges:
            self.restored_due_ms = None
        return end

    def drop(self, partition: str) -> None:
        """A seek of ``partition``: nothing of it is read again."""
        self._ranges.pop(partition, None)

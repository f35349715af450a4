"""Segment files: their names, what the WAL knows of each, and the scan that checks one.

A segment is frames laid end to end in ``<first_offset:020>.wal`` (zero-padded, so names sort
by offset). Inside a segment, offsets are consecutive: the frame at byte 0 carries the offset in
the name and each next frame the offset after the previous one. Gaps (``advance_to``) only fall
between segments.

Each segment keeps a sparse index, ``(offset, position)`` marks at least
:data:`INDEX_EVERY_BYTES` apart, so a read seeks to the last mark at or before the offset it
wants and decodes forward at most that far. The writer builds the index of the segments it
writes; :func:`scan_segment` builds it for a segment found on disk (the last one at open, the
others lazily on first read).
"""

from __future__ import annotations

import re
import threading
from bisect import bisect_right
from dataclasses import dataclass, field
from operator import itemgetter
from pathlib import Path

from danube.frame import FRAME_HEADER, FRAME_HEADER_BYTES, scan_frames
from danube.ingest.wal.errors import WalCorruptionError
from danube.ingest.wal.fileops import FileOps

SEGMENT_SUFFIX = ".wal"
_SEGMENT_NAME = re.compile(r"^(\d{20})\.wal$")
_OFFSET_DIGITS = 20  # 2**64 - 1 has 20 digits: every u64 offset fits, and names sort by offset

INDEX_EVERY_BYTES = 64 * 1024
"""Spacing of the sparse index: a read decodes at most about this much it does not return."""
SCAN_CHUNK_BYTES = 4 * 1024 * 1024
"""A scan reads a segment in chunks this big (or one frame's worth, if larger)."""

_HEADER = FRAME_HEADER  # danube.frame's header: offset, length, crc
_first = itemgetter(0)


def segment_name(first_offset: int) -> str:
    """The file name of the segment whose first frame has ``first_offset``."""
    return f"{first_offset:0{_OFFSET_DIGITS}d}{SEGMENT_SUFFIX}"


def parse_segment_name(name: str) -> int | None:
    """The first offset a segment file name carries, or ``None`` if it is not a segment name."""
    match = _SEGMENT_NAME.match(name)
    if match is None:
        return None
    offset = int(match.group(1))
    return offset if offset < 2**64 else None


@dataclass(eq=False, slots=True)
class Segment:
    """What the WAL knows of one segment file.

    ``size_bytes`` is how far readers may read: the end of the last durable frame. For a sealed
    segment from an earlier run it is the file size until a scan replaces it with the end of
    the last good frame. ``next_offset`` (the offset after the last frame) is ``None`` until the
    segment was written in this run or scanned.
    """

    first_offset: int
    path: Path
    size_bytes: int
    next_offset: int | None = None
    index: list[tuple[int, int]] = field(default_factory=list)
    indexed: bool = False
    sealed: bool = True
    corruption: WalCorruptionError | None = None
    """Set by a scan that found a bad frame: nothing at or past its position is served."""
    scan_lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def name(self) -> str:
        """The file name."""
        return self.path.name

    def seek(self, offset: int) -> tuple[int, int]:
        """The last index mark ``(offset, position)`` at or before ``offset`` (else the first)."""
        index = self.index
        at = bisect_right(index, offset, key=_first)
        return index[max(at - 1, 0)] if index else (self.first_offset, 0)


@dataclass(frozen=True, slots=True)
class SegmentScan:
    """What :func:`scan_segment` found in one segment file."""

    good_end: int
    """Position just past the last good frame: where a torn or corrupt tail is cut."""
    next_offset: int
    """The offset after the last good frame (the segment's first offset if it has none)."""
    frame_count: int
    index: list[tuple[int, int]]
    file_bytes: int
    problem: str | None
    """Why the scan stopped before the end of the file; ``None`` if every byte was good."""
    torn: bool
    """The problem is an incomplete last frame (a write cut short), not corrupt bytes."""

    def corruption(self, segment: str) -> WalCorruptionError | None:
        """The scan's problem as the error a read of that point raises."""
        if self.problem is None:
            return None
        return WalCorruptionError(
            segment=segment, offset=self.next_offset, position=self.good_end, reason=self.problem
        )


def scan_segment(
    ops: FileOps, path: Path, first_offset: int, *, max_payload_bytes: int
) -> SegmentScan:
    """Read a whole segment and find where its good frames end; build its sparse index.

    A frame is good when its CRC matches, its length is within the limit and its offset is the
    one expected (the name's offset, then each previous + 1). Blocking: call from a thread.
    """
    file_bytes = ops.size(path)
    chunk_bytes = max(SCAN_CHUNK_BYTES, max_payload_bytes + FRAME_HEADER_BYTES)
    index: list[tuple[int, int]] = []
    pos, expected, count = 0, first_offset, 0
    next_mark = 0  # the position from which the next frame gets an index mark
    problem: str | None = None
    torn = False
    while pos < file_bytes:
        data = ops.read_at(path, pos, min(chunk_bytes, file_bytes - pos))
        if not data:
            break  # the file shrank under us: treat what was read as the end
        scan = scan_frames(data, max_payload_bytes=max_payload_bytes)
        walked = 0
        # scan_frames checked CRCs and lengths; walk the good headers for order and marks.
        while walked < scan.good_end:
            offset, length, _crc = _HEADER.unpack_from(data, walked)
            if offset != expected:
                problem = f"frame carries offset {offset} where {expected} was expected"
                break
            if pos + walked >= next_mark:
                index.append((offset, pos + walked))
                next_mark = pos + walked + INDEX_EVERY_BYTES
            expected += 1
            count += 1
            walked += FRAME_HEADER_BYTES + length
        pos += walked
        if problem is not None:
            break
        if scan.error is not None:
            problem = scan.error.reason
            break
        if scan.tail_bytes and pos + scan.tail_bytes >= file_bytes:
            problem = f"incomplete frame: {file_bytes - pos} bytes at the end of the file"
            torn = True
            break
        if walked == 0:  # a short read that cut the one frame: never loop on the same bytes
            problem = f"could not read a whole frame at byte {pos}"
            break
    return SegmentScan(pos, expected, count, index, file_bytes, problem, torn)


class SegmentSet:
    """The segments of one WAL in offset order, shared by the writer thread and readers.

    The lock guards the list's shape (the writer adds, ``drop_below`` removes, fetches take
    snapshots); the segments' fields are published by the event loop after each batch.
    """

    def __init__(self, segments: list[Segment]) -> None:
        self._segments = segments
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._segments)

    def first_offset(self) -> int | None:
        """The first offset of the oldest segment, ``None`` when there is none."""
        with self._lock:
            return self._segments[0].first_offset if self._segments else None

    def disk_bytes(self) -> int:
        """Bytes the segments hold (readable bytes; a torn tail in progress is not counted)."""
        with self._lock:
            return sum(segment.size_bytes for segment in self._segments)

    def names(self) -> list[str]:
        """The file names, oldest first."""
        with self._lock:
            return [segment.name for segment in self._segments]

    def oldest(self, limit: int) -> list[tuple[Segment, int | None]]:
        """``(segment, end offset)`` of the ``limit`` oldest segments, the end as
        :meth:`detach_below` sees it (``None``: the newest, not yet known)."""
        with self._lock:
            segments = self._segments
            found: list[tuple[Segment, int | None]] = []
            for at, segment in enumerate(segments[:limit]):
                end = segment.next_offset
                if end is None and at + 1 < len(segments):
                    end = segments[at + 1].first_offset
                found.append((segment, end))
            return found

    def add(self, segment: Segment) -> None:
        """Append a new newest segment (its first offset is past every other segment's)."""
        with self._lock:
            self._segments.append(segment)

    def plan(self, from_offset: int) -> list[tuple[Segment, int]]:
        """``(segment, readable end)`` for the segment holding ``from_offset`` and every later one.

        The ends are read now, on the event loop, together with the durable offset, so a read
        in a thread never goes past what was durable when the fetch began.
        """
        with self._lock:
            segments = self._segments
            at = bisect_right(segments, from_offset, key=lambda segment: segment.first_offset)
            return [(segment, segment.size_bytes) for segment in segments[max(at - 1, 0) :]]

    def with_successor(self, first_offset: int) -> tuple[Segment, int] | None:
        """The segment that starts at ``first_offset`` and its successor's first offset;
        None when there is no such segment or it is the newest (still written, or cut at
        open: never repaired)."""
        with self._lock:
            segments = self._segments
            at = bisect_right(segments, first_offset, key=lambda segment: segment.first_offset)
            if at == 0 or at >= len(segments) or segments[at - 1].first_offset != first_offset:
                return None
            return segments[at - 1], segments[at].first_offset

    def replace(self, old: Segment, new: Segment) -> bool:
        """Put ``new`` where ``old`` is (a repaired sealed segment); False if ``old`` left
        the set meanwhile (dropped)."""
        with self._lock:
            for at, segment in enumerate(self._segments):
                if segment is old:
                    self._segments[at] = new
                    return True
            return False

    def detach_below(self, offset: int) -> list[Segment]:
        """Remove (and return) the sealed segments whose every offset is below ``offset``.

        The newest segment always stays, so the WAL's position is never lost with its files.
        A segment's end is its known next offset, or else its successor's first offset.
        """
        with self._lock:
            count = self._count_below(offset)
            detached = self._segments[:count]
            del self._segments[:count]
            return detached

    def end_below(self, offset: int) -> int | None:
        """Where the WAL would start after :meth:`detach_below` of ``offset``; None if it
        would detach nothing."""
        with self._lock:
            count = self._count_below(offset)
            return self._segments[count].first_offset if count else None

    def _count_below(self, offset: int) -> int:
        segments = self._segments
        count = 0
        while count < len(segments) - 1:
            segment, successor = segments[count], segments[count + 1]
            end = successor.first_offset if segment.next_offset is None else segment.next_offset
            if not segment.sealed or end > offset:
                break
            count += 1
        return count

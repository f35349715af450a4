"""The thread side of the writer: owns the active segment file, encodes, writes, syncs, rotates.

Every method blocks and is called by the WAL's single writer task through ``asyncio.to_thread``,
one call at a time, so the file descriptor has exactly one user. Nothing here is published to
readers: the event loop publishes a batch's results (segment ends, the durable offset) once the
call returned, so a reader never sees bytes that were not durable.

The active segment's file is allocated ahead of its writes (``preallocate_bytes`` at a time,
zeros past the last frame): a write into blocks the file already has leaves its size alone,
so the fdatasync after it has less to commit (docs/wal.md, "Allocating ahead"). Sealing and
closing cut the file back to its last frame; after a crash, recovery drops the zeros.
"""

from __future__ import annotations

import errno
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from danube.frame.batch import FrameBatch
from danube.ingest.wal.checkpoint import CheckpointStore
from danube.ingest.wal.errors import DiskFullError
from danube.ingest.wal.fileops import FileOps
from danube.ingest.wal.options import Durability, WalOptions
from danube.ingest.wal.segment import INDEX_EVERY_BYTES, Segment, SegmentSet, segment_name

log = logging.getLogger(__name__)

_NO_ROOM = (errno.ENOSPC, errno.EDQUOT)
# A write of at least preallocate_bytes / APPEND_FRACTION is appended, not allocated ahead.
APPEND_FRACTION = 4


@dataclass(slots=True)
class BatchResult:
    """What one batch wrote: ``(segment, end position, next offset)`` for each segment touched."""

    touched: list[tuple[Segment, int, int]] = field(default_factory=list)
    frames: list[bytes] = field(default_factory=list)
    """The bytes written, one entry per write (in offset order): the batch's frames, which
    the live stream publishes as they are rather than framing the records again."""


class SegmentWriter:
    """Writes batches of frames into the active segment, starting new segments as needed."""

    def __init__(
        self,
        ops: FileOps,
        directory: Path,
        options: WalOptions,
        segments: SegmentSet,
        checkpoints: CheckpointStore,
        clock: Callable[[], float],
    ) -> None:
        self._ops = ops
        self._dir = directory
        self._options = options
        self._segments = segments
        self._checkpoints = checkpoints
        self._clock = clock
        self._fsync_each_batch = options.durability is Durability.FSYNC
        self.active: Segment | None = None  # after an open, the first write starts a segment
        self._fd: int | None = None
        self._written = 0  # bytes written to the active segment
        self._allocated = 0  # how far its file may reach (allocated ahead of the writes)
        # Writes this large go as appends, not allocated ahead: zeros written before them
        # would double their bytes on the disk, for a metadata commit that their size
        # makes small anyway (a batch of a thousand messages, a follower catching up).
        self._append_from = options.preallocate_bytes // APPEND_FRACTION
        self._next = 0  # the offset the active segment's next frame must carry
        self._next_mark = 0  # the position from which the next frame gets an index mark
        self.created_at = 0.0  # clock() when the active segment was created
        self.unsynced = False  # bytes written since the last fdatasync
        self.last_sync_at = clock()
        # Counters, written by the writer thread only.
        self.fsyncs = 0
        self.bytes_written = 0
        self.rotations = 0

    def age_due(self) -> float | None:
        """Clock time when the active segment must be sealed for its age (``None``: never)."""
        max_age_s = self._options.rotation_max_age_s
        if self.active is None or max_age_s is None:
            return None
        return self.created_at + max_age_s

    def write_batch(self, groups: Sequence[tuple[int, FrameBatch]]) -> BatchResult:
        """Write ``(first offset, frames)`` groups in order with one write per segment.

        Each group's frames get their offsets and CRCs where they lie (``FrameBatch.seal``)
        and are written from its buffer as they are. A group that does not follow the active
        segment's last offset (``advance_to`` made a gap) and a frame that would take the
        segment past ``rotation_max_bytes`` seal it and start a new one. With ``fsync``
        durability, the batch is fdatasync'ed before returning.
        :class:`DiskFullError` when there is no room: nothing of the batch stays on disk.
        """
        size = sum(frames.nbytes for _, frames in groups)
        self._ops.check_room(self._dir, size)  # DiskFullError before anything is touched
        limit = self._options.max_frame_payload_bytes
        for first, frames in groups:
            frames.seal(first, max_payload_bytes=limit)
        result = BatchResult()
        try:
            self._write_groups(groups, result)
        except OSError as exc:
            if exc.errno not in _NO_ROOM or result.touched:
                raise  # a batch that reached a sealed segment cannot be taken back: fail
            self._cut_back()
            raise DiskFullError(
                wal_dir=str(self._dir), free_bytes=self._free_bytes(), needed_bytes=size
            ) from exc
        if self._fsync_each_batch and self.unsynced:
            self.sync()
        return result

    def _write_groups(self, groups: Sequence[tuple[int, FrameBatch]], result: BatchResult) -> None:
        due = self.age_due()
        if due is not None and self._clock() >= due:
            self.seal("age")
        max_bytes = self._options.rotation_max_bytes
        pieces: list[memoryview] = []  # what the active segment's next write holds
        segment = self.active
        pos = self._written  # position in the active segment of the next frame
        next_offset = self._next
        next_mark = self._next_mark
        for first, frames in groups:
            view = memoryview(frames.buf)
            offset = first
            run_start = run_end = -1  # the frames of this group that go in one piece
            for start, end in zip(frames.starts, frames.ends, strict=True):
                frame_bytes = end - start
                if (
                    segment is None
                    or offset != next_offset
                    or (pos and pos + frame_bytes > max_bytes)
                ):
                    if run_end >= 0:
                        pieces.append(view[run_start:run_end])
                        run_end = -1
                    if segment is not None:
                        self._flush(pieces, result, next_offset)
                        pieces = []
                        self.seal("gap" if offset != next_offset else "size")
                    segment = self._start(offset)
                    pos, next_mark = 0, 0
                if pos >= next_mark:
                    segment.index.append((offset, pos))
                    next_mark = pos + INDEX_EVERY_BYTES
                if start != run_end:
                    if run_end >= 0:
                        pieces.append(view[run_start:run_end])
                    run_start = start
                run_end = end
                pos += frame_bytes
                offset += 1
                next_offset = offset
            if run_end >= 0:
                pieces.append(view[run_start:run_end])
        self._flush(pieces, result, next_offset)
        self._next_mark = next_mark

    def _cut_back(self) -> None:
        """A write ran out of room: cut the active segment back to its last whole batch
        (and whatever was allocated ahead); the index marks the failed batch added go too."""
        segment = self.active
        if segment is None:
            return
        self._ops.truncate(segment.path, self._written)
        self._allocated = self._written
        index = segment.index
        while index and index[-1][1] >= self._written:
            index.pop()

    def _free_bytes(self) -> int:
        try:
            return self._ops.free_bytes(self._dir)
        except OSError:
            return 0

    def _flush(self, pieces: list[memoryview], result: BatchResult, next_offset: int) -> None:
        """Write ``pieces`` (whole frames, in offset order) at the end of the active segment
        in one write and note how far it now reaches."""
        if self._fd is None or self.active is None or not pieces:
            return
        # The one copy of the frames on the way: the bytes written are kept (the cache and
        # the live stream take them as they are). A produce body's frames lie end to end:
        # one piece.
        data = bytes(pieces[0]) if len(pieces) == 1 else b"".join(pieces)
        if self._written + len(data) > self._allocated and len(data) < self._append_from:
            self._allocate(self._written + len(data))
        self._ops.write_at(self._fd, data, self._written)
        result.frames.append(data)
        self._written += len(data)
        self._next = next_offset
        self.bytes_written += len(data)
        self.unsynced = True
        result.touched.append((self.active, self._written, next_offset))

    def _allocate(self, end: int) -> None:
        """Allocate the active segment's file from where it was allocated to past ``end``, by
        ``preallocate_bytes`` (within ``rotation_max_bytes``). Best effort: with no room (or
        allocation refused) the write goes on without, as an append."""
        ahead = self._options.preallocate_bytes
        if ahead <= 0 or self._fd is None:
            return
        start = max(self._allocated, self._written)
        stop = max(min(end + ahead, self._options.rotation_max_bytes), end)
        self._allocated = stop  # the file may reach this far even if the call fails part way
        try:
            self._ops.allocate(self._fd, start, stop - start)
        except OSError as exc:
            level = logging.DEBUG if exc.errno in _NO_ROOM else logging.WARNING
            log.log(
                level, "WAL segment not allocated ahead: %s", exc, extra={"wal_dir": str(self._dir)}
            )

    def _trim(self) -> None:
        """Cut the active segment's file back to its last frame (drop what was allocated
        ahead), durably: a sealed or closed segment's file ends where its frames do."""
        segment = self.active
        if segment is not None and self._allocated > self._written:
            self._ops.truncate(segment.path, self._written)
        self._allocated = self._written

    def _start(self, first_offset: int) -> Segment:
        """Create the segment file and make its directory entry durable before any frame."""
        path = self._dir / segment_name(first_offset)
        fd = self._ops.create(path, exclusive=True)
        try:
            self._ops.fsync_dir(self._dir)
        except OSError:
            # Not a segment yet: leave no file that would block the next try (O_EXCL).
            self._ops.close(fd)
            self._ops.remove(path)
            raise
        self._fd = fd
        segment = Segment(first_offset, path, 0, first_offset, indexed=True, sealed=False)
        self._segments.add(segment)
        self.active = segment
        self._written = 0
        self._allocated = 0
        self._next = first_offset
        self._next_mark = 0
        self.created_at = self._clock()
        return segment

    def sync(self) -> None:
        """fdatasync the active segment if anything was written since the last sync."""
        if self._fd is not None and self.unsynced:
            self._ops.fdatasync(self._fd)
            self.fsyncs += 1
        self.unsynced = False
        self.last_sync_at = self._clock()

    def seal(self, reason: str) -> None:
        """Make the active segment durable, close it and checkpoint; the next write starts anew."""
        segment = self.active
        if segment is None or self._fd is None:
            return
        self.sync()
        self._trim()
        self._ops.close(self._fd)
        self._fd = None
        self.active = None
        segment.sealed = True
        self.rotations += 1
        first = self._segments.first_offset()
        self._checkpoints.write(
            start_offset=segment.first_offset if first is None else first, next_offset=self._next
        )
        log.debug(
            "sealed WAL segment",
            extra={"segment": segment.name, "reason": reason, "size_bytes": self._written},
        )

    def close(self) -> None:
        """Final fdatasync and close of the active segment (it stays the newest, unsealed)."""
        if self._fd is None:
            return
        try:
            self.sync()
            self._trim()
        finally:
            self._ops.close(self._fd)
            self._fd = None

    def abandon(self) -> None:
        """Close the descriptor without syncing: after a failure, nothing more is trusted."""
        if self._fd is not None:
            fd, self._fd = self._fd, None
            try:
                self._ops.close(fd)
            except OSError:
                log.warning("closing a failed WAL segment failed", exc_info=True)

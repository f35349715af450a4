"""Opening a WAL directory: find the segments, cut a torn or corrupt tail, learn the offsets.

Rules (docs/wal.md, "Recovery"):

1. Temp files (``*.tmp``: a checkpoint write cut by a crash) are removed.
2. Segments wholly below the checkpoint's start offset (a ``drop_below`` cut by a crash after
   its checkpoint) are removed; the newest segment always stays.
3. Only the last segment is scanned: every frame's CRC, length and offset order. The file is
   truncated (and fsynced) just after the last good frame, and the cut is logged, unless
   everything past that frame is zeros: the file was allocated ahead of its writes
   (danube.ingest.wal.writer) and the crash came before it was cut back, so nothing written
   is cut. A last segment left with no frame is removed. Earlier segments were fsynced (and
   cut back to their last frame) when sealed and are checked when first read.
4. ``next_offset = max(last frame + 1, checkpoint floor, first offset of the last segment)``;
   ``start_offset`` is the first segment's first offset (or the checkpoint's start if larger).

Blocking code: the WAL runs :func:`recover` in a worker thread.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

from danube.ingest.wal.checkpoint import TEMP_SUFFIX, Checkpoint, CheckpointStore
from danube.ingest.wal.fileops import FileOps
from danube.ingest.wal.segment import Segment, SegmentScan, parse_segment_name, scan_segment

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class TailCut:
    """A cut made at open: which segment, where, how many bytes, and why."""

    segment: str
    position: int
    bytes_cut: int
    reason: str


@dataclass(frozen=True, slots=True)
class Recovered:
    """The state of a WAL directory after recovery."""

    segments: list[Segment]
    next_offset: int
    start_offset: int
    checkpoint: Checkpoint | None
    cut: TailCut | None


def recover(
    ops: FileOps, directory: Path, checkpoints: CheckpointStore, *, max_payload_bytes: int
) -> Recovered:
    """Apply the recovery rules to ``directory`` (created if missing) and report its state."""
    try:
        names = ops.listdir(directory)
    except FileNotFoundError:
        ops.makedirs(directory)
        ops.fsync_dir(directory.parent)  # the new directory's own entry must survive a crash
        names = []
    dirty = False  # the directory changed: fsync it once at the end
    for name in names:
        if name.endswith(TEMP_SUFFIX):
            log.info("removing a leftover WAL temp file", extra={"file": name})
            ops.remove(directory / name)
            dirty = True
    checkpoint = checkpoints.load()
    found = sorted(
        (offset, name) for name in names if (offset := parse_segment_name(name)) is not None
    )
    if checkpoint is not None:
        # Finish a drop_below cut short: its checkpoint already moved the start past these.
        while len(found) > 1 and found[1][0] <= checkpoint.start_offset:
            log.info("removing a WAL segment below the start", extra={"segment": found[0][1]})
            ops.remove(directory / found.pop(0)[1])
            dirty = True
    segments = [
        Segment(offset, directory / name, ops.size(directory / name)) for offset, name in found
    ]
    cut = None
    next_offset = 0 if checkpoint is None else checkpoint.next_offset
    if segments:
        last = segments[-1]
        next_offset = max(next_offset, last.first_offset)
        scan = scan_segment(ops, last.path, last.first_offset, max_payload_bytes=max_payload_bytes)
        cut = _tail_cut(ops, last, scan)
        if scan.frame_count == 0:
            ops.remove(last.path)  # a segment holds at least one frame
            segments.pop()
            dirty = True
        else:
            # Truncating to the good end also fdatasyncs what an `interval` WAL left unsynced.
            ops.truncate(last.path, scan.good_end)
            last.size_bytes = scan.good_end
            last.next_offset = scan.next_offset
            last.index = scan.index
            last.indexed = True
            next_offset = max(next_offset, scan.next_offset)
    if dirty:
        ops.fsync_dir(directory)
    start_offset = segments[0].first_offset if segments else next_offset
    if checkpoint is not None:
        start_offset = max(start_offset, checkpoint.start_offset)
    return Recovered(segments, next_offset, min(start_offset, next_offset), checkpoint, cut)


def _tail_cut(ops: FileOps, last: Segment, scan: SegmentScan) -> TailCut | None:
    """What the scan of the last segment found past its good frames, logged: a cut (torn or
    bad bytes), or None (nothing, or only the zeros it was allocated ahead with)."""
    if scan.problem is None:
        return None
    if _zeros(ops, last.path, scan.good_end, scan.file_bytes):
        log.debug(
            "dropped the zeros allocated ahead in WAL segment %s from byte %d",
            last.name,
            scan.good_end,
        )
        return None
    cut = TailCut(last.name, scan.good_end, scan.file_bytes - scan.good_end, scan.problem)
    log.warning(
        "cut the tail of WAL segment %s at byte %d (%d bytes): %s",
        cut.segment,
        cut.position,
        cut.bytes_cut,
        cut.reason,
        extra={
            "segment": cut.segment,
            "position": cut.position,
            "bytes_cut": cut.bytes_cut,
            "reason": cut.reason,
            "torn": scan.torn,
        },
    )
    return cut


_ZERO_CHUNK_BYTES = 1 << 20


def _zeros(ops: FileOps, path: Path, start: int, end: int) -> bool:
    """Whether bytes ``[start, end)`` of the file are all zero (and there are some)."""
    if start >= end:
        return False
    while start < end:
        chunk = ops.read_at(path, start, min(_ZERO_CHUNK_BYTES, end - start))
        if not chunk or chunk.count(0) != len(chunk):
            return False
        start += len(chunk)
    return True

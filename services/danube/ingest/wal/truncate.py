"""Cutting a closed WAL back to an offset: what a follower does where its log diverged from
its new leader's (docs/replication.md). Blocking: run it in a worker thread, WAL closed.

Order matters for crashes: the checkpoint's next-offset floor is lowered first (a floor left
above the cut would make the next open believe in offsets that are gone), then whole
segments at or past the cut go, newest first, then the segment holding the cut is truncated
at the cut frame's position and fsynced. A crash part-way leaves a longer log, never a
shorter or a holed one; the follower compares histories again on its next start.
"""

from __future__ import annotations

import logging
from pathlib import Path

from danube.frame import FRAME_HEADER, FRAME_HEADER_BYTES
from danube.ingest.wal.checkpoint import (
    CHECKPOINT_NAME,
    Checkpoint,
    CheckpointStore,
    atomic_write,
    encode_checkpoint,
)
from danube.ingest.wal.fileops import FileOps
from danube.ingest.wal.segment import parse_segment_name, scan_segment

log = logging.getLogger(__name__)

_HEADER = FRAME_HEADER  # danube.frame's header: offset, length, crc


def truncate_dir(ops: FileOps, directory: Path, end: int, *, max_payload_bytes: int) -> int:
    """Remove every frame at or past offset ``end``; return how many frames went."""
    try:
        names = ops.listdir(directory)
    except FileNotFoundError:
        return 0
    checkpoint = CheckpointStore(ops, directory).load()
    if checkpoint is not None and checkpoint.next_offset > end:
        lowered = Checkpoint(min(checkpoint.start_offset, end), end, checkpoint.updated_ms)
        atomic_write(directory / CHECKPOINT_NAME, encode_checkpoint(lowered), ops=ops)
    found = sorted(
        (offset, name) for name in names if (offset := parse_segment_name(name)) is not None
    )
    removed = 0
    while found and found[-1][0] >= end:
        offset, name = found.pop()
        scan = scan_segment(ops, directory / name, offset, max_payload_bytes=max_payload_bytes)
        removed += scan.frame_count
        ops.remove(directory / name)
    ops.fsync_dir(directory)
    if found:
        offset, name = found[-1]
        path = directory / name
        scan = scan_segment(ops, path, offset, max_payload_bytes=max_payload_bytes)
        if scan.next_offset > end:
            position = _position_of(ops, path, end, scan.index)
            removed += scan.next_offset - end
            ops.truncate(path, position)
    if removed:
        log.warning(
            "truncated %d frames at and past offset %d",
            removed,
            end,
            extra={"wal_dir": str(directory), "end": end, "frames": removed},
        )
    return removed


def _position_of(ops: FileOps, path: Path, offset: int, index: list[tuple[int, int]]) -> int:
    """The byte position of the frame carrying ``offset`` (the scan found it good)."""
    mark_offset, position = index[0]
    for mark in index:
        if mark[0] > offset:
            break
        mark_offset, position = mark
    while mark_offset < offset:
        header = ops.read_at(path, position, FRAME_HEADER_BYTES)
        found, length, _crc = _HEADER.unpack(header)
        assert found == mark_offset, f"frame {found} where {mark_offset} was scanned"
        position += FRAME_HEADER_BYTES + length
        mark_offset += 1
    return position

"""Repairing a sealed segment from another copy: find where its good frames end, then
rewrite it as that good prefix followed by the frames another replica holds intact.

Blocking code, run in a worker thread by :meth:`Wal.find_damage` and
:meth:`Wal.repair_segment` (docs/wal.md, "Repair"). The rewrite is crash-safe and never
touches the intact bytes in place:

1. the new file is written beside the old one (``<segment>.repair.tmp``): the good prefix,
   copied from the old file, then the other copy's frames, then fdatasync'ed;
2. the new file is checked as a sealed segment is (CRC, lengths, consecutive offsets from
   the name's) and must end exactly where the damaged range ended;
3. it is renamed over the old file and the directory is fsynced.

A crash before the rename leaves the old file as it was and a ``*.tmp`` that the next
open removes; after it, the repaired file. A reader that opened the old file before the
rename reads the same good prefix (byte for byte) and stops at the damage, as before.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from danube.frame import CorruptFrameError, decode_frames
from danube.ingest.wal.errors import WalError
from danube.ingest.wal.fileops import FileOps
from danube.ingest.wal.segment import SCAN_CHUNK_BYTES, Segment, scan_segment

REPAIR_SUFFIX = ".repair.tmp"


@dataclass(frozen=True, slots=True)
class SegmentDamage:
    """A sealed segment's damage: its frames from ``bad_offset`` to its end (``end_offset``,
    its successor's first offset) cannot be trusted; bytes before ``good_end`` are good."""

    segment: str
    first_offset: int
    bad_offset: int
    end_offset: int
    good_end: int
    reason: str


class RepairRefusedError(WalError):
    """The frames offered do not repair the segment (wrong offsets, a bad frame, not
    reaching its end), or the segment changed since its damage was found."""

    code = "repair_refused"
    retriable = True


def find_damage(
    ops: FileOps, segment: Segment, end_offset: int, *, max_payload_bytes: int
) -> SegmentDamage | None:
    """Scan ``segment`` (sealed; its successor starts at ``end_offset``) afresh: its damage,
    or None when every frame is good."""
    scan = scan_segment(
        ops, segment.path, segment.first_offset, max_payload_bytes=max_payload_bytes
    )
    if scan.problem is None or scan.next_offset >= end_offset:
        return None
    return SegmentDamage(
        segment.name,
        segment.first_offset,
        scan.next_offset,
        end_offset,
        scan.good_end,
        scan.problem,
    )


def check_frames(frames: bytes, damage: SegmentDamage, *, max_payload_bytes: int) -> int:
    """Check the other copy's whole frames for ``damage``: intact, consecutive from its bad
    offset, none at or past its end; the offset after the last (they may stop short of the
    end only where the log has a gap, which the caller knows from the copy's answer)."""
    try:
        decoded, consumed = decode_frames(frames, max_payload_bytes=max_payload_bytes)
    except CorruptFrameError as exc:
        raise RepairRefusedError(
            f"{damage.segment}: a bad frame from the other copy: {exc}"
        ) from exc
    if consumed != len(frames) or not decoded:
        raise RepairRefusedError(f"{damage.segment}: the other copy's frames are incomplete")
    expected = damage.bad_offset
    for frame in decoded:
        if frame.offset != expected:
            raise RepairRefusedError(
                f"{damage.segment}: the other copy sent offset {frame.offset} where "
                f"{expected} was expected"
            )
        expected += 1
    if expected > damage.end_offset:
        raise RepairRefusedError(f"{damage.segment}: the other copy's frames run past its end")
    return expected


def rewrite_segment(
    ops: FileOps, segment: Segment, damage: SegmentDamage, frames: bytes, *, max_payload_bytes: int
) -> Segment:
    """Replace ``segment``'s file by its good prefix followed by ``frames`` (checked with
    :func:`check_frames`); the repaired segment as the WAL should now know it."""
    expected_end = check_frames(frames, damage, max_payload_bytes=max_payload_bytes)
    again = find_damage(ops, segment, damage.end_offset, max_payload_bytes=max_payload_bytes)
    if again != damage:  # written over meanwhile, or damaged further: find it again
        raise RepairRefusedError(f"{damage.segment} changed since its damage was found")
    temp = segment.path.with_name(segment.name + REPAIR_SUFFIX)
    try:
        _write(ops, segment.path, temp, damage.good_end, frames)
        scan = scan_segment(ops, temp, segment.first_offset, max_payload_bytes=max_payload_bytes)
        if scan.problem is not None or scan.next_offset != expected_end:
            raise RepairRefusedError(
                f"{damage.segment}: the repaired file does not check ({scan.problem}, ends at "
                f"{scan.next_offset}, not {expected_end})"
            )
        ops.replace(temp, segment.path)
    except BaseException:
        ops.remove(temp)
        raise
    ops.fsync_dir(segment.path.parent)
    return Segment(
        segment.first_offset,
        segment.path,
        scan.good_end,
        next_offset=scan.next_offset,
        index=scan.index,
        indexed=True,
        sealed=True,
    )


def _write(ops: FileOps, source: Path, temp: Path, prefix_bytes: int, frames: bytes) -> None:
    """The good prefix of ``source`` then ``frames`` into ``temp``, durably."""
    fd = ops.create(temp, exclusive=False)
    try:
        position = 0
        while position < prefix_bytes:
            chunk = ops.read_at(source, position, min(SCAN_CHUNK_BYTES, prefix_bytes - position))
            if not chunk:
                raise RepairRefusedError(f"{source.name} shrank while it was repaired")
            ops.write(fd, chunk)
            position += len(chunk)
        ops.write(fd, frames)
        ops.fdatasync(fd)
    finally:
        ops.close(fd)

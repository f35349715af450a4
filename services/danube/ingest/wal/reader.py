"""Reading messages back from segment files: seek by the sparse index, decode, check everything.

Blocking code, run in a worker thread by :meth:`Wal.fetch`. Every frame read is checked (CRC,
length, and that its offset is the one expected at that place); on the first bad frame the read
stops. Messages before it are returned; a read that starts at it raises
:class:`WalCorruptionError`. A reader never returns a byte it could not verify.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

from danube.frame import FRAME_HEADER, FRAME_HEADER_BYTES, CorruptFrameError, Frame, decode_frames
from danube.ingest.wal.errors import WalCorruptionError
from danube.ingest.wal.fileops import FileOps
from danube.ingest.wal.segment import INDEX_EVERY_BYTES, Segment, scan_segment

log = logging.getLogger(__name__)

MIN_READ_BYTES = 64 * 1024
MAX_READ_BYTES = 4 * 1024 * 1024
"""One pread is at most this big (unless one frame is bigger): bounds a fetch's buffer."""

_HEADER = FRAME_HEADER  # danube.frame's header: offset, length, crc


@dataclass(slots=True)
class _Budget:
    """What a fetch may still return, and what it has gathered."""

    limit_offset: int  # offsets at or past this are not served (not durable yet)
    max_bytes: int
    max_count: int
    messages: list[tuple[int, memoryview]]  # (offset, the whole frame as read)
    payload_bytes: int = 0

    def full(self) -> bool:
        return len(self.messages) >= self.max_count or (
            bool(self.messages) and self.payload_bytes >= self.max_bytes
        )

    def take(self, frame: Frame, whole: memoryview) -> bool:
        """Add one message unless it would break ``max_bytes`` (the first always fits).
        ``whole`` is the checked frame, header included, as read: kept as is (a view of the
        read buffer, no copy), so the fetch reply carries the very bytes of the WAL."""
        size = len(frame.payload)
        if self.messages and self.payload_bytes + size > self.max_bytes:
            return False
        self.messages.append((frame.offset, whole))
        self.payload_bytes += size
        return True


def ensure_indexed(ops: FileOps, segment: Segment, *, max_payload_bytes: int) -> None:
    """Scan a sealed segment from an earlier run once, to learn its index, end and last offset."""
    if segment.indexed:
        return
    with segment.scan_lock:  # two fetches must not scan the same file twice
        if segment.indexed:
            return
        scan = scan_segment(
            ops, segment.path, segment.first_offset, max_payload_bytes=max_payload_bytes
        )
        segment.index = scan.index
        segment.next_offset = scan.next_offset
        segment.size_bytes = scan.good_end
        segment.corruption = scan.corruption(segment.name)
        if scan.problem is not None:
            log.error(
                "corrupt sealed WAL segment",
                extra={
                    "segment": segment.name,
                    "position": scan.good_end,
                    "offset": scan.next_offset,
                    "reason": scan.problem,
                },
            )
        segment.indexed = True


def _copy(error: WalCorruptionError, resume_offset: int) -> WalCorruptionError:
    # A fresh instance per raise: re-raising one stored instance would pile up tracebacks.
    copy = WalCorruptionError(
        segment=error.segment, offset=error.offset, position=error.position, reason=error.reason
    )
    copy.resume_offset = resume_offset
    return copy


def read_messages(
    ops: FileOps,
    plan: Sequence[tuple[Segment, int]],
    from_offset: int,
    *,
    limit_offset: int,
    max_bytes: int,
    max_count: int,
    max_payload_bytes: int,
) -> tuple[list[tuple[int, memoryview]], int]:
    """Messages from ``from_offset`` on, across the planned ``(segment, readable end)`` pairs.

    Returns the messages, ``(offset, whole frame as read)`` (CRC checked here, once), and
    the offset to read next: after the last one returned, or past a gap that was skipped.
    Raises :class:`WalCorruptionError` when the very first message to return sits at or past
    a bad frame.
    """
    budget = _Budget(limit_offset, max_bytes, max_count, [])
    want = from_offset
    for at, (segment, planned_end) in enumerate(plan):
        # Nothing past a bad frame of a segment is trusted: the damage runs to the next one.
        resume = plan[at + 1][0].first_offset if at + 1 < len(plan) else limit_offset
        ensure_indexed(ops, segment, max_payload_bytes=max_payload_bytes)
        bad = segment.corruption
        if bad is not None and bad.offset is not None and want >= bad.offset:
            if budget.messages:
                break
            raise _copy(bad, resume)
        if segment.next_offset is not None and want >= segment.next_offset:
            continue  # everything asked for is past this segment
        want = max(want, segment.first_offset)  # a gap before this segment is skipped
        if want >= limit_offset:
            break
        end = min(planned_end, segment.size_bytes)
        try:
            want, whole = _read_segment(ops, segment, end, want, budget, max_payload_bytes)
        except WalCorruptionError as exc:
            exc.resume_offset = resume
            raise
        if not whole or want >= limit_offset:
            break
        if bad is not None:  # stopped at a known bad frame with something to return
            break
    else:
        # Every durable frame lives in the planned segments: what is left below the limit
        # is a gap (advance_to), so the next fetch may start at the limit.
        want = max(want, limit_offset)
    return budget.messages, want


def _read_segment(
    ops: FileOps, segment: Segment, end: int, want: int, budget: _Budget, max_payload_bytes: int
) -> tuple[int, bool]:
    """Gather messages ``>= want`` from one segment up to byte ``end``.

    Returns the offset to read next and whether the segment was read to its end (False when
    the budget filled up or a bad frame stopped the read: the next segment must not be read).
    """
    expected, pos = segment.seek(want)
    min_size = 0  # set when one frame is larger than the last read: read at least that much
    while pos < end and not budget.full():
        # Enough for what the budget still takes, plus the frames between the mark and `want`.
        size = (
            (INDEX_EVERY_BYTES if expected < want else 0) + budget.max_bytes - budget.payload_bytes
        )
        size = min(end - pos, max(MIN_READ_BYTES, min(size, MAX_READ_BYTES), min_size))
        data = ops.read_at(segment.path, pos, size)
        frames, good_end, problem = _decode(data, max_payload_bytes)
        view = memoryview(data)
        if not frames and problem is None:
            problem, needed = _incomplete(data, pos, end)
            if problem is None and min_size == 0:
                min_size = needed  # retry once with a read of the whole frame
                continue
            problem = problem or f"short read: {len(data)} of {needed} bytes at {pos}"
        min_size = 0
        at = 0
        for frame in frames:
            if frame.offset != expected:
                problem = f"frame carries offset {frame.offset} where {expected} was expected"
                good_end = at
                break
            if frame.offset >= budget.limit_offset:
                return expected, False
            if frame.offset >= want and not budget.take(frame, view[at : at + frame.size_bytes]):
                return expected, False
            expected += 1
            at += frame.size_bytes
            if budget.full():
                return expected, False
        if problem is not None:
            if budget.messages:
                return expected, False  # serve what was good; a fetch from here raises
            raise WalCorruptionError(
                segment=segment.name, offset=expected, position=pos + good_end, reason=problem
            )
        pos += good_end
    return max(expected, want), not budget.full()


def _decode(data: bytes, max_payload_bytes: int) -> tuple[list[Frame], int, str | None]:
    """Good frames of ``data``, where they end, and why decoding stopped early (if it did)."""
    try:
        frames, good_end = decode_frames(data, max_payload_bytes=max_payload_bytes)
    except CorruptFrameError as exc:
        frames, good_end = decode_frames(data[: exc.position], max_payload_bytes=max_payload_bytes)
        return frames, good_end, exc.reason
    return frames, good_end, None


def _incomplete(data: bytes, pos: int, end: int) -> tuple[str | None, int]:
    """Why no frame decoded at ``pos``, or ``(None, bytes needed)`` if the read was too short."""
    if len(data) < FRAME_HEADER_BYTES:
        return f"incomplete frame header: {len(data)} bytes before the end of the segment", 0
    _offset, length, _crc = _HEADER.unpack_from(data, 0)
    needed = FRAME_HEADER_BYTES + length
    if pos + needed > end or needed <= len(data):
        # Past the readable end (a torn frame), or the file gave fewer bytes than it holds.
        got = len(data) - FRAME_HEADER_BYTES
        return f"incomplete frame: {length} payload bytes announced, {got} read", 0
    return None, needed

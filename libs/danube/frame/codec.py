"""Frames: the unit of the WAL and of object storage, and their streaming decoder.

Wire layout of one frame, all integers little-endian (docs/formats.md has the full story)::

    byte  size  field
    0     8     offset   u64  the message offset
    8     4     length   u32  payload length in bytes, at most the reader's limit
    12    4     crc      u32  crc32c over bytes [0, 12) of this header, then the payload
    16    len   payload

The CRC covers the offset and length as well as the payload, so that every single-byte flip
anywhere in a frame is caught, and so that a zero-filled tail (a preallocated or torn file) never
reads as an empty frame: crc32c of an empty payload alone would be 0.

Decoding tells three outcomes apart: a complete frame; an incomplete tail (fewer bytes than the
header announces: wait for more, or cut a torn WAL tail there); corruption (CRC mismatch, or a
length beyond the limit), raised as :class:`CorruptFrameError`. A decoder never yields part of a
frame.
"""

from __future__ import annotations

import struct
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, NamedTuple, TypeAlias

from crc32c import crc32c

from danube.frame.errors import CorruptFrameError, FrameError, FrameTooLargeError

BytesLike: TypeAlias = bytes | bytearray | memoryview

# offset u64, length u32, crc u32; "<" means little-endian with no padding. The one statement
# of the frame header: every reader and writer of frames takes these (danube.frame exports them).
FRAME_HEADER = struct.Struct("<QII")
FRAME_HEADER_BYTES = FRAME_HEADER.size
# What the crc, the last field, covers: the fields before it.
FRAME_COVERED = struct.Struct(FRAME_HEADER.format[:-1])
FRAME_CRC_AT = FRAME_COVERED.size
_HEADER = FRAME_HEADER
_COVERED = FRAME_COVERED
_CRC_POS = FRAME_CRC_AT

MAX_FRAME_PAYLOAD_BYTES = 8 * 1024 * 1024
"""Default limit on one frame's payload, on encode and decode; every call can override it."""

_MAX_OFFSET = 2**64 - 1
_MAX_LENGTH = 2**32 - 1  # what the u32 length field can carry


class Frame(NamedTuple):
    """One decoded frame.

    ``payload`` is a read-only memoryview, not a copy. From :class:`FrameDecoder` it views an
    immutable block owned by the frame, valid for as long as the frame is kept (and keeping it
    keeps that block, up to one ``feed`` worth of bytes, alive). From :func:`decode_frames` it
    views the caller's buffer, which must not change while the frame is in use. Call
    ``bytes(frame.payload)`` to keep a detached copy.
    """

    offset: int
    payload: memoryview

    @property
    def size_bytes(self) -> int:
        """Bytes this frame takes in the stream, header included."""
        return FRAME_HEADER_BYTES + len(self.payload)


def _check_limit(max_payload_bytes: int) -> None:
    if not 0 <= max_payload_bytes <= _MAX_LENGTH:
        raise ValueError(f"max_payload_bytes must be within [0, {_MAX_LENGTH}]")


def _byte_view(buf: BytesLike, start: int) -> memoryview:
    view = memoryview(buf).cast("B")
    if not 0 <= start <= len(view):
        raise ValueError(f"start {start} is outside the {len(view)}-byte buffer")
    return view


def _header(offset: int, payload: BytesLike, max_payload_bytes: int) -> tuple[bytes, int]:
    """Check a frame's fields and return its 16-byte header and its payload length."""
    if not 0 <= offset <= _MAX_OFFSET:
        raise FrameError(f"frame offset {offset} is outside [0, 2**64)", code="invalid_offset")
    length = len(payload) if not isinstance(payload, memoryview) else payload.nbytes
    if length > max_payload_bytes or length > _MAX_LENGTH:
        raise FrameTooLargeError(size_bytes=length, limit_bytes=min(max_payload_bytes, _MAX_LENGTH))
    # Incremental crc32c: the header prefix then the payload, with no concatenated copy.
    crc = crc32c(payload, crc32c(_COVERED.pack(offset, length)))
    return _HEADER.pack(offset, length, crc), length


def encode_frame(
    offset: int, payload: BytesLike, *, max_payload_bytes: int = MAX_FRAME_PAYLOAD_BYTES
) -> bytes:
    """Return one frame: header then payload.

    Raises :class:`FrameError` for an offset outside [0, 2**64) and :class:`FrameTooLargeError`
    for a payload over ``max_payload_bytes``.
    """
    return _header(offset, payload, max_payload_bytes)[0] + payload


def append_frame(
    buf: bytearray,
    offset: int,
    payload: BytesLike,
    *,
    max_payload_bytes: int = MAX_FRAME_PAYLOAD_BYTES,
) -> int:
    """Append one frame to ``buf`` (batching without intermediate copies); return its size.

    Same checks as :func:`encode_frame`; on error ``buf`` is left unchanged.
    """
    header, length = _header(offset, payload, max_payload_bytes)
    buf += header
    buf += payload
    return FRAME_HEADER_BYTES + length


def _decode_run(
    view: memoryview,
    pos: int,
    max_payload_bytes: int,
    out: list[Any],
    max_frames: int,
    whole: bool = False,
) -> tuple[int, tuple[int, str] | None]:
    """Decode complete frames from ``view[pos:]`` into ``out``, at most ``max_frames``: each
    a :class:`Frame` (its payload), or with ``whole`` a :class:`RawFrame` (the frame, header
    included). ``out`` is typed loosely for that; the callers' own lists say which.

    Returns the position after the last good frame and, if decoding stopped on corruption,
    ``(header offset, reason)`` for the frame at that position. Stopping with no problem means
    the rest is an incomplete frame (or nothing). This is the hot loop: locals only, no per-byte
    work, payloads sliced as views rather than copied.
    """
    end = len(view)
    unpack = _HEADER.unpack_from
    append = out.append
    for _ in range(max_frames):
        if end - pos < FRAME_HEADER_BYTES:
            break
        offset, length, crc = unpack(view, pos)
        if length > max_payload_bytes:
            return pos, (offset, f"payload length {length} exceeds the limit {max_payload_bytes}")
        body = pos + FRAME_HEADER_BYTES
        stop = body + length
        if stop > end:
            break
        payload = view[body:stop]
        actual = crc32c(payload, crc32c(view[pos : pos + _CRC_POS]))
        if actual != crc:
            return pos, (offset, f"crc mismatch (stored {crc:#010x}, computed {actual:#010x})")
        append(RawFrame(offset, view[pos:stop]) if whole else Frame(offset, payload))
        pos = stop
    return pos, None


def decode_frames(
    buf: BytesLike, start: int = 0, *, max_payload_bytes: int = MAX_FRAME_PAYLOAD_BYTES
) -> tuple[list[Frame], int]:
    """Decode every complete frame of ``buf`` from byte ``start`` on.

    Returns ``(frames, end)`` where ``end`` is the position after the last complete frame;
    ``buf[end:]`` is an incomplete tail (possibly empty). Payloads view ``buf`` (see
    :class:`Frame`). Raises :class:`CorruptFrameError` at the first corrupt frame, its
    ``position`` an index into ``buf``.
    """
    _check_limit(max_payload_bytes)
    frames: list[Frame] = []
    end, problem = _decode_run(
        _byte_view(buf, start), start, max_payload_bytes, frames, sys.maxsize
    )
    if problem is not None:
        raise CorruptFrameError(position=end, offset=problem[0], reason=problem[1])
    return frames, end


@dataclass(frozen=True, slots=True)
class FrameScan:
    """What :func:`scan_frames` found: where the good frames end and what follows them."""

    good_end: int
    """Position just past the last good frame: where a torn or corrupt WAL tail is cut."""
    frame_count: int
    first_offset: int | None
    last_offset: int | None
    tail_bytes: int
    """Bytes after ``good_end``: 0 when the stream ends exactly on a frame boundary."""
    error: CorruptFrameError | None
    """Why the tail is bad when it is corrupt; ``None`` when clean or merely incomplete."""


_SCAN_BATCH_FRAMES = 4096  # bounds the memory a scan of a large segment holds at once


def scan_frames(
    buf: BytesLike, start: int = 0, *, max_payload_bytes: int = MAX_FRAME_PAYLOAD_BYTES
) -> FrameScan:
    """Walk the frames of ``buf`` from ``start`` without raising, to find where they stop.

    WAL recovery calls this on its last segment and truncates the file at ``good_end``.
    """
    _check_limit(max_payload_bytes)
    view = _byte_view(buf, start)
    pos, count = start, 0
    first: int | None = None
    last: int | None = None
    batch: list[Frame] = []
    while True:
        batch.clear()
        pos, problem = _decode_run(view, pos, max_payload_bytes, batch, _SCAN_BATCH_FRAMES)
        if batch:
            count += len(batch)
            first = batch[0].offset if first is None else first
            last = batch[-1].offset
        if problem is not None or len(batch) < _SCAN_BATCH_FRAMES:
            break
    batch.clear()
    error = None
    if problem is not None:
        error = CorruptFrameError(position=pos, offset=problem[0], reason=problem[1])
    return FrameScan(pos, count, first, last, len(view) - pos, error)


class FrameDecoder:
    """Streaming decoder: ``feed`` bytes as they arrive, iterate to take the complete frames.

    Iteration yields every complete frame buffered so far, then stops, leaving an incomplete
    tail buffered (see :attr:`buffered_bytes`) until more bytes are fed. A corrupt frame raises
    :class:`CorruptFrameError` after the good frames before it were yielded; the decoder then
    stays broken (every later iteration raises the same error), since a byte stream cannot be
    resynchronised past a bad frame. :meth:`whole_frames` iterates the same way and yields
    each frame whole (a :class:`RawFrame`, header included) instead of its payload.

    Fed bytes are kept as immutable blocks; the incomplete tail is copied only when enough
    bytes arrived to complete it, so each byte is copied at most about twice whatever the chunk
    sizes, and a ``bytes`` chunk fed on a frame boundary is not copied at all.
    """

    def __init__(
        self, *, max_payload_bytes: int = MAX_FRAME_PAYLOAD_BYTES, position: int = 0
    ) -> None:
        """``position`` is the stream position of the first byte fed, used in error reports."""
        _check_limit(max_payload_bytes)
        self._max_payload_bytes = max_payload_bytes
        self._block = b""
        self._view = memoryview(self._block)
        self._pos = 0  # next undecoded byte in the block
        self._base = position  # stream position of the block's first byte
        self._pending: list[bytes] = []  # chunks fed after the block, not yet joined to it
        self._pending_bytes = 0
        self._need = FRAME_HEADER_BYTES  # bytes from _pos on needed to decode another frame
        self._error: CorruptFrameError | None = None
        self._problem: CorruptFrameError | None = None  # where the current run stopped

    @property
    def buffered_bytes(self) -> int:
        """Bytes fed but not yet yielded as frames: the incomplete tail."""
        return len(self._block) - self._pos + self._pending_bytes

    @property
    def position(self) -> int:
        """Stream position just past the last frame decoded."""
        return self._base + self._pos

    def feed(self, data: BytesLike) -> None:
        """Buffer ``data`` (copied unless it is ``bytes``, so the caller may reuse its buffer)."""
        if data:
            chunk = bytes(data)
            self._pending.append(chunk)
            self._pending_bytes += len(chunk)

    def __iter__(self) -> Iterator[Frame]:
        frames: list[Frame] | None
        while (frames := self._next_run(False)) is not None:
            for frame in frames:
                # Advance before yielding, so a consumer that breaks out loses no frame.
                self._pos += FRAME_HEADER_BYTES + len(frame.payload)
                yield frame
            self._end_run()

    def whole_frames(self) -> Iterator[RawFrame]:
        """Iterate as ``iter(decoder)`` does, with the same checks (CRC, length), but yield
        each frame whole, header included, as it lies in the fed bytes: for a hop that passes
        the frames on unchanged rather than framing their payloads again. ``data`` views the
        decoder's immutable block, as :attr:`Frame.payload` does."""
        frames: list[RawFrame] | None
        while (frames := self._next_run(True)) is not None:
            for frame in frames:
                self._pos += len(frame.data)  # before yielding, as in __iter__
                yield frame
            self._end_run()

    def _next_run(self, whole: bool) -> list[Any] | None:
        """Decode every complete frame buffered from ``_pos`` on, checked; ``None`` when none
        can complete until more bytes are fed. Raises the error a corrupt frame left."""
        if self._error is not None:
            raise self._error
        if len(self._block) - self._pos + self._pending_bytes < self._need:
            return None
        if self._pending:
            self._join_pending()
        frames: list[Any] = []
        end, problem = _decode_run(
            self._view, self._pos, self._max_payload_bytes, frames, sys.maxsize, whole
        )
        # Until the run is fully yielded, only a header's worth is known to be needed: a
        # consumer that stops early must find the remaining frames on its next iteration.
        self._need = FRAME_HEADER_BYTES
        if problem is not None:
            self._problem = CorruptFrameError(
                position=self._base + end, offset=problem[0], reason=problem[1]
            )
        else:
            self._problem = None
        return frames

    def _end_run(self) -> None:
        """The run was yielded whole: keep its corruption, or note what the next frame needs."""
        if self._problem is not None:
            self._error = self._problem
        else:
            self._need = self._bytes_needed()

    def _join_pending(self) -> None:
        tail = self._view[self._pos :]
        chunks = [bytes(tail), *self._pending] if tail else self._pending
        self._base += self._pos
        self._block = b"".join(chunks)  # one chunk alone is returned as is, not copied
        self._view = memoryview(self._block)
        self._pos = 0
        self._pending = []
        self._pending_bytes = 0

    def _bytes_needed(self) -> int:
        """Bytes from ``_pos`` on that the next frame needs (its length was checked already)."""
        if len(self._block) - self._pos < FRAME_HEADER_BYTES:
            return FRAME_HEADER_BYTES
        _offset, length, _crc = _HEADER.unpack_from(self._view, self._pos)
        return FRAME_HEADER_BYTES + int(length)


class RawFrame(NamedTuple):
    """One frame as it lies in the WAL or an object, header included: ``data`` views the
    bytes it was found in. Hops that only carry a frame keep it so (no re-framing, no new
    CRC); whoever decodes its record checks it first (:func:`verify_frame`)."""

    offset: int
    data: memoryview

    @property
    def record(self) -> memoryview:
        """The frame's payload (the record bytes), unchecked."""
        return self.data[FRAME_HEADER_BYTES:]

    @property
    def size_bytes(self) -> int:
        """Bytes this frame takes in the stream, header included."""
        return len(self.data)


def walk_frames(
    buf: BytesLike, start: int = 0, *, max_payload_bytes: int = MAX_FRAME_PAYLOAD_BYTES
) -> tuple[list[RawFrame], int]:
    """Split ``buf`` from ``start`` into whole frames by their headers, without checking a
    CRC: for a hop that carries frames checked where they were read and checked again where
    they are decoded. Returns ``(frames, end)`` as :func:`decode_frames` does; a length past
    the limit raises :class:`CorruptFrameError`."""
    _check_limit(max_payload_bytes)
    view = _byte_view(buf, start)
    end = len(view)
    unpack = _HEADER.unpack_from
    frames: list[RawFrame] = []
    pos = start
    while end - pos >= FRAME_HEADER_BYTES:
        offset, length, _crc = unpack(view, pos)
        if length > max_payload_bytes:
            raise CorruptFrameError(
                position=pos,
                offset=offset,
                reason=f"payload length {length} exceeds the limit {max_payload_bytes}",
            )
        stop = pos + FRAME_HEADER_BYTES + length
        if stop > end:
            break
        frames.append(RawFrame(offset, view[pos:stop]))
        pos = stop
    return frames, pos


def verify_frame(frame: BytesLike) -> memoryview:
    """The payload of one whole frame (header included) once its CRC and length check;
    :class:`CorruptFrameError` otherwise."""
    view = memoryview(frame).cast("B")
    if len(view) < FRAME_HEADER_BYTES:
        raise CorruptFrameError(position=0, offset=None, reason=f"{len(view)}-byte frame")
    offset, length, crc = _HEADER.unpack_from(view, 0)
    if FRAME_HEADER_BYTES + length != len(view):
        reason = f"header says {length} payload bytes, the frame holds {len(view) - 16}"
        raise CorruptFrameError(position=0, offset=offset, reason=reason)
    payload = view[FRAME_HEADER_BYTES:]
    actual = crc32c(payload, crc32c(view[:_CRC_POS]))
    if actual != crc:
        reason = f"crc mismatch (stored {crc:#010x}, computed {actual:#010x})"
        raise CorruptFrameError(position=0, offset=offset, reason=reason)
    return payload

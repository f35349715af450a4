"""A batch of frames on its way into the WAL: one writable buffer holding the frames, whose
offsets and CRCs the writer sets in place.

A produce body already holds its records framed (offset 0, the producer's CRC:
:mod:`danube.frame.produce`); the leader gives them offsets by writing each frame's offset
field and CRC where they lie (:meth:`FrameBatch.seal`) and writes the buffer as it is, rather
than copying every record out and framing it again. Records that come without frames (a JSON
or gRPC produce, a test) are framed once, into one buffer (:meth:`FrameBatch.of_records`).
"""

from __future__ import annotations

import operator
from collections.abc import Iterator, Sequence
from typing import overload

from crc32c import crc32c

from danube.frame.codec import (
    FRAME_COVERED,
    FRAME_HEADER,
    FRAME_HEADER_BYTES,
    MAX_FRAME_PAYLOAD_BYTES,
    BytesLike,
)
from danube.frame.errors import FrameError, FrameTooLargeError

_MAX_OFFSET = 2**64 - 1


class FrameBatch(Sequence[memoryview]):
    """Frames laid in ``buf``: frame ``i`` spans ``buf[starts[i] : ends[i]]``, its record
    ``buf[starts[i] + FRAME_HEADER_BYTES : ends[i]]``. As a sequence, its records (read-only
    views: what keeps one keeps the buffer).

    The frames' length fields are right from the start; their offsets and CRCs are what
    :meth:`seal` writes. Nobody changes ``buf`` after :meth:`seal` but the writer did.
    """

    __slots__ = ("buf", "ends", "nbytes", "starts")

    def __init__(self, buf: bytearray, starts: list[int], ends: list[int]) -> None:
        self.buf = buf
        self.starts = starts
        self.ends = ends
        self.nbytes = sum(ends) - sum(starts)  # the frames' bytes, headers included

    @classmethod
    def of_records(cls, records: Sequence[BytesLike]) -> FrameBatch:
        """``records`` framed into one new buffer (offsets and CRCs left to :meth:`seal`)."""
        buf = bytearray()
        starts: list[int] = []
        ends: list[int] = []
        pack = FRAME_HEADER.pack
        for record in records:
            starts.append(len(buf))
            buf += pack(0, len(record), 0)
            buf += record
            ends.append(len(buf))
        return cls(buf, starts, ends)

    @classmethod
    def of_frames(cls, body: BytesLike, record_starts: list[int], ends: list[int]) -> FrameBatch:
        """The frames of a checked produce body (``record_starts``/``ends``: where each
        record lies in it, as :class:`~danube.frame.produce.ProducedFrames` has them), in a
        writable copy of the body when it is not one already."""
        buf = body if isinstance(body, bytearray) else bytearray(body)
        return cls(buf, [start - FRAME_HEADER_BYTES for start in record_starts], ends)

    def __len__(self) -> int:
        return len(self.starts)

    @overload
    def __getitem__(self, index: int) -> memoryview: ...

    @overload
    def __getitem__(self, index: slice) -> list[memoryview]: ...

    def __getitem__(self, index: int | slice) -> memoryview | list[memoryview]:
        if isinstance(index, slice):
            return list(self)[index]
        view = memoryview(self.buf).toreadonly()
        return view[self.starts[index] + FRAME_HEADER_BYTES : self.ends[index]]

    def __iter__(self) -> Iterator[memoryview]:
        view = memoryview(self.buf).toreadonly()
        for start, end in zip(self.starts, self.ends, strict=True):
            yield view[start + FRAME_HEADER_BYTES : end]

    def record_bytes(self) -> int:
        """The records' bytes (the frames' less their headers)."""
        return self.nbytes - FRAME_HEADER_BYTES * len(self.starts)

    def largest_record(self) -> tuple[int, int]:
        """``(index, size)`` of the largest record (the first of equals); ``(0, 0)`` if none."""
        if not self.starts:
            return 0, 0
        sizes = list(map(operator.sub, self.ends, self.starts))
        biggest = max(sizes)
        return sizes.index(biggest), biggest - FRAME_HEADER_BYTES

    def seal(self, first_offset: int, *, max_payload_bytes: int = MAX_FRAME_PAYLOAD_BYTES) -> None:
        """Give the frames offsets ``first_offset, first_offset + 1, ...``: each frame's
        offset field and CRC written where it lies. :class:`FrameTooLargeError` for a record
        over ``max_payload_bytes`` (checked before anything is written)."""
        if first_offset < 0 or first_offset + len(self.starts) - 1 > _MAX_OFFSET:
            raise FrameError(f"frame offset {first_offset} is outside [0, 2**64)")
        biggest = max(map(operator.sub, self.ends, self.starts), default=0) - FRAME_HEADER_BYTES
        if biggest > max_payload_bytes:
            raise FrameTooLargeError(size_bytes=biggest, limit_bytes=max_payload_bytes)
        buf, view = self.buf, memoryview(self.buf)
        covered, pack_into = FRAME_COVERED.pack, FRAME_HEADER.pack_into
        offset = first_offset
        for start, end in zip(self.starts, self.ends, strict=True):
            length = end - start - FRAME_HEADER_BYTES
            # crc32c over the header's offset and length, then on over the record in place.
            crc = crc32c(view[start + FRAME_HEADER_BYTES : end], crc32c(covered(offset, length)))
            pack_into(buf, start, offset, length, crc)
            offset += 1

    def runs(self) -> list[memoryview]:
        """The frames as views of ``buf``, adjacent ones as one view (a produce body's frames
        lie end to end: one view in all)."""
        view = memoryview(self.buf)
        out: list[memoryview] = []
        run_start = run_end = -1
        for start, end in zip(self.starts, self.ends, strict=True):
            if start != run_end:
                if run_end >= 0:
                    out.append(view[run_start:run_end])
                run_start = start
            run_end = end
        if run_end >= 0:
            out.append(view[run_start:run_end])
        return out

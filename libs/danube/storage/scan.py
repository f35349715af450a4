"""Reading one object's frames from an offset, with every check: the one implementation that
the cloud_reader and the Spark source share.

:class:`ObjectScan` does no I/O. Its caller range-reads the bytes the scan asks for
(:meth:`ObjectScan.next_range`), feeds them (:meth:`ObjectScan.feed`) and takes the frames
(:meth:`ObjectScan.frames`, or :meth:`ObjectScan.whole_frames` for the frames as they lie in
the object, header included), so the same logic runs under the cloud_reader's event loop and in
a Spark executor. A scan starts at the sparse-index entry at or before ``from_offset``
(:meth:`ObjectDescriptor.seek`), so it reads less than one index step of frames it does not
want; it never asks for bytes past the first index entry after ``to_offset`` (no wanted frame
can lie beyond it), and stops once it has the last offset it wants.

Every frame is checked as it is taken: its CRC and length (:class:`~danube.frame.FrameDecoder`),
its offset above the previous one and inside the descriptor's range. A scan that reads to the
object's end also checks the object ends on the descriptor's last offset with no bytes left
over. A failed check raises :class:`CorruptObjectError` naming the object, the byte position
and the offset; no frame at or after a bad one is ever yielded.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TypeVar

from danube.frame import (
    MAX_FRAME_PAYLOAD_BYTES,
    CorruptFrameError,
    Frame,
    FrameDecoder,
    RawFrame,
)
from danube.storage.descriptor import ObjectDescriptor
from danube.storage.errors import CorruptObjectError

_F = TypeVar("_F", Frame, RawFrame)  # a frame's payload, or the frame whole


class ObjectScan:
    """The frames of one object from ``from_offset`` through ``to_offset`` (inclusive;
    ``None``: to the object's end), checked. See the module docstring for the protocol::

        scan = ObjectScan(descriptor, from_offset)
        while True:
            for frame in scan.frames():
                ...
            wanted = scan.next_range(chunk_bytes)
            if wanted is None:
                break
            scan.feed(await objects.read_range(descriptor.key, *wanted))
        scan.finish()
    """

    def __init__(
        self,
        descriptor: ObjectDescriptor,
        from_offset: int,
        *,
        to_offset: int | None = None,
        max_payload_bytes: int = MAX_FRAME_PAYLOAD_BYTES,
    ) -> None:
        self.descriptor = descriptor
        self.from_offset = from_offset
        last = descriptor.last_offset
        self.to_offset = last if to_offset is None else min(to_offset, last)
        self._to_end = self.to_offset == last  # then the end of the object is checked too
        start = descriptor.seek(max(from_offset, descriptor.first_offset))
        # The frame of `to_offset` ends where the next indexed frame starts, at the latest.
        self.read_end = next(
            (e.position for e in descriptor.index if e.offset > self.to_offset),
            descriptor.size_bytes,
        )
        self._decoder = FrameDecoder(max_payload_bytes=max_payload_bytes, position=start)
        self._position = start  # where the next frame starts
        self._read_at = start  # the next byte to ask for
        self._previous: int | None = None  # the offset of the last frame taken
        self._done = from_offset > self.to_offset  # nothing wanted at all

    @property
    def done(self) -> bool:
        """Every wanted frame was yielded (and, reading to the end, the end was checked)."""
        return self._done

    @property
    def position(self) -> int:
        """The byte position of the next frame: after the last one taken."""
        return self._position

    def next_range(self, chunk_bytes: int) -> tuple[int, int] | None:
        """``(start, length)`` to read and :meth:`feed` next, at most ``chunk_bytes``; ``None``
        when nothing more is needed (then call :meth:`finish`)."""
        if chunk_bytes < 1:
            raise ValueError("chunk_bytes must be at least 1")
        if self._done or self._read_at >= self.read_end:
            return None
        return self._read_at, min(chunk_bytes, self.read_end - self._read_at)

    def feed(self, data: bytes) -> None:
        """The bytes of the range :meth:`next_range` gave, read from the object."""
        if self._read_at + len(data) > self.read_end:
            raise ValueError("fed past what the scan asked for")
        self._decoder.feed(data)
        self._read_at += len(data)

    def frames(self) -> Iterator[Frame]:
        """The wanted frames among those fed so far, each checked as it is taken.

        Stopping the iteration early loses nothing: the next call goes on from there. Frames
        view the fed bytes (see :class:`~danube.frame.Frame`).
        """
        return self._checked(iter(self._decoder))

    def whole_frames(self) -> Iterator[RawFrame]:
        """The same frames with the same checks as :meth:`frames`, each whole (header
        included, as it lies in the object): for a reader that passes them on unchanged."""
        return self._checked(self._decoder.whole_frames())

    def _checked(self, decoded: Iterator[_F]) -> Iterator[_F]:
        if self._done:
            return
        descriptor = self.descriptor
        first, last = descriptor.first_offset, descriptor.last_offset
        try:
            for frame in decoded:
                at = self._position
                offset = frame.offset
                self._position = at + frame.size_bytes
                previous = self._previous
                if previous is not None and offset <= previous:
                    raise CorruptObjectError(
                        descriptor.key, at, offset, f"offset does not follow {previous}"
                    )
                if not first <= offset <= last:
                    raise CorruptObjectError(
                        descriptor.key, at, offset, f"offset outside {first}..{last}"
                    )
                self._previous = offset
                if offset < self.from_offset:
                    continue
                if offset > self.to_offset:
                    # Only possible without contiguous offsets: the wanted range ended in a gap.
                    self._done = True
                    return
                if offset == self.to_offset and not self._to_end:
                    self._done = True
                    yield frame
                    return
                yield frame
        except CorruptFrameError as exc:
            raise CorruptObjectError(descriptor.key, exc.position, exc.offset, exc.reason) from exc

    def finish(self) -> None:
        """Check the scan ended well once :meth:`next_range` says nothing more is needed:
        reading to the end, the object must end on the descriptor's last offset, on a frame
        boundary; reading part of it, the last wanted offset must have been found."""
        if self._done:
            return
        descriptor = self.descriptor
        if self._read_at < self.read_end:
            raise RuntimeError("finish() before the scan read what it needs")
        for _ in self.frames():
            raise RuntimeError("finish() before every frame fed was taken")
        if not self._to_end:
            raise CorruptObjectError(
                descriptor.key,
                self._position,
                self._previous,
                f"offset {self.to_offset} is not before byte {self.read_end}",
            )
        if self._decoder.buffered_bytes:
            raise CorruptObjectError(
                descriptor.key, self._position, self._previous, "the object ends inside a frame"
            )
        if self._previous != descriptor.last_offset:
            raise CorruptObjectError(
                descriptor.key, self._position, self._previous, "the object ends early"
            )
        self._done = True

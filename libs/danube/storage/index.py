"""The sparse index of an object: a few ``(offset, byte_position)`` marks to seek without scanning.

An object is frames laid end to end. The uploader feeds every frame it writes to a
:class:`SparseIndexBuilder`, which marks the first frame and then the first frame at least
``every_bytes`` past the previous mark. To read from offset ``o``, a reader :func:`seek`\\ s to
the last mark at or before ``o`` and scans forward, so it never reads more than about
``every_bytes`` of frames it does not want.

The number of marks is capped (``max_entries``) so that a descriptor always fits in one etcd
value: when the cap is reached, every other mark is dropped and ``every_bytes`` doubles. Any
subset of frame starts that keeps the first one is still a correct index, only coarser.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Sequence
from typing import NamedTuple

from danube.frame import FRAME_HEADER_BYTES
from danube.storage.errors import InvalidDescriptorError

DEFAULT_INDEX_EVERY_BYTES = 64 * 1024
MAX_INDEX_ENTRIES = 16_384
"""At most this many marks per object: ~700 KB of descriptor at worst, under etcd's 1.5 MiB."""


class IndexEntry(NamedTuple):
    """One mark: the frame of ``offset`` starts at byte ``position`` of the object."""

    offset: int
    position: int


def seek(index: Sequence[IndexEntry], offset: int) -> int:
    """The byte position to start scanning at to find ``offset``.

    That is the position of the last entry whose offset is at or before ``offset``. For an
    offset before the first entry (or an empty index) it is the first entry's position (or 0):
    scanning from there finds nothing earlier, which is the right answer for such a request.
    ``index`` must be sorted by offset, as a built or validated index is.
    """
    if not index:
        return 0
    at = bisect_right(index, offset, key=lambda entry: entry.offset)
    return index[max(at - 1, 0)].position


class SparseIndexBuilder:
    """Builds the sparse index of one object from the frames written into it, in order.

    It also counts what a descriptor needs: first and last offset, message count, and the byte
    size (the end of the last frame). Frames must come with strictly increasing offsets and be
    contiguous in the object (each starts where the previous one ended).
    """

    def __init__(
        self,
        every_bytes: int = DEFAULT_INDEX_EVERY_BYTES,
        *,
        max_entries: int = MAX_INDEX_ENTRIES,
    ) -> None:
        if every_bytes < 1:
            raise InvalidDescriptorError("every_bytes", f"must be at least 1, not {every_bytes}")
        if max_entries < 2:
            raise InvalidDescriptorError("max_entries", f"must be at least 2, not {max_entries}")
        self._every_bytes = every_bytes
        self._max_entries = max_entries
        self._entries: list[IndexEntry] = []
        self._first_offset: int | None = None
        self._last_offset: int | None = None
        self._end_position = 0
        self._message_count = 0

    def add(self, offset: int, position: int, frame_size: int) -> None:
        """Account for one frame of ``frame_size`` bytes (header included) at ``position``."""
        if frame_size < FRAME_HEADER_BYTES:
            raise InvalidDescriptorError(
                "frame_size", f"{frame_size} is smaller than a frame header"
            )
        if self._last_offset is None:
            if offset < 0 or position < 0:
                raise InvalidDescriptorError("offset", "offsets and positions are non-negative")
            self._first_offset = offset
            self._entries.append(IndexEntry(offset, position))
        else:
            if offset <= self._last_offset:
                raise InvalidDescriptorError(
                    "offset", f"offset {offset} does not follow {self._last_offset}"
                )
            if position != self._end_position:
                raise InvalidDescriptorError(
                    "position",
                    f"frame at {position} does not start where the last ended "
                    f"({self._end_position})",
                )
            if position - self._entries[-1].position >= self._every_bytes:
                if len(self._entries) == self._max_entries:
                    self._thin()
                if position - self._entries[-1].position >= self._every_bytes:
                    self._entries.append(IndexEntry(offset, position))
        self._last_offset = offset
        self._end_position = position + frame_size
        self._message_count += 1

    def _thin(self) -> None:
        # Keep the first mark (a reader must be able to start at the first frame), halve the rest.
        self._entries = self._entries[::2]
        self._every_bytes *= 2

    @property
    def entries(self) -> tuple[IndexEntry, ...]:
        """The marks so far, sorted by offset and by position."""
        return tuple(self._entries)

    @property
    def every_bytes(self) -> int:
        """The current spacing: the one given, doubled each time the cap thinned the index."""
        return self._every_bytes

    @property
    def first_offset(self) -> int | None:
        """Offset of the first frame, ``None`` before any."""
        return self._first_offset

    @property
    def last_offset(self) -> int | None:
        """Offset of the last frame, ``None`` before any."""
        return self._last_offset

    @property
    def message_count(self) -> int:
        """How many frames were added."""
        return self._message_count

    @property
    def size_bytes(self) -> int:
        """The byte position just past the last frame: the object size when it starts at 0."""
        return self._end_position

"""The newest durable messages, kept in memory so that tailing consumers never touch the disk.

Bounded twice: by message count (``cache_capacity``, Danube's key) and by payload bytes (so a
run of large messages cannot take gigabytes). The cache always holds a suffix of the durable
log: every message from its oldest entry up to the durable end, in offset order, so a fetch
that starts inside it can be served from it alone. In ``memory`` mode it is all there is.

Messages are kept framed (``[u64 offset][u32 len][u32 crc32c][record]``, danube.frame): a
fetch answers the frames as they are, whether read from a segment or from here, and no
reader computes a CRC again for every fetch of the same message.
"""

from __future__ import annotations

from bisect import bisect_left
from collections import deque
from collections.abc import Sequence
from itertools import islice
from operator import itemgetter

from danube.frame import FRAME_HEADER, FRAME_HEADER_BYTES, encode_frame

# A frame's header (danube.frame.codec): offset u64, length u32, crc u32.
_HEADER = FRAME_HEADER  # danube.frame's header: offset, length, crc

_first = itemgetter(0)


class MessageCache:
    """A bounded deque of ``(offset, frame)``; not thread-safe (used on the event loop only)."""

    def __init__(self, capacity: int, max_bytes: int) -> None:
        self._capacity = capacity
        self._max_bytes = max_bytes
        self._items: deque[tuple[int, bytes]] = deque()
        self._bytes = 0

    def __len__(self) -> int:
        return len(self._items)

    @property
    def payload_bytes(self) -> int:
        """Payload bytes held (frame headers not counted)."""
        return self._bytes

    @property
    def first_offset(self) -> int | None:
        """The oldest offset held, or ``None`` when empty."""
        return self._items[0][0] if self._items else None

    def extend(
        self,
        first_offset: int,
        payloads: Sequence[bytes | memoryview],
        written: bytes | None = None,
        payload_bytes: int | None = None,
    ) -> None:
        """Add messages with consecutive offsets from ``first_offset``, evicting the oldest.
        ``written``: their frames as the WAL writer wrote them (one write holding exactly
        this run), split by their headers instead of framed again (no CRC computed here);
        ``payload_bytes``: the payloads' bytes, when known (else counted here)."""
        if self._capacity == 0:
            return
        skip = len(payloads) - self._capacity
        if skip > 0:  # only the newest `capacity` of a large run can stay: skip the rest
            payloads = payloads[skip:]
            first_offset += skip
        offsets = range(first_offset, first_offset + len(payloads))
        frames = _split(written, len(payloads)) if written is not None and skip <= 0 else None
        if frames is not None:
            self._items.extend(frames)
        else:
            self._items.extend(
                (offset, encode_frame(offset, payload))
                for offset, payload in zip(offsets, payloads, strict=True)
            )
        self._bytes += (
            payload_bytes if payload_bytes is not None and skip <= 0 else sum(map(len, payloads))
        )
        items = self._items
        while len(items) > self._capacity or self._bytes > self._max_bytes:
            self._bytes -= len(items.popleft()[1]) - FRAME_HEADER_BYTES

    def trim_below(self, offset: int) -> None:
        """Forget every message below ``offset``."""
        items = self._items
        while items and items[0][0] < offset:
            self._bytes -= len(items.popleft()[1]) - FRAME_HEADER_BYTES

    def clear(self) -> None:
        """Forget everything."""
        self._items.clear()
        self._bytes = 0

    def fetch(
        self, from_offset: int, *, limit_offset: int, max_bytes: int, max_count: int
    ) -> tuple[list[tuple[int, bytes]], int]:
        """Messages from ``from_offset`` (at or after :attr:`first_offset`) below ``limit_offset``.

        At most ``max_count`` messages and ``max_bytes`` payload bytes (the first always fits).
        Returns them as ``(offset, frame)`` and the offset to read next; offsets missing from
        the cache (a gap left by ``advance_to``) are skipped, up to ``limit_offset`` if
        nothing follows.
        """
        items = self._items
        start = bisect_left(items, from_offset, key=_first)
        out: list[tuple[int, bytes]] = []
        total = 0
        for offset, frame in islice(items, start, None):
            if offset >= limit_offset or len(out) >= max_count:
                return out, offset
            size = len(frame) - FRAME_HEADER_BYTES
            if out and total + size > max_bytes:
                return out, offset
            out.append((offset, frame))
            total += size
        # The cache holds every durable message from its oldest on: none is left below the limit.
        return out, max(from_offset, limit_offset)


def _split(written: bytes, count: int) -> list[tuple[int, bytes]] | None:
    """The ``count`` frames ``written`` holds as ``(offset, frame)``, or None when it holds
    anything else. Slices of ``written`` itself: no frame object or view per message."""
    unpack = _HEADER.unpack_from
    frames: list[tuple[int, bytes]] = []
    end = len(written)
    pos = 0
    while end - pos >= FRAME_HEADER_BYTES and len(frames) < count:
        offset, length, _crc = unpack(written, pos)
        stop = pos + FRAME_HEADER_BYTES + length
        if stop > end:
            return None
        frames.append((offset, written[pos:stop]))
        pos = stop
    return frames if len(frames) == count and pos == end else None

"""What the WAL answers: fetch results and stats snapshots."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields

from danube.frame import FRAME_HEADER_BYTES
from danube.wire.ingest.control import SegmentInfo

__all__ = ["FetchResult", "SegmentInfo", "WalStats"]


@dataclass(frozen=True, slots=True)
class FetchResult:
    """Messages in offset order, each ``(offset, whole frame)`` as the WAL holds it (checked
    where it was read), and the offset to fetch next."""

    frames: Sequence[tuple[int, bytes | memoryview]]
    next_offset: int

    @property
    def messages(self) -> list[tuple[int, bytes]]:
        """``(offset, payload)`` of each message, copied out of its frame (for readers of a
        few records: the fetch handlers pass :attr:`frames` on as they are)."""
        return [(offset, bytes(frame[FRAME_HEADER_BYTES:])) for offset, frame in self.frames]


@dataclass(frozen=True, slots=True)
class WalStats:
    """A snapshot of one WAL's offsets, sizes and counters."""

    start_offset: int
    next_offset: int
    durable_next: int
    segments: int
    disk_bytes: int
    cache_messages: int
    cache_bytes: int
    pending_bytes: int
    """Frame bytes of appends accepted and not yet durable (at most ``max_pending_bytes``)."""
    waiting_appends: int
    """Appends waiting for room in the pending budget (backpressure)."""
    appends: int
    messages: int
    batches: int
    """Group commits made durable (``messages / batches`` is the mean batch size)."""
    fsyncs: int
    bytes_written: int
    rotations: int
    failed: bool
    inline_appends: int = 0
    """Appends written and synced on the event loop's thread (danube.ingest.wal.commit)."""

    def as_dict(self) -> dict[str, int | bool]:
        """The fields by name (for JSON stats replies)."""
        return {field.name: getattr(self, field.name) for field in fields(self)}

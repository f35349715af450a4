"""What the WAL answers: fetch results and stats snapshots."""

from __future__ import annotations

from dataclasses import dataclass, fields

from danube.wire.ingest.protocol import SegmentInfo

__all__ = ["FetchResult", "SegmentInfo", "WalStats"]


@dataclass(frozen=True, slots=True)
class FetchResult:
    """Messages ``(offset, payload)`` in offset order, and the offset to fetch next."""

    messages: list[tuple[int, bytes]]
    next_offset: int


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

    def as_dict(self) -> dict[str, int | bool]:
        """The fields by name (for JSON stats replies)."""
        return {field.name: getattr(self, field.name) for field in fields(self)}

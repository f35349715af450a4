"""What a WAL is told at open: durability mode, batch and rotation sizes, cache and limits.

Built from Danube's ``wal_cloud.wal`` settings (:class:`danube.config.WalConfig`) plus the
per-topic durability; the extra limits (pending bytes, cache bytes, the disk deadline) are not
Danube keys and come from the service with safe defaults.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from danube.config.wal_cloud import WalConfig
from danube.frame import FRAME_HEADER_BYTES, MAX_FRAME_PAYLOAD_BYTES
from danube.ingest.wal.errors import WalError

MiB = 1024 * 1024

DEFAULT_MAX_PENDING_BYTES = 64 * MiB
"""Bytes accepted but not yet durable before appenders wait: bounds the writer's memory."""
DEFAULT_CACHE_MAX_BYTES = 64 * MiB
"""The cache holds ``cache_capacity`` messages but never more payload bytes than this."""
DEFAULT_PREALLOCATE_BYTES = 1 * MiB
"""The active segment's file is allocated this far ahead of its writes (0: not at all)."""
DEFAULT_IO_TIMEOUT_S = 30.0
"""A write, fsync or read slower than this fails (a stuck disk must not hang producers forever)."""

_MAX_U32 = 2**32 - 1


class Durability(StrEnum):
    """When an append counts as done, and so what survives a crash.

    - ``fsync``: written and fdatasync'ed (group commit) before the append returns.
    - ``interval``: written (in the page cache) before it returns; fdatasync'ed every
      ``sync_interval_ms``, at rotation and at close. Survives a process crash, not a power loss.
    - ``memory``: no file at all; messages live in the cache only (non-reliable topics).
    """

    FSYNC = "fsync"
    INTERVAL = "interval"
    MEMORY = "memory"


def _invalid(field: str, reason: str) -> WalError:
    return WalError(f"invalid WAL option {field}: {reason}", code="invalid_wal_options")


@dataclass(frozen=True, slots=True)
class WalOptions:
    """The settings of one partition's WAL; every size in bytes, every duration in its unit."""

    durability: Durability
    max_batch_bytes: int
    """One group commit writes at most this many frame bytes (a larger single append alone)."""
    sync_interval_ms: int
    """``interval`` mode: the fdatasync cadence."""
    rotation_max_bytes: int
    """A segment is sealed before a frame would take it past this (it holds at least one frame)."""
    rotation_max_age_s: float | None
    """A segment is sealed once this old (from its creation); ``None``: no age limit."""
    cache_capacity: int
    """The newest messages kept in memory for fetch (``memory`` mode: all that is kept)."""
    max_pending_bytes: int = DEFAULT_MAX_PENDING_BYTES
    """Frame bytes accepted but not yet durable; appenders wait beyond it."""
    max_frame_payload_bytes: int = MAX_FRAME_PAYLOAD_BYTES
    cache_max_bytes: int = DEFAULT_CACHE_MAX_BYTES
    io_timeout_s: float = DEFAULT_IO_TIMEOUT_S
    preallocate_bytes: int = DEFAULT_PREALLOCATE_BYTES
    """The active segment's file is allocated this far ahead of its writes (within
    ``rotation_max_bytes``): a write then leaves the file's size alone, and its fdatasync
    commits less. 0: every write appends."""
    inline_lone_appends: bool = False
    """An append that finds the writer idle is written (and synced) on the event loop's
    thread (danube.ingest.wal.commit); ingest turns it on (``file_sync.inline_lone_appends``)."""

    def __post_init__(self) -> None:
        if not isinstance(self.durability, Durability):
            raise _invalid("durability", f"{self.durability!r} is not a Durability")
        if self.max_batch_bytes < 1:
            raise _invalid("max_batch_bytes", "must be at least 1")
        if self.sync_interval_ms < 1:
            raise _invalid("sync_interval_ms", "must be at least 1")
        if self.rotation_max_bytes < 1:
            raise _invalid("rotation_max_bytes", "must be at least 1")
        if self.rotation_max_age_s is not None and not self.rotation_max_age_s > 0:
            raise _invalid("rotation_max_age_s", "must be positive or None")
        if self.cache_capacity < 0 or self.cache_max_bytes < 0:
            raise _invalid("cache_capacity", "the cache bounds must not be negative")
        if not 0 <= self.max_frame_payload_bytes <= _MAX_U32:
            raise _invalid("max_frame_payload_bytes", f"must be within [0, {_MAX_U32}]")
        # Any single valid message must be admissible, or it could wait forever.
        if self.max_pending_bytes < self.max_frame_payload_bytes + FRAME_HEADER_BYTES:
            raise _invalid(
                "max_pending_bytes", "must hold at least one frame of the largest payload"
            )
        if not self.io_timeout_s > 0:
            raise _invalid("io_timeout_s", "must be positive")
        if self.preallocate_bytes < 0:
            raise _invalid("preallocate_bytes", "must not be negative")

    @classmethod
    def from_config(
        cls,
        wal: WalConfig,
        durability: Durability | str,
        *,
        max_pending_bytes: int = DEFAULT_MAX_PENDING_BYTES,
        max_frame_payload_bytes: int = MAX_FRAME_PAYLOAD_BYTES,
        cache_max_bytes: int = DEFAULT_CACHE_MAX_BYTES,
        io_timeout_s: float = DEFAULT_IO_TIMEOUT_S,
    ) -> WalOptions:
        """Options from ``wal_cloud.wal`` and a topic's durability (``"fsync"``...)."""
        try:
            mode = Durability(durability)
        except ValueError as exc:
            raise _invalid(
                "durability", f"{durability!r} is not one of fsync, interval, memory"
            ) from exc
        max_hours = wal.rotation.max_hours
        return cls(
            durability=mode,
            max_batch_bytes=wal.file_sync.max_batch_bytes,
            sync_interval_ms=wal.file_sync.interval_ms,
            rotation_max_bytes=wal.rotation.max_bytes,
            rotation_max_age_s=None if max_hours is None else max_hours * 3600.0,
            cache_capacity=wal.cache_capacity,
            max_pending_bytes=max_pending_bytes,
            max_frame_payload_bytes=max_frame_payload_bytes,
            cache_max_bytes=cache_max_bytes,
            io_timeout_s=io_timeout_s,
            inline_lone_appends=wal.file_sync.inline_lone_appends,
        )

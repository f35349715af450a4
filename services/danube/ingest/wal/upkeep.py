"""Work on the sealed segments of an open WAL: listing them for retention, finding and
repairing damage from another copy (the blocking work is danube.ingest.wal.repair's), and
dropping the segments below a retention point (asking the drop guards first). A repair
and a drop each hold ``_admin_lock`` while they change the segment set, so they never race.

danube.ingest.wal.wal.Wal mixes it in; the state it uses is the WAL's.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from enum import Enum
from pathlib import Path
from typing import Any

from danube.ingest.wal.cache import MessageCache
from danube.ingest.wal.checkpoint import CheckpointStore
from danube.ingest.wal.commit import in_thread
from danube.ingest.wal.errors import WalClosedError
from danube.ingest.wal.feed import registered
from danube.ingest.wal.fileops import FileOps
from danube.ingest.wal.options import WalOptions
from danube.ingest.wal.repair import RepairRefusedError, SegmentDamage, find_damage, rewrite_segment
from danube.ingest.wal.results import SegmentInfo
from danube.ingest.wal.segment import SegmentSet

log = logging.getLogger("danube.ingest.wal.wal")  # the WAL's log, whichever module writes it

DEFAULT_OPEN_TIMEOUT_S = 300.0
"""Recovery scans a whole last segment (up to rotation_max_bytes): allow it minutes, not hours."""


# The life of a WAL (its ``_state``), defined here because the upkeep checks it too.
class _State(Enum):
    OPEN = "open"
    CLOSING = "closing"
    CLOSED = "closed"


class SegmentUpkeep:
    """Listings, repairs and drops of sealed segments (danube.ingest.wal.wal.Wal mixes it in; its
    state and ``start_offset`` are the WAL's)."""

    directory: Path
    options: WalOptions
    _ops: FileOps
    _memory: bool
    _state: _State
    _segments: SegmentSet
    _checkpoints: CheckpointStore
    _cache: MessageCache
    _start_floor: int
    _durable_next: int
    _admin_lock: asyncio.Lock
    # Called with the new start offset before a drop removes segments (danube.ingest's
    # producer tracking snapshots the states those records fed); one that raises stops it.
    _drop_guards: list[Callable[[int], Awaitable[None]]]

    # The WAL's own (danube.ingest.wal.wal.Wal).
    @property
    def start_offset(self) -> int:
        raise NotImplementedError

    async def _checkpoint_io(self, op: str, call: Callable[..., object], **kwargs: Any) -> None:
        raise NotImplementedError

    async def segment_infos(self, limit: int) -> list[SegmentInfo]:
        """The ``limit`` oldest segments with their offsets, sizes and mtimes (for retention).

        A segment dropped while its mtime is read is left out.
        """
        if self._memory:
            return []
        listed = self._segments.oldest(limit)
        paths = [segment.path for segment, _ in listed]
        times = await in_thread("stat", self.options.io_timeout_s, self._modified_ms, paths)
        return [
            SegmentInfo(segment.first_offset, end, segment.size_bytes, segment.sealed, modified)
            for (segment, end), modified in zip(listed, times, strict=True)
            if modified is not None
        ]

    def _modified_ms(self, paths: list[Path]) -> list[int | None]:
        found: list[int | None] = []
        for path in paths:
            try:
                found.append(self._ops.modified_ms(path))
            except FileNotFoundError:
                found.append(None)
        return found

    def segment_names(self) -> list[str]:
        """The segment file names, oldest first."""
        return self._segments.names()

    def add_drop_guard(self, guard: Callable[[int], Awaitable[None]]) -> Callable[[], None]:
        """Await ``guard(new_start_offset)`` before :meth:`drop_below` removes segments (the
        records below ``new_start_offset`` go); if it raises, nothing is dropped. Returns
        its remover."""
        return registered(self._drop_guards, guard)

    async def find_damage(self, offset: int) -> SegmentDamage | None:
        """The damage of the sealed segment holding ``offset`` (a bad frame at or before
        it), found by scanning the segment afresh; None when it is intact, gone, or the
        newest segment (whose bad tail is cut at open, never repaired)."""
        if self._memory or self._state is _State.CLOSED:
            return None
        plan = self._segments.plan(offset)
        if len(plan) < 2 or plan[0][0].first_offset > offset:
            return None
        segment, successor = plan[0][0], plan[1][0]
        return await in_thread(
            "scan",
            DEFAULT_OPEN_TIMEOUT_S,  # a whole segment is read: as at open, minutes at most
            find_damage,
            self._ops,
            segment,
            successor.first_offset,
            max_payload_bytes=self.options.max_frame_payload_bytes,
        )

    async def repair_segment(self, damage: SegmentDamage, frames: bytes) -> None:
        """Rewrite the damaged segment as its good prefix followed by ``frames`` (the whole
        frames of ``[damage.bad_offset, damage.end_offset)`` as another copy holds them),
        crash-safely (danube.ingest.wal.repair); afterwards it reads as that copy does.
        :class:`RepairRefusedError` when the frames do not fit or the segment changed or
        left (dropped) meanwhile."""
        if self._state is _State.CLOSED:
            raise WalClosedError()
        async with self._admin_lock:  # not while drop_below removes segments
            found = self._segments.with_successor(damage.first_offset)
            if found is None or found[1] != damage.end_offset:
                raise RepairRefusedError(f"{damage.segment} is not a sealed segment any more")
            segment = found[0]
            repaired = await in_thread(
                "repair",
                DEFAULT_OPEN_TIMEOUT_S,  # copies the segment's good prefix: as a scan
                rewrite_segment,
                self._ops,
                segment,
                damage,
                frames,
                max_payload_bytes=self.options.max_frame_payload_bytes,
            )
            self._segments.replace(segment, repaired)
        log.warning(
            "repaired WAL segment",
            extra={
                "wal_dir": str(self.directory),
                "segment": damage.segment,
                "from_offset": damage.bad_offset,
                "to_offset": damage.end_offset,
            },
        )

    async def drop_below(self, offset: int) -> int:
        """Delete sealed segments whose every offset is below ``offset``; return how many.

        The newest segment always stays. ``start_offset`` rises to the first remaining segment;
        the checkpoint records it before any file goes. In ``memory`` mode the cache is trimmed.
        """
        if self._state is _State.CLOSED:
            raise WalClosedError()
        if self._memory:
            self._cache.trim_below(min(offset, self._durable_next))
            return 0
        async with self._admin_lock:
            new_start = self._segments.end_below(offset)
            if new_start is None:
                return 0
            for guard in tuple(self._drop_guards):
                await guard(new_start)  # one that raises drops nothing (the caller asks again)
            detached = self._segments.detach_below(offset)
            if not detached:
                return 0
            self._start_floor = max(self._start_floor, self._segments.first_offset() or 0)
            self._cache.trim_below(self.start_offset)
            await self._checkpoint_io(
                "drop",
                self._remove_segments,
                paths=[segment.path for segment in detached],
                start_offset=self.start_offset,
                floor=self._durable_next,
            )
        log.info(
            "dropped WAL segments",
            extra={"wal_dir": str(self.directory), "segments": len(detached), "below": offset},
        )
        return len(detached)

    def _remove_segments(self, *, paths: list[Path], start_offset: int, floor: int) -> None:
        # Checkpoint first: a crash between the two leaves files that the next open removes.
        self._checkpoints.write(start_offset=start_offset, next_offset=floor)
        for path in paths:
            self._ops.remove(path)
        self._ops.fsync_dir(self.directory)

"""The WAL's volume against the free-space reserve (``ingest.disk_free_min_bytes``).

The WAL refuses an append that would leave less than the reserve free (danube.ingest.wal
.bounded). On a volume not much larger than the reserve that is every append, for ever, and
nothing else would say so (issue 31: a 30 MiB volume under the default 64 MiB reserve). So:

- **at start** (:func:`judge_volume`, :func:`check_wal_volume`): a volume whose *total* size
  is below the reserve plus a minimal working room (:func:`room_min_bytes`) can never take a
  write — a configuration error, the process exits with code 2 naming the numbers; a volume
  whose *free* space is below the reserve now, or too small for one whole segment above the
  reserve (``wal_cloud.wal.rotation.max_bytes``: the active segment would never be sealed by
  size, so retention could never drop it), is logged as a WARNING with the numbers;
- **while running** (:class:`DiskRoom`): the node is not ready (``/readyz`` 503, reason
  ``disk_full`` with the numbers) while the free space leaves no room for even the smallest
  append above the reserve, and ready again once it does; each change is logged once.
"""

from __future__ import annotations

import asyncio
import logging
import os
from dataclasses import dataclass
from pathlib import Path

from danube.config import ConfigError, DanubeSettings
from danube.config.errors import ConfigProblem
from danube.frame import FRAME_HEADER_BYTES
from danube.runtime.http import NotReady

log = logging.getLogger(__name__)

MiB = 1024 * 1024
WORKING_ROOM_MIN_BYTES = 1 * MiB
"""Room above the reserve below which a WAL cannot work at all: a segment, its checkpoint
and epoch files, a few batches (and never less than one message of the largest size)."""
CHECK_INTERVAL_S = 1.0
"""How often the free space is read for readiness (off the event loop)."""

RESERVE_KEY = "ingest.disk_free_min_bytes"
DISK_FULL = "disk_full"


@dataclass(frozen=True)
class VolumeSpace:
    """The file system a path is on: its size and what an unprivileged writer may still use."""

    total_bytes: int
    free_bytes: int


def volume_space(path: Path) -> VolumeSpace:
    """:class:`VolumeSpace` of the file system holding ``path`` (or, before it exists, its
    nearest existing parent: where it will be created). Blocks: call it off the loop."""
    probe = path
    while not probe.exists() and probe.parent != probe:
        probe = probe.parent
    stats = os.statvfs(probe)
    return VolumeSpace(stats.f_blocks * stats.f_frsize, stats.f_bavail * stats.f_frsize)


def room_min_bytes(settings: DanubeSettings) -> int:
    """The least room above the reserve a WAL volume must have in total to be usable."""
    return max(WORKING_ROOM_MIN_BYTES, 2 * settings.ingest.max_message_bytes)


@dataclass(frozen=True)
class Verdict:
    """What :func:`judge_volume` found: an error (the node cannot work there) and warnings."""

    error: str | None
    warnings: tuple[str, ...]


def judge_volume(
    space: VolumeSpace, *, reserve_bytes: int, room_min_bytes: int, segment_bytes: int
) -> Verdict:
    """Judge a WAL volume against the reserve (no I/O). The messages carry the numbers."""
    numbers = (
        f"volume {_size(space.total_bytes)} total, {_size(space.free_bytes)} free;"
        f" reserve {RESERVE_KEY}={_size(reserve_bytes)}"
    )
    if space.total_bytes < reserve_bytes + room_min_bytes:
        return Verdict(
            f"the WAL volume can never take a write: {numbers}; it needs at least"
            f" {_size(reserve_bytes + room_min_bytes)} (the reserve plus"
            f" {_size(room_min_bytes)} of working room): lower {RESERVE_KEY} or give the WAL"
            " a larger volume",
            (),
        )
    warnings: list[str] = []
    if space.free_bytes < reserve_bytes + FRAME_HEADER_BYTES:
        warnings.append(
            f"the WAL volume has less free space than the reserve: {numbers}; every append is"
            f" refused ({DISK_FULL}) and /readyz answers 503 until space is freed"
        )
    if space.total_bytes < reserve_bytes + segment_bytes:
        warnings.append(
            f"the WAL volume cannot hold one whole segment above the reserve: {numbers},"
            f" wal_cloud.wal.rotation.max_bytes={_size(segment_bytes)}; the active segment"
            " fills the disk before it is sealed by size, and only sealed segments can be"
            " dropped: lower rotation.max_bytes (or set rotation.max_hours)"
        )
    return Verdict(None, tuple(warnings))


async def check_wal_volume(settings: DanubeSettings) -> None:
    """Judge the WAL volume at start: raise :class:`ConfigError` if it can never take a
    write, log each warning (WARNING, with the numbers) otherwise."""
    wal_dir = settings.wal_cloud.wal.dir
    space = await asyncio.to_thread(volume_space, wal_dir)
    verdict = judge_volume(
        space,
        reserve_bytes=settings.ingest.disk_free_min_bytes,
        room_min_bytes=room_min_bytes(settings),
        segment_bytes=settings.wal_cloud.wal.rotation.max_bytes,
    )
    numbers = {
        "wal_dir": str(wal_dir),
        "total_bytes": space.total_bytes,
        "free_bytes": space.free_bytes,
        "free_min_bytes": settings.ingest.disk_free_min_bytes,
    }
    if verdict.error is not None:
        message = f"{verdict.error} (wal_cloud.wal.dir {wal_dir})"
        raise ConfigError(message, problems=[ConfigProblem(RESERVE_KEY, message)])
    for warning in verdict.warnings:
        log.warning("%s (wal_cloud.wal.dir %s)", warning, wal_dir, extra=numbers)


class DiskRoom:
    """Whether the WAL volume has room above the reserve, read every
    :data:`CHECK_INTERVAL_S` off the event loop (:meth:`watch`); :meth:`not_ready` is the
    node's readiness reason while it has none."""

    def __init__(self, wal_dir: Path, reserve_bytes: int) -> None:
        self.wal_dir = wal_dir
        self.reserve_bytes = reserve_bytes
        self.space: VolumeSpace | None = None  # the last reading

    def full(self) -> bool:
        """Whether even the smallest append would be refused, as of the last reading."""
        space = self.space
        return space is not None and space.free_bytes < self.reserve_bytes + FRAME_HEADER_BYTES

    def not_ready(self) -> NotReady | None:
        """The ``disk_full`` readiness reason with the numbers, or ``None``."""
        space = self.space
        if space is None or not self.full():
            return None
        return NotReady(
            DISK_FULL,
            f"the WAL volume has {_size(space.free_bytes)} free, below the reserve"
            f" {RESERVE_KEY}={_size(self.reserve_bytes)}: appends are refused until space"
            " is freed",
            {
                "wal_dir": str(self.wal_dir),
                "free_bytes": space.free_bytes,
                "total_bytes": space.total_bytes,
                "free_min_bytes": self.reserve_bytes,
            },
        )

    async def read(self) -> None:
        """Read the free space now (off the loop); log a change into or out of full."""
        was_full = self.full()
        try:
            self.space = await asyncio.to_thread(volume_space, self.wal_dir)
        except OSError as exc:
            log.warning("cannot read the WAL volume's free space: %s", exc)
            return
        if self.full() != was_full:
            reason = self.not_ready()
            if reason is not None:
                log.error("not ready: %s", reason.message, extra=dict(reason.details))
            else:
                log.warning(
                    "ready again: the WAL volume has room above the reserve",
                    extra={"wal_dir": str(self.wal_dir), "free_bytes": self._free()},
                )

    def _free(self) -> int:
        return -1 if self.space is None else self.space.free_bytes

    async def watch(self) -> None:
        """Read the free space every :data:`CHECK_INTERVAL_S` until cancelled."""
        while True:
            await self.read()
            await asyncio.sleep(CHECK_INTERVAL_S)


def _size(size_bytes: int) -> str:
    """``31457280`` → ``31457280 B (30.0 MiB)``: exact, and readable."""
    return f"{size_bytes} B ({size_bytes / MiB:.1f} MiB)"

"""The file layer an ingest node shares between all its WALs, with two node-wide limits.

- **Open segment files** (``open_max``): a WAL keeps its active segment open between batches;
  with a thousand partitions that is a thousand descriptors, and a process past its
  ``RLIMIT_NOFILE`` cannot accept a connection or open a checkpoint any more. Here a segment's
  descriptor is a *handle*; at most ``open_max`` of them hold a real descriptor, the least
  recently used is closed (fdatasync'ed first if it has unsynced bytes, so a write-back error
  is never lost with it) and reopened at its next use.
- **Free space** (``free_min_bytes``): a batch that would leave less than this free on the WAL's
  filesystem is refused with :class:`DiskFullError` before a byte is written, so checkpoints,
  epoch files and new segments still find room, and producers hear "disk full" at once instead
  of a failed WAL. The change into and out of that state is logged once, naming the directory.
  Allocating a segment ahead of its writes (:meth:`BoundedFileOps.allocate`) never takes the
  free space under the floor: it is refused instead, and the writes go on as appends.

Every method blocks (worker threads); the handle table is shared by the WALs' writer threads,
so it is guarded by one lock, and each handle by its own while a system call uses it.
"""

from __future__ import annotations

import errno
import logging
import os
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path

from danube.ingest.wal.errors import DiskFullError
from danube.ingest.wal.fileops import OsFileOps

log = logging.getLogger(__name__)

ROOM_TRUSTED_BYTES = 1 << 30
"""Free space this far above the floor, seen less than ROOM_TRUSTED_S ago, is trusted
without asking the filesystem again (what was written since is taken off it): no other
writer fills a gibibyte between two looks a second apart, and a batch saves a system call."""
ROOM_TRUSTED_S = 1.0

_FIRST_HANDLE = 1 << 40
"""Handles are numbered from here: never mistaken for a real descriptor (an ``int`` too)."""


@dataclass(eq=False)
class _Handle:
    path: Path
    fd: int | None
    lock: threading.Lock = field(default_factory=threading.Lock)
    unsynced: bool = False
    error: OSError | None = None
    """A write-back error met closing the descriptor for room: the next fdatasync raises it."""


class BoundedFileOps(OsFileOps):
    """:class:`OsFileOps` with at most ``open_max`` segment descriptors open and a floor of
    ``free_min_bytes`` free on the disk (``wal_root`` names it in logs and metrics)."""

    def __init__(self, *, open_max: int, free_min_bytes: int, wal_root: Path) -> None:
        if open_max < 1 or free_min_bytes < 0:
            raise ValueError("open_max must be at least 1 and free_min_bytes not negative")
        self.open_max = open_max
        self.free_min_bytes = free_min_bytes
        self.wal_root = wal_root
        self._lock = threading.Lock()
        self._handles: dict[int, _Handle] = {}
        self._open: OrderedDict[int, None] = OrderedDict()  # handles with a descriptor, LRU first
        self._next_handle = _FIRST_HANDLE
        self.reopens = 0
        self.disk_full = False
        self.free_bytes_seen: int | None = None
        self._room_left = 0  # free bytes above the floor as last seen, less what went since
        self._room_seen_at = float("-inf")  # time.monotonic() of that look

    # --- descriptors -----------------------------------------------------------------------

    @property
    def open_count(self) -> int:
        """Segment descriptors open now."""
        with self._lock:
            return len(self._open)

    def create(self, path: Path, *, exclusive: bool) -> int:
        """Create the file; return a handle (its descriptor may be closed and reopened)."""
        fd = super().create(path, exclusive=exclusive)
        with self._lock:
            handle, self._next_handle = self._next_handle, self._next_handle + 1
            self._handles[handle] = _Handle(path, fd)
            self._open[handle] = None
            victims = self._victims(keep=handle)
        self._close_victims(victims)
        return handle

    def _take(self, handle: int) -> tuple[_Handle, list[_Handle]]:
        """The handle's entry, locked, with a descriptor open; and the handles closed for
        room (:meth:`_give` closes them once the caller is done). No context manager: a
        writer thread takes a handle twice per batch."""
        with self._lock:
            entry = self._handles.get(handle)
        if entry is None:
            raise OSError(f"unknown WAL file handle {handle}")
        entry.lock.acquire()
        victims: list[_Handle] = []
        try:
            if entry.fd is None:
                entry.fd = super().reopen(entry.path)
                with self._lock:
                    self.reopens += 1
                    self._open[handle] = None
                    victims = self._victims(keep=handle)
            else:
                with self._lock:
                    if handle in self._open:
                        self._open.move_to_end(handle)
        except BaseException:
            entry.lock.release()
            raise
        return entry, victims

    def _give(self, entry: _Handle, victims: list[_Handle]) -> None:
        """Release a handle from :meth:`_take` and close the ones taken for room (also when
        the call on it failed: their locks are held until closed)."""
        entry.lock.release()
        self._close_victims(victims)

    def _victims(self, *, keep: int) -> list[_Handle]:
        """Take (locked) the least recently used handles beyond ``open_max``; under the lock.

        A handle busy in another thread is skipped: the table may exceed the limit by the
        number of writer threads for a moment, never by more."""
        victims: list[_Handle] = []
        excess = len(self._open) - self.open_max
        for handle in list(self._open):
            if excess <= 0:
                break
            entry = self._handles[handle]
            if handle == keep or not entry.lock.acquire(blocking=False):
                continue
            del self._open[handle]
            victims.append(entry)
            excess -= 1
        return victims

    def _close_victims(self, victims: list[_Handle]) -> None:
        for entry in victims:
            try:
                fd, entry.fd = entry.fd, None
                if fd is None:
                    continue
                try:
                    if entry.unsynced:
                        super().fdatasync(fd)
                        entry.unsynced = False
                except OSError as exc:
                    entry.error = exc
                finally:
                    super().close(fd)
            finally:
                entry.lock.release()

    def write(self, fd: int, data: bytes | bytearray | memoryview) -> None:
        """Write all of ``data`` at the handle's file position (a fresh file: sequentially)."""
        entry, victims = self._take(fd)
        try:
            assert entry.fd is not None
            entry.unsynced = True
            super().write(entry.fd, data)
        finally:
            self._give(entry, victims)

    def write_at(self, fd: int, data: bytes | bytearray | memoryview, position: int) -> None:
        """Write all of ``data`` at ``position`` of the handle's file."""
        entry, victims = self._take(fd)
        try:
            assert entry.fd is not None
            entry.unsynced = True
            super().write_at(entry.fd, data, position)
        finally:
            self._give(entry, victims)

    def allocate(self, fd: int, position: int, length: int) -> None:
        """Allocate the range unless that would take the free space under the floor (then
        ENOSPC, allocating nothing: room kept for what must be written, not reserved)."""
        entry, victims = self._take(fd)
        try:
            assert entry.fd is not None
            if not self._take_trusted_room(length, time.monotonic()):
                stats = os.fstatvfs(entry.fd)
                if stats.f_bavail * stats.f_frsize - length < self.free_min_bytes:
                    raise OSError(errno.ENOSPC, "allocating ahead would pass the WAL disk's floor")
            entry.unsynced = True
            super().allocate(entry.fd, position, length)
        finally:
            self._give(entry, victims)

    def fdatasync(self, fd: int) -> None:
        """Make the handle's file durable (or raise the error its last closing met)."""
        entry, victims = self._take(fd)
        try:
            assert entry.fd is not None
            if entry.error is not None:
                raise entry.error
            super().fdatasync(entry.fd)
            entry.unsynced = False
        finally:
            self._give(entry, victims)

    def close(self, fd: int) -> None:
        """Close the handle and its descriptor, if open."""
        with self._lock:
            entry = self._handles.pop(fd, None)
            self._open.pop(fd, None)
        if entry is None:
            raise OSError(f"unknown WAL file handle {fd}")
        with entry.lock:
            if entry.fd is not None:
                real, entry.fd = entry.fd, None
                super().close(real)

    # --- free space ------------------------------------------------------------------------

    def _take_trusted_room(self, size_bytes: int, now: float) -> bool:
        """Take ``size_bytes`` off the last look at the free space if that look is still
        trusted (under ROOM_TRUSTED_S old) and leaves ROOM_TRUSTED_BYTES after them."""
        with self._lock:
            if (
                now - self._room_seen_at < ROOM_TRUSTED_S
                and self._room_left - size_bytes >= ROOM_TRUSTED_BYTES
            ):
                self._room_left -= size_bytes
                return True
            return False

    def check_room(self, path: Path, size_bytes: int) -> None:
        """Raise :class:`DiskFullError` if writing ``size_bytes`` at ``path`` would leave less
        than ``free_min_bytes`` free; log the change into and out of that state once. With
        ROOM_TRUSTED_BYTES to spare as of under ROOM_TRUSTED_S ago, the last look answers."""
        now = time.monotonic()
        if self._take_trusted_room(size_bytes, now):
            return
        free = self.free_bytes(path)
        full = free - size_bytes < self.free_min_bytes
        with self._lock:
            changed = full != self.disk_full
            self.disk_full, self.free_bytes_seen = full, free
            self._room_left = free - size_bytes - self.free_min_bytes
            self._room_seen_at = now
        if changed and full:
            log.error(
                "WAL disk full: appends are refused (disk_full) until space is freed",
                extra={
                    "wal_dir": str(self.wal_root),
                    "free_bytes": free,
                    "free_min_bytes": self.free_min_bytes,
                },
            )
        elif changed:
            log.warning(
                "WAL disk has room again: appends are accepted",
                extra={"wal_dir": str(self.wal_root), "free_bytes": free},
            )
        if full:
            raise DiskFullError(wal_dir=str(path), free_bytes=free, needed_bytes=size_bytes)

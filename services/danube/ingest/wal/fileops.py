"""The file layer under the WAL: every system call it makes, behind one small Protocol.

This is the seam where tests plug in a slow or failing disk (subclass :class:`OsFileOps` and
override ``fdatasync``) instead of patching ``os``. Every method blocks; the WAL calls them from
worker threads only, never on the event loop.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Protocol

_FILE_MODE = 0o644
_ZEROS = bytes(1024 * 1024)  # what allocate() writes, a slice at a time
_ZEROS_VIEW = memoryview(_ZEROS)
MAX_SMALL_FILE_BYTES = 1024 * 1024
"""``read_file`` refuses larger files: it reads the checkpoint, which is a few hundred bytes."""


class FileOps(Protocol):
    """The blocking file operations the WAL needs (a file descriptor is an ``int``)."""

    def makedirs(self, path: Path) -> None:
        """Create ``path`` and missing parents (no error if it exists)."""

    def listdir(self, path: Path) -> list[str]:
        """Names in directory ``path``."""

    def size(self, path: Path) -> int:
        """The file's size in bytes."""

    def modified_ms(self, path: Path) -> int:
        """When the file's data last changed (its mtime), in ms since the epoch."""

    def create(self, path: Path, *, exclusive: bool) -> int:
        """Open a new file for writing (``exclusive``: fail if it exists, else truncate it)."""

    def check_room(self, path: Path, size_bytes: int) -> None:
        """Raise :class:`DiskFullError` if ``size_bytes`` more would not fit where ``path`` is
        (a policy of the layer: the plain disk checks nothing and lets ENOSPC tell)."""

    def free_bytes(self, path: Path) -> int:
        """Bytes an unprivileged writer may still use on the filesystem holding ``path``."""

    def write(self, fd: int, data: bytes | bytearray | memoryview) -> None:
        """Write all of ``data`` at the file's current position."""

    def write_at(self, fd: int, data: bytes | bytearray | memoryview, position: int) -> None:
        """Write all of ``data`` at byte ``position`` (the file's own position unchanged)."""

    def allocate(self, fd: int, position: int, length: int) -> None:
        """Give the file disk blocks for ``[position, position + length)``, holding zeros;
        its size grows to the end of that range if it was shorter. OSError (ENOSPC) when
        there is no room, possibly with part of the range allocated."""

    def fdatasync(self, fd: int) -> None:
        """Make the file's data (and its size) durable."""

    def close(self, fd: int) -> None:
        """Close a descriptor from :meth:`create`."""

    def fsync_dir(self, path: Path) -> None:
        """Make the directory's entries (created, renamed, removed files) durable."""

    def read_at(self, path: Path, position: int, size: int) -> bytes:
        """Up to ``size`` bytes from ``position`` (fewer only at the end of the file)."""

    def read_file(self, path: Path) -> bytes:
        """A whole small file (at most :data:`MAX_SMALL_FILE_BYTES`)."""

    def truncate(self, path: Path, size: int) -> None:
        """Cut the file to ``size`` bytes and make that durable."""

    def replace(self, source: Path, target: Path) -> None:
        """Rename ``source`` over ``target`` atomically."""

    def remove(self, path: Path) -> None:
        """Delete a file (no error if it is already gone)."""


class OsFileOps:
    """:class:`FileOps` over the ``os`` module: the real disk."""

    def makedirs(self, path: Path) -> None:
        """Create ``path`` and missing parents (no error if it exists)."""
        os.makedirs(path, exist_ok=True)

    def listdir(self, path: Path) -> list[str]:
        """Names in directory ``path``."""
        return os.listdir(path)

    def size(self, path: Path) -> int:
        """The file's size in bytes."""
        return os.stat(path).st_size

    def modified_ms(self, path: Path) -> int:
        """When the file's data last changed (its mtime), in ms since the epoch."""
        return os.stat(path).st_mtime_ns // 1_000_000

    def create(self, path: Path, *, exclusive: bool) -> int:
        """Open a new file for writing (``exclusive``: fail if it exists, else truncate it).

        No ``O_APPEND``: a segment's writer says where each write goes (:meth:`write_at`),
        since its file may reach past its last frame (:meth:`allocate`)."""
        flags = os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC
        flags |= os.O_EXCL if exclusive else os.O_TRUNC
        return os.open(path, flags, _FILE_MODE)

    def reopen(self, path: Path) -> int:
        """Open an existing file for writing (a descriptor closed to save descriptors)."""
        return os.open(path, os.O_WRONLY | os.O_CLOEXEC)

    def check_room(self, path: Path, size_bytes: int) -> None:
        """No policy on the plain disk: a full one answers ENOSPC to the write itself."""

    def free_bytes(self, path: Path) -> int:
        """Bytes an unprivileged writer may still use on the filesystem holding ``path``."""
        stats = os.statvfs(path)
        return stats.f_bavail * stats.f_frsize

    def write(self, fd: int, data: bytes | bytearray | memoryview) -> None:
        """Write all of ``data``: ``os.write`` may write less than asked (signals, quotas)."""
        written = os.write(fd, data)
        if written == len(data):
            return
        view = memoryview(data)[written:]
        while view:
            written = os.write(fd, view)
            view = view[written:]

    def write_at(self, fd: int, data: bytes | bytearray | memoryview, position: int) -> None:
        """Write all of ``data`` at ``position``."""
        _pwrite_all(fd, data, position)

    def allocate(self, fd: int, position: int, length: int) -> None:
        """Zeros written over the range (the size grows to its end). Written, not
        ``posix_fallocate``: its blocks would be *unwritten* extents, and each later write
        into them converts a piece of the extent, metadata its fdatasync commits; over
        written zeros a write and its fdatasync change data only (PostgreSQL zero-fills its
        WAL segments for the same reason). The zeros reach the disk with the next fdatasync."""
        while length > 0:
            chunk = min(length, len(_ZEROS))
            _pwrite_all(fd, _ZEROS_VIEW[:chunk], position)
            position += chunk
            length -= chunk

    def fdatasync(self, fd: int) -> None:
        """Make the file's data (and its size) durable."""
        os.fdatasync(fd)

    def close(self, fd: int) -> None:
        """Close a descriptor from :meth:`create`."""
        os.close(fd)

    def fsync_dir(self, path: Path) -> None:
        """Make the directory's entries durable: a new file is not crash-safe until this."""
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def read_at(self, path: Path, position: int, size: int) -> bytes:
        """Up to ``size`` bytes from ``position`` (fewer only at the end of the file)."""
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        try:
            chunks: list[bytes] = []
            while size > 0:
                chunk = os.pread(fd, size, position)
                if not chunk:
                    break
                chunks.append(chunk)
                position += len(chunk)
                size -= len(chunk)
            return chunks[0] if len(chunks) == 1 else b"".join(chunks)
        finally:
            os.close(fd)

    def read_file(self, path: Path) -> bytes:
        """A whole small file (at most :data:`MAX_SMALL_FILE_BYTES`)."""
        data = self.read_at(path, 0, MAX_SMALL_FILE_BYTES + 1)
        if len(data) > MAX_SMALL_FILE_BYTES:
            raise OSError(f"{path} is larger than {MAX_SMALL_FILE_BYTES} bytes")
        return data

    def truncate(self, path: Path, size: int) -> None:
        """Cut the file to ``size`` bytes and make that durable."""
        fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
        try:
            os.ftruncate(fd, size)
            os.fdatasync(fd)
        finally:
            os.close(fd)

    def replace(self, source: Path, target: Path) -> None:
        """Rename ``source`` over ``target`` atomically."""
        os.replace(source, target)

    def remove(self, path: Path) -> None:
        """Delete a file (no error if it is already gone)."""
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)


def _pwrite_all(fd: int, data: bytes | bytearray | memoryview, position: int) -> None:
    """All of ``data`` at ``position``: ``os.pwrite`` may write less than asked."""
    written = os.pwrite(fd, data, position)
    if written == len(data):
        return
    view = memoryview(data)[written:]
    position += written
    while view:
        written = os.pwrite(fd, view, position)
        view = view[written:]
        position += written

"""Where a subscription's delayed messages go past their memory bound
(danube.dispatcher.delayed): buckets of packed records, appended in pieces and taken back
whole when due. A node-local cache: nothing is fsynced, and a restart never reads it (the
log is what a resume reads again).

:class:`FileSpill` does its file I/O on one worker thread of its own, in submission order,
never on the event loop: an append is queued (its bytes held until written), a bucket about
to fall due is read ahead (:meth:`FileSpill.prefetch`), so :meth:`FileSpill.take` normally
finds it read. Only a take with nothing read ahead waits for the thread, and an append while
more than ``QUEUED_BYTES_MAX`` wait to be written (a disk slower than the log is read).
"""

from __future__ import annotations

import contextlib
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Protocol

# Bytes of appends queued for the thread at most: past it an append waits for the oldest.
QUEUED_BYTES_MAX = 16 << 20
QUEUED_APPENDS_MAX = 256  # and appends (each holds a future and a work item)


class Spill(Protocol):
    """Where buckets go when memory is full: appended in pieces, taken back whole."""

    def append(self, bucket: int, data: bytes) -> None: ...
    def prefetch(self, bucket: int) -> None: ...
    def take(self, bucket: int) -> bytes: ...
    def clear(self) -> None: ...


class MemorySpill:
    """A :class:`Spill` in memory (tests; a subscription that never spills)."""

    def __init__(self) -> None:
        self.buckets: dict[int, bytearray] = {}

    def append(self, bucket: int, data: bytes) -> None:
        """Add ``data`` to ``bucket``."""
        self.buckets.setdefault(bucket, bytearray()).extend(data)

    def prefetch(self, bucket: int) -> None:
        """Nothing to read ahead."""

    def take(self, bucket: int) -> bytes:
        """All of ``bucket``, which is gone then."""
        return bytes(self.buckets.pop(bucket, b""))

    def clear(self) -> None:
        """Drop everything."""
        self.buckets.clear()


class FileSpill:
    """A :class:`Spill` as one file per bucket under ``directory`` (made at the first
    append, removed by :meth:`clear`), written and read on a thread of its own."""

    def __init__(self, directory: Path, *, queued_bytes_max: int = QUEUED_BYTES_MAX) -> None:
        self.directory = directory
        self.queued_bytes_max = queued_bytes_max
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="delay-spill")
        self._ahead: dict[int, Future[bytes]] = {}  # buckets read ahead (and removed)
        # Appends not known to be written, oldest first, with their sizes: their bytes are
        # held until then, so at most queued_bytes_max are (past it, an append waits).
        self._queued: deque[tuple[Future[None], int]] = deque()
        self._queued_bytes = 0
        self._cleared = False

    def _path(self, bucket: int) -> Path:
        return self.directory / f"{bucket:016d}.dly"

    def append(self, bucket: int, data: bytes) -> None:
        """Add ``data`` to ``bucket``'s file (queued; written in order)."""
        ahead = self._ahead.pop(bucket, None)
        if ahead is not None:  # read ahead too early: what it read goes back first
            self._thread.submit(self._put_back, bucket, ahead)
        queued = self._queued
        while queued and (
            queued[0][0].done()
            or self._queued_bytes > self.queued_bytes_max
            or len(queued) >= QUEUED_APPENDS_MAX
        ):
            written, size = queued.popleft()
            written.result()  # a disk slower than the reads: the caller waits here (rare)
            self._queued_bytes -= size
        queued.append((self._thread.submit(self._append, bucket, data), len(data)))
        self._queued_bytes += len(data)

    @property
    def queued_bytes(self) -> int:
        """Bytes of appends not known to be written yet."""
        return self._queued_bytes

    def prefetch(self, bucket: int) -> None:
        """Read ``bucket`` (and remove its file) now, for a take soon."""
        if bucket not in self._ahead:
            self._ahead[bucket] = self._thread.submit(self._read, bucket)

    def take(self, bucket: int) -> bytes:
        """``bucket``'s bytes, its file gone: read ahead, or read now (waiting)."""
        ahead = self._ahead.pop(bucket, None)
        if ahead is None:
            ahead = self._thread.submit(self._read, bucket)
        return ahead.result()

    def clear(self) -> None:
        """Remove every file and the directory (queued after what is under way); once: a
        subscription that fails and then stops clears twice."""
        if self._cleared:
            return
        self._cleared = True
        self._ahead.clear()
        self._queued.clear()
        self._queued_bytes = 0
        self._thread.submit(self._remove_all)
        self._thread.shutdown(wait=False)

    def drain(self) -> None:
        """Wait until every queued file operation is done (a test's view of the files)."""
        self._thread.shutdown(wait=True)  # after clear(); before it, a round trip would do
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="delay-spill")

    # --- on the thread ---------------------------------------------------------------------

    def _append(self, bucket: int, data: bytes) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        with open(self._path(bucket), "ab") as file:
            file.write(data)

    def _put_back(self, bucket: int, read: Future[bytes]) -> None:
        data = read.result()  # done: submitted before this, on this one thread
        if data:
            self._append(bucket, data)

    def _read(self, bucket: int) -> bytes:
        path = self._path(bucket)
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            return b""
        path.unlink()
        return data

    def _remove_all(self) -> None:
        if not self.directory.exists():
            return
        for path in self.directory.glob("*.dly"):
            path.unlink(missing_ok=True)
        with contextlib.suppress(OSError):
            self.directory.rmdir()

"""Backpressure: a byte budget for appends accepted but not yet durable, with a FIFO of waiters.

An append's share of the budget is its frame bytes (:func:`frame_bytes`, which checks its
sizes first).

An append first acquires its frame bytes; the writer releases them once the batch is durable.
While the budget is spent, appenders wait in arrival order (a large append is not starved by a
stream of small ones) instead of growing the writer's queue: memory stays bounded by
``max_pending_bytes``. Event-loop only; not thread-safe.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable

from danube.frame.batch import FrameBatch
from danube.ingest.wal.errors import AppendTooLargeError, PayloadTooLargeError
from danube.ingest.wal.options import WalOptions


def frame_bytes(frames: FrameBatch, options: WalOptions) -> int:
    """The frame bytes of an append of ``frames``, once every record is checked against the
    frame limit and the whole against the pending budget (it must fit it whole)."""
    limit = options.max_frame_payload_bytes
    index, biggest = frames.largest_record()
    if biggest > limit:
        raise PayloadTooLargeError(index=index, size_bytes=biggest, limit_bytes=limit)
    nbytes = frames.nbytes
    # max_pending_bytes holds one frame at least (options): a lone record always fits.
    if len(frames) > 1 and nbytes > options.max_pending_bytes:
        raise AppendTooLargeError(size_bytes=nbytes, limit_bytes=options.max_pending_bytes)
    return nbytes


class Admission:
    """``max_bytes`` of pending appends; :meth:`acquire` waits (FIFO) while they are spent."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.pending_bytes = 0
        self._waiters: deque[tuple[int, asyncio.Future[None]]] = deque()

    @property
    def waiting(self) -> int:
        """Appenders waiting for room (cancelled ones may linger until the next grant)."""
        return sum(1 for _nbytes, future in self._waiters if not future.done())

    def try_acquire(self, nbytes: int) -> bool:
        """Take ``nbytes`` now if there is room and nobody waits (the hot path: no coroutine)."""
        if not self._waiters and self.pending_bytes + nbytes <= self.max_bytes:
            self.pending_bytes += nbytes
            return True
        return False

    async def acquire(self, nbytes: int) -> None:
        """Take ``nbytes`` of the budget, waiting behind earlier waiters while it is spent.

        ``nbytes`` must be at most ``max_bytes`` (the WAL rejects larger appends up front).
        """
        if self.try_acquire(nbytes):
            return
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append((nbytes, future))
        try:
            await future
        except asyncio.CancelledError:
            if future.done() and not future.cancelled():
                self.release(nbytes)  # room granted to a cancelled appender: hand it on
            else:
                self._grant()  # it may have been the head blocking the others
            raise

    def release(self, nbytes: int) -> None:
        """Give back ``nbytes`` (a batch became durable or failed) and admit who now fits."""
        self.pending_bytes -= nbytes
        self._grant()

    def fail_waiters(self, error: Callable[[], BaseException]) -> None:
        """Wake every waiter with a fresh ``error()`` (the WAL closed or failed)."""
        while self._waiters:
            _nbytes, future = self._waiters.popleft()
            if not future.done():
                future.set_exception(error())

    def _grant(self) -> None:
        waiters = self._waiters
        while waiters:
            nbytes, future = waiters[0]
            if future.done():
                waiters.popleft()
                continue
            if self.pending_bytes + nbytes > self.max_bytes:
                return
            waiters.popleft()
            self.pending_bytes += nbytes
            future.set_result(None)

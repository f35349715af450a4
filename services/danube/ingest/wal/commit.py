"""Group commit: the one writer task that owns the segment file.

Appends queue ``(first offset, payloads, frame bytes, future)``. The task takes everything
queued (up to ``max_batch_bytes``; a larger single append goes alone), hands it to the
:class:`SegmentWriter` in a worker thread (one write, and in ``fsync`` mode one fdatasync), and
on success tells the WAL (``on_durable``), which publishes the batch and resolves the futures.
Appends that arrive while the thread works queue up and form the next batch: the slower the
disk, the larger the batches, the fewer fsyncs per message.

Between batches and when idle, the task keeps the ``interval`` fsync cadence and seals a
segment that reached its maximum age, even when no append comes.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from danube.ingest.wal.errors import (
    DiskFullError,
    WalClosedError,
    WalError,
    WalFailedError,
    WalTimeoutError,
)
from danube.ingest.wal.options import Durability, WalOptions
from danube.ingest.wal.writer import SegmentWriter

log = logging.getLogger(__name__)

_T = TypeVar("_T")

Queued = tuple[int, Sequence[bytes], int, "asyncio.Future[None] | None"]
"""One queued append: first offset, payloads, frame bytes, its future (a tuple: the cheapest)."""
DurableHook = Callable[[list[Queued], Sequence[bytes]], None]  # the batch, the frames written
FailedHook = Callable[[str, bool, int], None]  # reason, closed (not failed), bytes released
RefusedHook = Callable[[int, int], None]  # first offset refused, bytes released


async def in_thread(
    op: str, timeout_s: float, call: Callable[..., _T], *args: Any, **kwargs: Any
) -> _T:
    """Run blocking file work in a worker thread with a deadline.

    On timeout the thread cannot be stopped; the caller stops waiting and treats the
    operation as failed (:class:`WalTimeoutError`).
    """
    try:
        async with asyncio.timeout(timeout_s):
            return await asyncio.to_thread(call, *args, **kwargs)
    except TimeoutError as exc:
        raise WalTimeoutError(op=op, timeout_s=timeout_s) from exc


class GroupCommit:
    """The writer task: batches queued appends into one write (and fdatasync) each."""

    def __init__(
        self,
        writer: SegmentWriter,
        options: WalOptions,
        clock: Callable[[], float],
        *,
        on_durable: DurableHook,
        on_failed: FailedHook,
        on_refused: RefusedHook,
    ) -> None:
        self.writer = writer
        self._options = options
        self._clock = clock
        self._on_durable = on_durable
        self._on_failed = on_failed
        self._on_refused = on_refused
        self._interval = options.durability is Durability.INTERVAL
        self._queue: list[Queued] = []
        self._wakeup = asyncio.Event()
        self._writing = False
        self._stopping = False
        self._failed = False
        self._task: asyncio.Task[None] | None = None

    @property
    def idle(self) -> bool:
        """Nothing queued and nothing being written."""
        return not self._queue and not self._writing

    def start(self, name: str) -> None:
        """Start the writer task (owned by this object; :meth:`stop` ends it)."""
        self._task = asyncio.create_task(self._run(), name=name)

    def submit(self, item: Queued) -> None:
        """Queue one append (its room in the pending budget was already taken)."""
        self._queue.append(item)
        self._wakeup.set()

    async def stop(self, timeout_s: float) -> bool:
        """Write what is queued, then end the task; past ``timeout_s``, fail the rest as closed.

        Returns False when it had to give up (a write may still be running in its thread, so
        the file must not be touched again).
        """
        self._stopping = True
        self._wakeup.set()
        task = self._task
        if task is None:
            return True
        try:
            async with asyncio.timeout(timeout_s):
                await asyncio.shield(task)
        except TimeoutError:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            return False
        return True

    async def _run(self) -> None:
        writer = self.writer
        try:
            while not self._failed:
                if self._queue:
                    await self._write(self._take_batch())
                elif self._stopping:
                    return
                else:
                    self._wakeup.clear()
                    try:
                        async with asyncio.timeout(self._idle_timeout_s(writer)):
                            await self._wakeup.wait()
                    except TimeoutError:
                        pass
                if not self._failed:
                    await self._housekeeping(writer)
        except asyncio.CancelledError:
            self._fail("the writer was cancelled at close", closed=True)
            raise
        except Exception as exc:  # a bug: fail loudly rather than leave appenders hanging
            log.exception("WAL writer crashed")
            self._fail(f"the writer crashed: {exc!r}")

    def _take_batch(self) -> list[Queued]:
        queue = self._queue
        total, count, limit = 0, 0, self._options.max_batch_bytes
        for item in queue:
            if count and total + item[2] > limit:
                break
            total += item[2]
            count += 1
        if count == len(queue):
            self._queue = []
            return queue
        batch = queue[:count]
        del queue[:count]
        return batch

    async def _write(self, batch: list[Queued]) -> None:
        groups = [(first, payloads) for first, payloads, _nbytes, _future in batch]
        self._writing = True
        try:
            result = await in_thread(
                "write", self._options.io_timeout_s, self.writer.write_batch, groups
            )
        except DiskFullError as exc:
            self._refuse(batch, exc)
            return
        except (OSError, WalTimeoutError) as exc:
            self._fail(f"write failed: {exc}", batch)
            return
        except asyncio.CancelledError:
            self._fail("closed while writing", batch, closed=True)
            raise
        finally:
            self._writing = False
        for segment, end, next_offset in result.touched:
            segment.size_bytes = end
            segment.next_offset = next_offset
        self._on_durable(batch, result.frames)

    def _idle_timeout_s(self, writer: SegmentWriter) -> float | None:
        """Seconds until the next sync or age rotation is due (``None``: nothing scheduled)."""
        due: list[float] = []
        if self._interval and writer.unsynced:
            due.append(writer.last_sync_at + self._options.sync_interval_ms / 1000)
        age_due = writer.age_due()
        if age_due is not None:
            due.append(age_due)
        return None if not due else max(min(due) - self._clock(), 0.0)

    async def _housekeeping(self, writer: SegmentWriter) -> None:
        """``interval`` sync on cadence; seal a segment past its age even with no append."""
        now = self._clock()
        timeout_s = self._options.io_timeout_s
        try:
            interval_s = self._options.sync_interval_ms / 1000
            if self._interval and writer.unsynced and now - writer.last_sync_at >= interval_s:
                await in_thread("fsync", timeout_s, writer.sync)
            age_due = writer.age_due()
            if age_due is not None and now >= age_due:
                await in_thread("rotate", timeout_s, writer.seal, "age")
        except (OSError, WalTimeoutError) as exc:
            self._fail(f"sync failed: {exc}")

    def _refuse(self, batch: list[Queued], exc: DiskFullError) -> None:
        """No room: refuse the batch and everything queued behind it (their offsets follow
        it), nothing written; the WAL takes their offsets back and stays open."""
        refused = [*batch, *self._queue]
        self._queue = []
        for _first, _payloads, _nbytes, future in refused:
            if future is not None and not future.done():
                future.set_exception(
                    DiskFullError(
                        wal_dir=exc.wal_dir,
                        free_bytes=exc.free_bytes,
                        needed_bytes=exc.needed_bytes,
                    )
                )
        self._on_refused(refused[0][0], sum(item[2] for item in refused))

    def _fail(self, reason: str, batch: Sequence[Queued] = (), *, closed: bool = False) -> None:
        """Fail the batch and everything queued; a real failure stops the writer for good."""
        if not closed:
            self._failed = True
        pending = [*batch, *self._queue]
        self._queue = []

        def error() -> WalError:
            return WalClosedError(f"the WAL closed: {reason}") if closed else WalFailedError(reason)

        for _first, _payloads, _nbytes, future in pending:
            if future is not None and not future.done():
                future.set_exception(error())
        self._on_failed(reason, closed, sum(item[2] for item in pending))

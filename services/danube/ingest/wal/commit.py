"""Group commit: the one writer thread that owns the segment file.

Appends queue ``(first offset, frames, frame bytes, future)`` from the event loop. A thread of
its own takes everything queued (up to ``max_batch_bytes``; a larger single append goes alone),
hands it to the :class:`SegmentWriter` (one write, and in ``fsync`` mode one fdatasync), and
posts the outcome back to the loop in one ``call_soon_threadsafe``, where the WAL publishes the
batch and resolves the futures (``on_durable``). Appends that arrive while the thread works
queue up and form the next batch: the slower the disk, the larger the batches, the fewer
fsyncs per message.

Why a thread of its own rather than a writer task calling ``asyncio.to_thread``: a single
append then costs one thread wake-up out and one loop wake-up back, and no loop turn between
them (the task needed one turn to be woken by the append, one to start the thread work, one to
be woken by its result). The I/O deadline the task had (``io_timeout_s`` around each thread
call) is kept by a watchdog on the loop: the thread notes when each piece of I/O starts, and a
timer fails the WAL when one has run past the deadline (the thread cannot be stopped; whatever
it finishes afterwards is ignored).

Between batches and when idle, the thread keeps the ``interval`` fsync cadence and seals a
segment that reached its maximum age, even when no append comes.

**A lone append on the loop** (``WalOptions.inline_lone_appends``). An append that finds the
writer idle — nothing queued, nothing being written or waiting to be told, no other WAL's
thread writing, no other append written on the loop in this loop step (:class:`_Quiet`) —
is written (and synced) by the event loop's thread itself: no thread to wake and no loop
to wake back, ~0.08 ms of a one-at-a-time produce's ~0.6 (docs/wal.md, "A lone append on
the loop"). The loop is blocked for that write and sync: an append that took longer than
:data:`INLINE_SLOW_S` turns this off for :data:`INLINE_PAUSE_S` (a slow or failing disk
must not hold the loop, whose leases and answers wait behind it). Whoever writes holds
``_writing`` (under ``_cond``): the thread takes no batch and does no housekeeping while
the loop writes, and the loop writes only while the thread waits.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from danube.frame.batch import FrameBatch
from danube.ingest.wal.errors import (
    DiskFullError,
    WalClosedError,
    WalError,
    WalFailedError,
    WalTimeoutError,
)
from danube.ingest.wal.options import Durability, WalOptions
from danube.ingest.wal.writer import BatchResult, SegmentWriter

log = logging.getLogger(__name__)

_T = TypeVar("_T")

INLINE_SLOW_S = 0.02
INLINE_PAUSE_S = 10.0


class _Quiet:
    """Whether the process's WALs are quiet enough for an append on the loop: no writer
    thread of any of them is writing, and no other append was written on the loop in this
    loop step. Appends that come together (many producers, many partitions) then keep their
    group commits and their syncs in parallel threads; only a lone one is written inline."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._busy_threads = 0
        self._step_taken = False

    def thread_busy(self, delta: int) -> None:
        """A writer thread starts (+1) or ends (-1) a batch or its housekeeping."""
        with self._lock:
            self._busy_threads += delta

    def may_inline(self) -> bool:
        return not self._step_taken and self._busy_threads == 0

    def took_this_step(self) -> None:
        """An append is written on the loop: no other until the loop's next step."""
        self._step_taken = True
        asyncio.get_running_loop().call_soon(self._next_step)

    def _next_step(self) -> None:
        self._step_taken = False


QUIET = _Quiet()

Queued = tuple[int, FrameBatch, int, "asyncio.Future[None] | None"]
"""One queued append: first offset, its frames (danube.frame.batch: the writer gives them
their offsets in place), frame bytes, its future (a tuple: the cheapest)."""
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
    """The writer thread: batches queued appends into one write (and fdatasync) each.

    Shared with the thread, under ``_cond``: the queue, ``_paused``, ``_halted``,
    ``_stopping`` and what the thread is doing (``_busy_op``, ``_busy_since_s``,
    ``_current``). Everything else is the event loop's.
    """

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
        self._cond = threading.Condition(threading.Lock())
        self._queue: list[Queued] = []
        self._paused = False  # a refused batch waits for the loop to refuse what followed it
        self._halted = False  # failed or given up: the thread takes nothing more
        self._stopping = False
        self._busy_op: str | None = None
        self._busy_since_s = 0.0  # time.monotonic() when _busy_op started
        self._current: list[Queued] = []  # the batch in the thread's hands
        self._writing = False  # the writer is in use (by the thread, or by the loop: inline)
        self._turn_wanted = False  # the thread waits for the loop's write to end
        # The loop's own.
        self._outstanding = 0  # appends submitted, not yet durable, refused or failed
        self._gave_up = False  # failed, or closed before the thread finished: ignore it now
        self._loop: asyncio.AbstractEventLoop | None = None
        self._ended: asyncio.Future[None] | None = None
        self._watchdog: asyncio.TimerHandle | None = None
        self._inline = options.inline_lone_appends
        self._inline_paused_until_s = 0.0
        self.inline_appends = 0  # appends the loop wrote itself (a test's and a stat's count)

    @property
    def idle(self) -> bool:
        """Nothing queued and nothing being written."""
        return self._outstanding == 0

    def start(self, name: str) -> None:
        """Start the writer thread (owned by this object; :meth:`stop` ends it)."""
        loop = self._loop = asyncio.get_running_loop()
        self._ended = loop.create_future()
        # A daemon: a thread stuck in the kernel on a dead disk must not hold the process.
        threading.Thread(target=self._thread_main, name=name, daemon=True).start()
        self._watchdog = loop.call_later(self._options.io_timeout_s, self._check_deadline)

    def try_inline(self, item: Queued) -> bool:
        """Write one append on the loop's thread now if the writer is idle (see the module);
        True when it was (its future holds the outcome), False: :meth:`submit` it."""
        if not self._inline or self._outstanding or self._gave_up or not QUIET.may_inline():
            return False
        started_s = time.monotonic()
        if started_s < self._inline_paused_until_s:
            return False
        with self._cond:
            if self._writing or self._queue or self._halted or self._stopping or self._paused:
                return False
            self._writing = True
            self._busy_op, self._busy_since_s, self._current = "write", started_s, [item]
        QUIET.took_this_step()
        self._outstanding += 1
        batch = [item]
        writer = self.writer
        due = self._next_due(writer)
        try:
            result = writer.write_batch([(item[0], item[1])])
        except DiskFullError as exc:
            self._end_inline(started_s, wake=True)
            self._refuse(batch, exc)
            return True
        except Exception as exc:  # a failed write or sync, or a bug: the writer is given back
            crashed = not isinstance(exc, OSError)
            if crashed:
                log.exception("WAL append on the loop crashed")
            with self._cond:
                self._halted = True
            self._end_inline(started_s, wake=True)
            self._fail(f"the writer crashed: {exc!r}" if crashed else f"write failed: {exc}", batch)
            return True
        # The thread sleeps until the next sync or rotation it knew of: woken only when this
        # write brought one sooner (an interval sync now owed, a new segment's age).
        self._end_inline(started_s, wake=_sooner(self._next_due(writer), due))
        self._complete(batch, result)
        return True

    def _end_inline(self, started_s: float, *, wake: bool) -> None:
        with self._cond:
            self._writing = False
            self._busy_op, self._current = None, []
            if wake or self._turn_wanted:  # or it waits for its turn
                self._cond.notify()
        self.inline_appends += 1
        took_s = time.monotonic() - started_s
        if took_s > INLINE_SLOW_S:
            self._inline_paused_until_s = time.monotonic() + INLINE_PAUSE_S
            log.info(
                "WAL append on the loop took %.1f ms: through the writer thread for %.0f s",
                took_s * 1000,
                INLINE_PAUSE_S,
            )

    def submit(self, item: Queued) -> None:
        """Queue one append (its room in the pending budget was already taken)."""
        self._outstanding += 1
        with self._cond:
            self._queue.append(item)
            self._cond.notify()

    async def stop(self, timeout_s: float) -> bool:
        """Write what is queued, then end the thread; past ``timeout_s``, fail the rest as closed.

        Returns False when it had to give up (a write may still be running in its thread, so
        the file must not be touched again).
        """
        with self._cond:
            self._stopping = True
            self._cond.notify()
        ended = self._ended
        if ended is None:
            return True
        try:
            async with asyncio.timeout(timeout_s):
                await asyncio.shield(ended)
        except TimeoutError:
            with self._cond:
                batch = self._current
            self._fail("closed while writing", batch, closed=True)
            return False
        finally:
            if self._watchdog is not None:
                self._watchdog.cancel()
        return True

    # --- the thread ----------------------------------------------------------------------

    def _thread_main(self) -> None:
        try:
            self._serve()
        except BaseException as exc:  # a bug: fail loudly rather than leave appenders hanging
            log.exception("WAL writer crashed")
            with self._cond:
                self._halted = True
            self._post(self._fail, f"the writer crashed: {exc!r}")
        finally:
            self._post(self._thread_ended)

    def _serve(self) -> None:
        writer = self.writer
        cond = self._cond
        while True:
            with cond:
                batch = self._next_batch(writer)
                if batch is None:
                    return
                self._writing = True
                if batch:
                    self._busy_op, self._busy_since_s = "write", time.monotonic()
                    self._current = batch
            QUIET.thread_busy(1)
            try:
                if batch and not self._write(batch):
                    return
                if not self._housekeeping(writer):
                    return
            finally:
                QUIET.thread_busy(-1)
            with cond:
                self._busy_op, self._current = None, []
                self._writing = False

    def _next_batch(self, writer: SegmentWriter) -> list[Queued] | None:
        """Under ``_cond``: the next batch; ``[]`` when housekeeping is due; ``None``: end."""
        while not self._halted:
            if self._writing:  # the loop writes a lone append: it notifies when done
                self._turn_wanted = True
                self._cond.wait()
                self._turn_wanted = False
                continue
            if self._queue and not self._paused:
                return self._take_batch()
            if self._stopping and not self._queue:
                return None
            timeout_s = self._idle_timeout_s(writer)
            if timeout_s is not None and timeout_s <= 0:
                return []
            self._cond.wait(timeout_s)
        return None

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

    def _write(self, batch: list[Queued]) -> bool:
        """Write one batch and post its outcome; False when the thread must end."""
        groups = [(first, frames) for first, frames, _nbytes, _future in batch]
        try:
            result = self.writer.write_batch(groups)
        except DiskFullError as exc:
            with self._cond:
                self._paused = True  # until the loop refused what queued behind it
            self._post(self._refuse, batch, exc)
            return True
        except OSError as exc:
            with self._cond:
                self._halted = True
            self._post(self._fail, f"write failed: {exc}", batch)
            return False
        self._post(self._complete, batch, result)
        return True

    def _housekeeping(self, writer: SegmentWriter) -> bool:
        """``interval`` sync on cadence; seal a segment past its age even with no append."""
        now = self._clock()
        try:
            interval_s = self._options.sync_interval_ms / 1000
            if self._interval and writer.unsynced and now - writer.last_sync_at >= interval_s:
                self._busy("fsync")
                writer.sync()
            age_due = writer.age_due()
            if age_due is not None and now >= age_due:
                self._busy("rotate")
                writer.seal("age")
        except OSError as exc:
            with self._cond:
                self._halted = True
            self._post(self._fail, f"sync failed: {exc}")
            return False
        return True

    def _busy(self, op: str) -> None:
        with self._cond:
            self._busy_op, self._busy_since_s = op, time.monotonic()
            self._current = []  # the batch written before was posted already

    def _idle_timeout_s(self, writer: SegmentWriter) -> float | None:
        """Seconds until the next sync or age rotation is due (``None``: nothing scheduled)."""
        due = self._next_due(writer)
        return None if due is None else max(due - self._clock(), 0.0)

    def _next_due(self, writer: SegmentWriter) -> float | None:
        """When the next sync or age rotation is due (on ``clock``; ``None``: none is).
        Whoever holds the writer asks."""
        due: list[float] = []
        if self._interval and writer.unsynced:
            due.append(writer.last_sync_at + self._options.sync_interval_ms / 1000)
        age_due = writer.age_due()
        if age_due is not None:
            due.append(age_due)
        return min(due) if due else None

    def _post(self, callback: Callable[..., object], *args: Any) -> None:
        assert self._loop is not None
        with contextlib.suppress(RuntimeError):  # the loop is closed: nobody is left to tell
            self._loop.call_soon_threadsafe(callback, *args)

    # --- back on the loop ----------------------------------------------------------------

    def _complete(self, batch: list[Queued], result: BatchResult) -> None:
        if self._gave_up:
            return  # the watchdog gave up on this batch: its appenders were failed already
        for segment, end, next_offset in result.touched:
            segment.size_bytes = end
            segment.next_offset = next_offset
        self._outstanding -= len(batch)
        self._on_durable(batch, result.frames)

    def _thread_ended(self) -> None:
        if self._ended is not None and not self._ended.done():
            self._ended.set_result(None)

    def _check_deadline(self) -> None:
        """The watchdog: fail the WAL when the thread's current I/O passed ``io_timeout_s``."""
        self._watchdog = None
        if self._gave_up or self._ended is None or self._ended.done():
            return
        assert self._loop is not None
        timeout_s = self._options.io_timeout_s
        with self._cond:
            op, since_s, batch = self._busy_op, self._busy_since_s, self._current
        if op is not None:
            overdue_s = time.monotonic() - since_s - timeout_s
            if overdue_s >= 0:
                exc = WalTimeoutError(op=op, timeout_s=timeout_s)
                what = "write" if op == "write" else "sync"
                self._fail(f"{what} failed: {exc}", batch)
                return
            self._watchdog = self._loop.call_later(-overdue_s, self._check_deadline)
            return
        self._watchdog = self._loop.call_later(timeout_s, self._check_deadline)

    def _refuse(self, batch: list[Queued], exc: DiskFullError) -> None:
        """No room: refuse the batch and everything queued behind it (their offsets follow
        it), nothing written; the WAL takes their offsets back and stays open."""
        if self._gave_up:
            return
        with self._cond:
            refused = [*batch, *self._queue]
            self._queue = []
            self._paused = False
            self._cond.notify()
        self._outstanding -= len(refused)
        for _first, _frames, _nbytes, future in refused:
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
        """Fail the batch and everything queued (as closed, or as a failure of the WAL); the
        thread takes nothing more, and whatever it still finishes is ignored."""
        if self._gave_up:
            return
        self._gave_up = True
        with self._cond:
            self._halted = True
            pending = [*batch, *self._queue]
            self._queue = []
            self._cond.notify()
        self._outstanding = 0

        def error() -> WalError:
            return WalClosedError(f"the WAL closed: {reason}") if closed else WalFailedError(reason)

        for _first, _frames, _nbytes, future in pending:
            if future is not None and not future.done():
                future.set_exception(error())
        self._on_failed(reason, closed, sum(item[2] for item in pending))


def _sooner(due: float | None, before: float | None) -> bool:
    """Whether ``due`` comes before ``before`` (``None``: never)."""
    return due is not None and (before is None or due < before)

"""The WAL of one topic partition: group-committed appends, reads, drops, recovery at open.

One writer thread owns the file. ``append`` takes room in the pending budget, gets its offsets
and queues ``(first offset, frames, bytes, future)``; the writer thread takes everything queued
(up to ``max_batch_bytes``), writes it with one write (and, in ``fsync`` mode, one fdatasync),
then, in one callback on the event loop, the WAL publishes the new durable end, resolves the
futures, fills the cache and calls the durable listeners. Appends that arrive while the thread
writes form the next batch: that is the group commit. docs/wal.md tells the whole story.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

from danube.aio import awaited_task
from danube.frame.batch import FrameBatch
from danube.frame.codec import BytesLike
from danube.ingest.wal.admission import Admission, frame_bytes
from danube.ingest.wal.cache import MessageCache
from danube.ingest.wal.checkpoint import CheckpointStore
from danube.ingest.wal.commit import GroupCommit, Queued, in_thread
from danube.ingest.wal.errors import (
    BelowWalStartError,
    WalClosedError,
    WalError,
    WalFailedError,
    WalIoError,
    WalTimeoutError,
)
from danube.ingest.wal.feed import DurableFeed, DurableListener, registered
from danube.ingest.wal.fileops import FileOps, OsFileOps
from danube.ingest.wal.options import Durability, WalOptions
from danube.ingest.wal.reader import read_messages
from danube.ingest.wal.recovery import TailCut, recover
from danube.ingest.wal.results import FetchResult, WalStats
from danube.ingest.wal.segment import SegmentSet
from danube.ingest.wal.upkeep import DEFAULT_OPEN_TIMEOUT_S, SegmentUpkeep, _State
from danube.ingest.wal.writer import SegmentWriter

log = logging.getLogger(__name__)

MAX_FETCH_COUNT = 100_000
"""A fetch returns at most this many messages whatever it asks (bounds one answer's memory)."""
MAX_FETCH_BYTES = 64 * 1024 * 1024
"""... and at most this many payload bytes (beyond its first message)."""
DEFAULT_CLOSE_TIMEOUT_S = 60.0

QueuedHook = Callable[[int, "asyncio.Future[None] | None"], None]
"""``on_queued(first offset, durable future or None)`` of :meth:`Wal.append`."""


class Wal(SegmentUpkeep):
    """The WAL of one partition. Create with :meth:`open`; end with :meth:`close`."""

    def __init__(
        self,
        directory: Path,
        options: WalOptions,
        ops: FileOps,
        clock: Callable[[], float],
    ) -> None:
        """Use :meth:`open`: it recovers the directory and starts the writer."""
        self.directory = directory
        self.options = options
        self._ops = ops
        self._clock = clock
        self._memory = options.durability is Durability.MEMORY
        self._segments = SegmentSet([])
        self._checkpoints = CheckpointStore(ops, directory)
        self._commit: GroupCommit | None = None  # None in memory mode
        self._cache = MessageCache(options.cache_capacity, options.cache_max_bytes)
        self._feed = DurableFeed(self._cache)
        self._admission = Admission(options.max_pending_bytes)
        self._next_offset = 0
        self._durable_next = 0
        self._start_floor = 0
        self._state = _State.OPEN
        self._closed = asyncio.Event()
        self._failure: str | None = None
        self._failure_listeners: list[Callable[[str], None]] = []
        self._drop_guards: list[Callable[[int], Awaitable[None]]] = []
        self._durable_event: asyncio.Event | None = None
        self._admin_lock = asyncio.Lock()  # one drop_below / advance_to checkpoint at a time
        self.recovery_cut: TailCut | None = None
        """The tail cut made at open, if any (also logged as a warning)."""
        self._appends = 0

    @classmethod
    async def open(
        cls,
        directory: Path,
        options: WalOptions,
        *,
        clock: Callable[[], float] = time.monotonic,
        file_ops: FileOps | None = None,
        timeout_s: float = DEFAULT_OPEN_TIMEOUT_S,
    ) -> Wal:
        """Open (or create) and recover the WAL in ``directory`` (``memory`` mode: no file).

        ``clock`` (seconds, monotonic) times segment age and the sync cadence; ``file_ops`` is
        the file layer (tests pass a slow or failing one).
        """
        wal = cls(directory, options, file_ops or OsFileOps(), clock)
        if wal._memory:
            return wal
        recovered = await in_thread(
            "open",
            timeout_s,
            recover,
            wal._ops,
            directory,
            wal._checkpoints,
            max_payload_bytes=options.max_frame_payload_bytes,
        )
        wal._segments = SegmentSet(recovered.segments)
        wal._next_offset = wal._durable_next = recovered.next_offset
        wal._start_floor = recovered.start_offset
        wal.recovery_cut = recovered.cut
        writer = SegmentWriter(wal._ops, directory, options, wal._segments, wal._checkpoints, clock)
        wal._commit = GroupCommit(
            writer,
            options,
            clock,
            on_durable=wal._durable,
            on_failed=wal._failed,
            on_refused=wal._refused,
        )
        wal._commit.start(f"wal-writer:{directory}")
        log.info(
            "WAL opened",
            extra={
                "wal_dir": str(directory),
                "segments": len(recovered.segments),
                "start_offset": wal.start_offset,
                "next_offset": wal._next_offset,
            },
        )
        return wal

    # --- offsets and stats ------------------------------------------------------------

    @property
    def next_offset(self) -> int:
        """The offset the next appended message gets."""
        return self._next_offset

    @property
    def durable_next(self) -> int:
        """Every offset below this is durable per the mode (or a gap left by ``advance_to``)."""
        return self._durable_next

    @property
    def start_offset(self) -> int:
        """The lowest offset still in the WAL; ``durable_next`` when it holds nothing."""
        if self._memory:
            first = self._cache.first_offset
            return self._durable_next if first is None else first
        first = self._segments.first_offset()
        if first is None:
            return max(self._start_floor, self._durable_next)
        return min(max(first, self._start_floor), self._durable_next)

    def stats(self) -> WalStats:
        """Offsets, sizes and counters, as of now."""
        writer = None if self._commit is None else self._commit.writer
        return WalStats(
            start_offset=self.start_offset,
            next_offset=self._next_offset,
            durable_next=self._durable_next,
            segments=len(self._segments),
            disk_bytes=self._segments.disk_bytes(),
            cache_messages=len(self._cache),
            cache_bytes=self._cache.payload_bytes,
            pending_bytes=self._admission.pending_bytes,
            waiting_appends=self._admission.waiting,
            appends=self._appends,
            messages=self._feed.messages,
            batches=self._feed.batches,
            fsyncs=0 if writer is None else writer.fsyncs,
            bytes_written=0 if writer is None else writer.bytes_written,
            rotations=0 if writer is None else writer.rotations,
            failed=self._failure is not None,
            inline_appends=0 if self._commit is None else self._commit.inline_appends,
        )

    def add_durable_listener(self, listener: DurableListener) -> Callable[[], None]:
        """Call ``listener`` after each batch becomes durable; returns its remover.

        It runs on the event loop, in offset order, before the batch's appends return; it must
        not block (hand the messages to a bounded queue). Exceptions are logged, not raised.
        """
        return self._feed.add_listener(listener)

    def add_failure_listener(self, listener: Callable[[str], None]) -> Callable[[], None]:
        """Call ``listener(reason)`` once, on the event loop, when the WAL fails (a write,
        fsync or checkpoint failed or passed its deadline; never at a close); returns its
        remover. Whoever must stop on a failure learns of it here even when no append of its
        own is waiting."""
        return registered(self._failure_listeners, listener)

    # --- appending --------------------------------------------------------------------

    async def append(
        self,
        payloads: FrameBatch | Sequence[BytesLike],
        *,
        on_queued: QueuedHook | None = None,
    ) -> int:
        """Append messages; return the first one's offset once all are durable (per the mode).

        ``payloads``: a :class:`~danube.frame.batch.FrameBatch` (a produce's frames: the
        writer gives them their offsets where they lie, the buffer is the WAL's from now on),
        or records to frame. Offsets are ``first .. first + len(payloads) - 1`` in order. All
        or nothing: a size error writes nothing; a failed write fails every message. Waits
        while the pending bytes are spent (backpressure). An empty sequence returns
        ``next_offset`` and writes nothing.
        """
        self._check_open()
        count = len(payloads)
        if count == 0:
            return self._next_offset
        frames = payloads if isinstance(payloads, FrameBatch) else FrameBatch.of_records(payloads)
        nbytes = frame_bytes(frames, self.options)
        commit = self._commit
        if commit is None:  # memory mode: appended is durable
            first = self._take_offsets(count)
            if on_queued is not None:  # first: it may tell the durable listeners about it
                on_queued(first, None)
            frames.seal(first, max_payload_bytes=self.options.max_frame_payload_bytes)
            self._durable([(first, frames, nbytes, None)], [b"".join(frames.runs())])
            return first
        if not self._admission.try_acquire(nbytes):
            # Backpressure: wait for room, in order. A caller cancelled meanwhile leaves its
            # append to finish anyway (as one cancelled once queued does): the task is
            # shielded, and ends at the latest when the WAL closes (its waiters fail).
            waiting = awaited_task(
                self._append_with_room(frames, nbytes, commit, on_queued), name="wal append"
            )
            return await asyncio.shield(waiting)
        # The hot path, with no task of its own: queued before the first wait, so a caller
        # cancelled while it waits cancels only its future; the writer still writes the append
        # and skips a future already done.
        return await self._queue(frames, nbytes, commit, on_queued)

    async def _append_with_room(
        self,
        frames: FrameBatch,
        nbytes: int,
        commit: GroupCommit,
        on_queued: QueuedHook | None,
    ) -> int:
        await self._admission.acquire(nbytes)
        if self._failure is not None or self._state is not _State.OPEN:
            self._admission.release(nbytes)
            self._check_open()
        return await self._queue(frames, nbytes, commit, on_queued)

    def _take_offsets(self, count: int) -> int:
        """The next ``count`` offsets for one append; the first of them."""
        first = self._next_offset
        self._next_offset = first + count
        self._appends += 1
        return first

    async def _queue(
        self,
        frames: FrameBatch,
        nbytes: int,
        commit: GroupCommit,
        on_queued: QueuedHook | None = None,
    ) -> int:
        """Queue an append (its room taken) for the writer before any wait; its first offset
        once durable."""
        first = self._take_offsets(len(frames))
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        if on_queued is not None:  # first: it may tell the durable listeners about it
            on_queued(first, future)
        item = (first, frames, nbytes, future)
        if not commit.try_inline(item):  # a lone append: written here, durable (or failed) now
            commit.submit(item)
        await future
        return first

    def _check_open(self) -> None:
        if self._failure is not None:
            raise WalFailedError(self._failure)
        if self._state is not _State.OPEN:
            raise WalClosedError()

    async def advance_to(self, offset: int) -> None:
        """Move ``next_offset`` forward to ``offset`` (never back), and persist that floor.

        The offsets skipped are a gap no message will ever take, even after a restart with no
        message appended since. The active segment is sealed at the next write, so offsets stay
        consecutive inside every segment.
        """
        self._check_open()
        if offset <= self._next_offset:
            return
        self._next_offset = offset
        if self._commit is None or self._commit.idle:
            self._advance_durable(offset)
        if self._commit is None:
            return
        async with self._admin_lock:
            floor = max(offset, self._durable_next)
            await self._checkpoint_io(
                "checkpoint",
                self._checkpoints.write,
                start_offset=self.start_offset,
                next_offset=floor,
            )

    # --- reading and dropping ---------------------------------------------------------

    async def fetch(
        self, from_offset: int, *, max_bytes: int, max_count: int, limit_offset: int | None = None
    ) -> FetchResult:
        """Durable messages from ``from_offset``: at most ``max_count``, ``max_bytes`` of payloads,
        none at or past ``limit_offset`` (a partition's leader passes its high watermark).

        The first message is returned even if larger than ``max_bytes``. Offsets in a gap are
        skipped; an offset at or past ``durable_next`` gives no message. Raises
        :class:`BelowWalStartError` below ``start_offset`` and :class:`WalCorruptionError` when
        the first message to return sits on a bad frame.
        """
        if max_bytes < 1 or max_count < 1:
            raise WalError(
                f"fetch limits must be positive (max_bytes={max_bytes}, max_count={max_count})"
            )
        if self._state is _State.CLOSED:
            raise WalClosedError()
        max_bytes, max_count = min(max_bytes, MAX_FETCH_BYTES), min(max_count, MAX_FETCH_COUNT)
        start = self.start_offset
        if from_offset < start:
            raise BelowWalStartError(offset=from_offset, start_offset=start)
        limit = (
            self._durable_next if limit_offset is None else min(limit_offset, self._durable_next)
        )
        if from_offset >= limit:
            return FetchResult([], from_offset)
        cached = self._cache.first_offset
        if self._memory or (cached is not None and from_offset >= cached):
            messages, next_offset = self._cache.fetch(
                from_offset, limit_offset=limit, max_bytes=max_bytes, max_count=max_count
            )
            return FetchResult(messages, next_offset)
        plan = self._segments.plan(from_offset)  # taken with `limit`, in the same loop step
        limits = {"limit_offset": limit, "max_bytes": max_bytes, "max_count": max_count}
        try:
            frames, next_offset = await in_thread(
                "read",
                self.options.io_timeout_s,
                read_messages,
                self._ops,
                plan,
                from_offset,
                max_payload_bytes=self.options.max_frame_payload_bytes,
                **limits,
            )
        except OSError as exc:
            start = self.start_offset
            if isinstance(exc, FileNotFoundError) and from_offset < start:  # dropped meanwhile
                raise BelowWalStartError(offset=from_offset, start_offset=start) from exc
            raise WalIoError(f"WAL read failed: {exc}", op="read", path=exc.filename) from exc
        return FetchResult(frames, next_offset)

    async def wait_for(self, offset: int, timeout_s: float) -> bool:
        """Wait until ``durable_next > offset``; False on timeout, failure or close."""
        try:
            async with asyncio.timeout(timeout_s):
                while self._durable_next <= offset:
                    if self._state is _State.CLOSED or self._failure is not None:
                        return False
                    if self._durable_event is None:
                        self._durable_event = asyncio.Event()
                    await self._durable_event.wait()
        except TimeoutError:
            return self._durable_next > offset
        return True

    async def close(self, *, timeout_s: float = DEFAULT_CLOSE_TIMEOUT_S) -> None:
        """Stop: queued appends are written (appenders still waiting for room fail with
        :class:`WalClosedError`), then a final fdatasync and checkpoint. Idempotent."""
        if self._state is not _State.OPEN:
            await self._closed.wait()
            return
        self._state = _State.CLOSING
        self._admission.fail_waiters(WalClosedError)
        commit = self._commit
        try:
            if commit is not None:
                drained = await commit.stop(timeout_s)
                if drained and self._failure is None:
                    await in_thread("close", self.options.io_timeout_s, self._final_sync)
                else:
                    commit.writer.abandon()
        except (OSError, WalTimeoutError) as exc:
            self._failure = self._failure or f"close failed: {exc}"
            log.error("WAL close failed", extra={"wal_dir": str(self.directory), "error": str(exc)})
            if commit is not None:
                commit.writer.abandon()
        finally:
            self._state = _State.CLOSED
            self._advance_durable(self._durable_next)  # wake wait_for callers
            self._closed.set()

    def _final_sync(self) -> None:
        assert self._commit is not None
        self._commit.writer.close()
        self._checkpoints.write(start_offset=self.start_offset, next_offset=self._durable_next)

    # --- what the writer tells us -----------------------------------------------------

    def _durable(self, batch: list[Queued], frames: Sequence[bytes] = ()) -> None:
        """A batch is durable: publish the offset, fill the cache, call listeners, resolve.
        ``frames``: the bytes the writer wrote for it, when it wrote any."""
        last_first, last_payloads = batch[-1][0], batch[-1][1]
        end = last_first + len(last_payloads)
        # With nothing queued, every offset below next_offset is durable or a gap (advance_to).
        commit = self._commit
        self._advance_durable(
            end if commit is not None and not commit.idle else max(end, self._next_offset)
        )
        # The appenders first, then the listeners: both run before any appender resumes
        # (a future's waiter resumes in a later step), but in the order they were woken, so
        # a produce's reply goes out before the live wake-up the listener starts.
        for item in batch:
            future = item[3]
            if future is not None and not future.done():
                future.set_result(None)
        self._feed.publish(batch, frames)
        if commit is not None:
            self._admission.release(sum(item[2] for item in batch))

    def _advance_durable(self, end: int) -> None:
        if end > self._durable_next:
            self._durable_next = end
        if self._durable_event is not None:
            self._durable_event.set()
            self._durable_event = None

    def _refused(self, first_offset: int, released_bytes: int) -> None:
        """The writer refused every pending append from ``first_offset`` on (no room on the
        disk): they wrote nothing, so their offsets go back (no gap); the WAL stays open."""
        self._next_offset = first_offset
        self._admission.release(released_bytes)

    def _failed(self, reason: str, closed: bool, released_bytes: int) -> None:
        """The writer failed (or was stopped at close) with appends still pending."""
        newly = not closed and self._failure is None
        if newly:
            self._failure = reason
            log.error("WAL failed", extra={"wal_dir": str(self.directory), "reason": reason})
        self._admission.release(released_bytes)
        if self._failure is not None:
            self._admission.fail_waiters(lambda: WalFailedError(reason))
        self._advance_durable(self._durable_next)  # wake wait_for callers
        if newly:
            for listener in tuple(self._failure_listeners):
                try:
                    listener(reason)
                except Exception:  # one bad listener must not stop the others
                    log.exception("WAL failure listener failed")

    async def _checkpoint_io(self, op: str, call: Callable[..., object], **kwargs: Any) -> None:
        """Checkpoint work in a thread: a failed fsync fails the WAL (its state is unknown)."""
        try:
            await in_thread(op, self.options.io_timeout_s, call, **kwargs)
        except (OSError, WalTimeoutError) as exc:
            self._failed(f"{op} failed: {exc}", False, 0)
            raise WalFailedError(self._failure or str(exc)) from exc

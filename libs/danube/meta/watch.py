"""Watches: the changes under a key or prefix, as a bounded async iterator of events.

aetcd delivers a watch's events into an *unbounded* ``asyncio.Queue`` of its own (filled
by its gRPC stream reader, shared by all watches of a client). A :class:`Watch` therefore
drains it promptly with a pump task into a buffer of ``buffer_size`` events, so aetcd's
queue only holds what arrived since the pump last ran. When the consumer falls more than
``buffer_size`` events behind, events are **not** dropped silently: the watch ends with
:class:`WatchOverflowError` after the buffered events, and a new watch started at its
``resume_revision`` misses nothing (it may repeat events of that one revision).

A watch that breaks (etcd unreachable, revision compacted, store closed) likewise delivers
what it buffered, then raises a :class:`WatchError` carrying ``resume_revision``.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Literal

from danube.meta.errors import MetaError, WatchError, WatchOverflowError, map_error
from danube.meta.kv import kv_from_pb
from danube.tasks import TaskSet

log = logging.getLogger(__name__)

WATCH_BUFFER_EVENTS = 1024

WatchKind = Literal["put", "delete"]


@dataclass(frozen=True, slots=True)
class WatchEvent:
    """One change. A delete has an empty value, ``create_revision`` 0, and ``mod_revision``
    set to the revision of the delete."""

    kind: WatchKind
    key: str
    value: bytes
    mod_revision: int
    create_revision: int
    lease_id: int


def event_from_aetcd(event: Any, prefix_bytes: int) -> WatchEvent:
    """A :class:`WatchEvent` from an ``aetcd.rtypes.Event``."""
    kv = kv_from_pb(event.kv, prefix_bytes)
    kind: WatchKind = "delete" if str(event.kind).upper().endswith("DELETE") else "put"
    return WatchEvent(kind, kv.key, kv.value, kv.mod_revision, kv.create_revision, kv.lease_id)


class Watch:
    """The events under a key or prefix. Use ``async with store.watch_prefix(p) as events:``
    then ``async for event in events:``; leaving the block cancels the etcd watch.

    The etcd watch exists once :meth:`start` (or ``__aenter__``) returns: changes made
    after that are seen. Iterating a watch that was not started starts it on first use.
    """

    def __init__(
        self,
        create: Callable[[int | None], Awaitable[Any]],
        *,
        prefix_bytes: int,
        start_revision: int | None,
        buffer_size: int,
        cancel_timeout_s: float,
    ) -> None:
        if buffer_size < 1:
            raise ValueError("buffer_size must be at least 1")
        self._create = create
        self._prefix_bytes = prefix_bytes
        self._start_revision = start_revision
        self._buffer_size = buffer_size
        self._cancel_timeout_s = cancel_timeout_s
        self._buffer: deque[WatchEvent] = deque()
        self._wakeup = asyncio.Event()
        self._error: MetaError | None = None
        self._started = False
        self._closed = False
        self._last_received: int | None = None
        self._handle: Any = None
        # The pump hands every failure of the stream to the reader (_fail); anything that
        # still escapes it is a bug of its own, logged.
        self._tasks = TaskSet("etcd watch")

    @property
    def last_revision(self) -> int | None:
        """The mod revision of the newest event received so far."""
        return self._last_received

    async def start(self) -> Watch:
        """Create the etcd watch and start draining it (idempotent)."""
        if not self._started and not self._closed:
            self._started = True
            try:
                self._handle = await self._create(self._start_revision)
            except BaseException:
                self._started = False  # nothing was created: a later start may try again
                raise
            if self._closed:  # closed while the watch was being created: nothing reads it
                await self._cancel_handle()
                return self
            self._tasks.spawn(self._pump(), name="etcd watch pump", on_failure="log")
        return self

    async def __aenter__(self) -> Watch:
        return await self.start()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    def __aiter__(self) -> Watch:
        return self

    async def __anext__(self) -> WatchEvent:
        if not self._started:
            await self.start()
        while True:
            if self._buffer:
                return self._buffer.popleft()
            if self._error is not None:
                raise self._error
            if self._closed:
                raise StopAsyncIteration
            self._wakeup.clear()
            await self._wakeup.wait()

    async def aclose(self) -> None:
        """Cancel the etcd watch and stop the pump; iteration then ends (idempotent)."""
        if self._closed:
            return
        self._closed = True
        self._wakeup.set()
        await self._cancel_handle()
        await self._tasks.close(timeout_s=self._cancel_timeout_s)

    async def _cancel_handle(self) -> None:
        handle, self._handle = self._handle, None
        if handle is not None:
            try:
                async with asyncio.timeout(self._cancel_timeout_s):
                    await handle.cancel()
            except Exception as exc:  # the stream may already be gone; nothing is left to free
                log.debug("watch cancel failed: %r", exc)

    def _resume_revision(self) -> int | None:
        if self._last_received is not None:
            return self._last_received + 1
        return self._start_revision

    def _fail(self, error: MetaError) -> None:
        if not self._closed:
            self._error = error
        self._wakeup.set()

    async def _pump(self) -> None:
        try:
            async for raw in self._handle:
                event = event_from_aetcd(raw, self._prefix_bytes)
                if len(self._buffer) >= self._buffer_size:
                    # Resume at this event's revision: nothing is lost, at worst the
                    # events of this one revision already buffered are seen twice.
                    self._fail(
                        WatchOverflowError(
                            buffer_size=self._buffer_size, resume_revision=event.mod_revision
                        )
                    )
                    break
                self._buffer.append(event)
                self._last_received = event.mod_revision
                self._wakeup.set()
            else:
                self._fail(
                    WatchError(
                        "the watch stream ended (store closed)",
                        resume_revision=self._resume_revision(),
                        code="watch_closed",
                    )
                )
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            self._fail(_watch_error(exc, self._resume_revision()))
        # Stop aetcd from queueing more events nobody will read.
        await self._cancel_handle()


def _watch_error(exc: BaseException, resume_revision: int | None) -> WatchError:
    """Any failure of a watch as a :class:`WatchError`, so callers always get a resume point."""
    error = map_error(exc, op="watch", resume_revision=resume_revision)
    if isinstance(error, WatchError):
        return error
    wrapped = WatchError(
        f"watch broke: {error.message}",
        resume_revision=resume_revision,
        code=error.code,
        retriable=error.retriable,
    )
    wrapped.__cause__ = exc
    return wrapped

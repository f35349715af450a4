"""Waiting and cancelling in asyncio, robustly; one lock per key. Standard library and
:mod:`danube.errors` only: the floor under :mod:`danube.tasks`, :mod:`danube.meta` and the
services.

Background work has an owner (:class:`danube.tasks.TaskSet`); the futures here are the
other kind, short-lived and awaited where they start: :func:`wait_any` and
:func:`until_stopped` race events against work, :func:`awaited_task` runs work that its
awaiters share or hand on. Nothing else in the project starts a bare task (a unit test,
tests/unit/test_task_owners.py, keeps it so).

On Python 3.11, ``asyncio.wait_for`` (which aetcd uses while it creates a watch) swallows a
cancellation that arrives just as the awaited future completes; the task then carries on as
if never cancelled. So a plain ``task.cancel(); await task`` can wait forever. These helpers
cancel again until the task is really done, within a deadline.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Hashable, Iterable
from pathlib import Path
from typing import Any, Generic, TypeVar

from danube.errors import DanubeError, ErrorKind

log = logging.getLogger(__name__)

_RECANCEL_EVERY_S = 0.05
STOP_S = 10.0  # how long a service's stop waits for one of its helpers to end
T = TypeVar("T")
K = TypeVar("K", bound=Hashable)


async def cancel_and_wait(task: asyncio.Task[Any] | None, *, timeout_s: float) -> bool:
    """Cancel ``task`` and wait until it is done; ``False`` if it outlived ``timeout_s``.

    A task that swallowed the cancellation is cancelled again every 50 ms. Whatever the task
    raised is retrieved (and dropped) so asyncio does not report it as never retrieved.
    """
    if task is None or task is asyncio.current_task():
        return task is None
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not task.done():
        remaining_s = deadline - loop.time()
        if remaining_s <= 0:
            log.error("task %s did not stop within %.1f s of being cancelled", task, timeout_s)
            return False
        task.cancel()
        await asyncio.wait({task}, timeout=min(_RECANCEL_EVERY_S, remaining_s))
    if not task.cancelled() and task.exception() is not None:
        log.debug("task %s ended with %r", task.get_name(), task.exception())
    return True


async def cancel_all_and_wait(
    tasks: Iterable[asyncio.Task[Any] | None], *, timeout_s: float = STOP_S
) -> bool:
    """Cancel every task at once, then wait for each as :func:`cancel_and_wait` does (a
    service's helpers at its stop: a ``TaskGroup`` waits without a deadline for a child
    that swallowed its cancellation); ``False`` if one outlived ``timeout_s``."""
    pending = [task for task in tasks if task is not None]
    for task in pending:
        task.cancel()
    stopped = [await cancel_and_wait(task, timeout_s=timeout_s) for task in pending]
    return all(stopped)


def awaited_task(work: Coroutine[Any, Any, T], *, name: str | None = None) -> asyncio.Task[T]:
    """Start ``work`` as a task whose outcome belongs to whoever awaits it, not to an owner:
    a call shared by several waiters, or one that must finish even if its caller leaves
    (awaited through ``asyncio.shield``, then handed to whoever cleans up after it), or a
    read sent ahead that the next read takes or cancels. It must end by a deadline of its
    own. An exception nobody is left to take is read (and dropped, at debug level), so
    asyncio does not report it as never retrieved; its awaiters, if any, get it as well."""
    task = asyncio.get_running_loop().create_task(work, name=name)
    task.add_done_callback(_outcome_read)
    return task


class GoneError(DanubeError):
    """The peer a request waits on is provably gone (:func:`unless_gone`): no answer will
    come; another may answer it again."""

    code = "peer_gone"
    kind = ErrorKind.UNAVAILABLE
    retriable = True


async def unless_gone(
    work: Coroutine[Any, Any, T],
    gone: Callable[[], Awaitable[bool]],
    *,
    quiet_s: float,
    every_s: float,
    name: str | None = None,
) -> T:
    """``work``'s outcome (a request with a deadline of its own), unless the peer that
    should answer it dies under it: once it has been ``quiet_s`` without an answer, and
    every ``every_s`` after, ``gone()`` is asked, and on yes the wait ends with
    :class:`GoneError` (``work`` cancelled). A message bus says nothing to a requester
    whose responder died after taking the request; this bounds the wait by the evidence
    instead of the deadline."""
    answer = awaited_task(work, name=name)  # ends by its own deadline
    try:
        wait_s = quiet_s
        while not (await asyncio.wait([answer], timeout=wait_s))[0]:
            if await gone():
                raise GoneError(name or "the peer is gone")
            wait_s = every_s
        return answer.result()
    finally:
        await cancel_and_wait(answer, timeout_s=1.0)


def _outcome_read(task: asyncio.Task[Any]) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.debug("task %s ended with %r", task.get_name(), task.exception())


async def wait_any(*events: asyncio.Event, timeout_s: float | None = None) -> None:
    """Return as soon as one of ``events`` is set, or after ``timeout_s`` (if given)."""
    if timeout_s is not None and timeout_s <= 0:
        return
    waits = [asyncio.ensure_future(event.wait()) for event in events]
    try:
        await asyncio.wait(waits, timeout=timeout_s, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for wait in waits:
            wait.cancel()
        await asyncio.wait(waits)  # an event's wait ends at once when cancelled


async def until_stopped(
    work: Awaitable[T], stop: asyncio.Event, *, cancel_timeout_s: float
) -> T | None:
    """Await ``work`` unless ``stop`` comes first (then cancel it and return ``None``); an
    election campaign, typically."""
    task = asyncio.ensure_future(work)
    stopped = asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait({task, stopped}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        stopped.cancel()
    if task.done() and not stop.is_set():
        return task.result()
    await cancel_and_wait(task, timeout_s=cancel_timeout_s)
    return None


class KeyedLocks(Generic[K]):
    """One :class:`asyncio.Lock` per key, kept only while someone holds or waits for it.

    A plain ``dict.setdefault(key, Lock())`` keeps a lock for every key ever used (every
    subscription a long-running node ever served); here the entry goes with its last user.
    """

    def __init__(self) -> None:
        self._entries: dict[K, _LockEntry] = {}

    def __len__(self) -> int:
        """How many keys are held or waited for right now."""
        return len(self._entries)

    @contextlib.asynccontextmanager
    async def hold(self, key: K) -> AsyncIterator[None]:
        """Hold the lock of ``key`` for the body of the ``async with``."""
        entry = self._entries.get(key)
        if entry is None:
            entry = self._entries[key] = _LockEntry()
        entry.users += 1
        try:
            async with entry.lock:
                yield
        finally:  # also when cancelled while waiting for the lock
            entry.users -= 1
            if entry.users == 0:
                del self._entries[key]


class _LockEntry:
    __slots__ = ("lock", "users")

    def __init__(self) -> None:
        self.lock = asyncio.Lock()
        self.users = 0  # holders and waiters


def task_stacks() -> str:
    """Every task of the loop with the chain of coroutines it waits in, outermost first."""
    lines: list[str] = []
    for task in asyncio.all_tasks():
        chain: list[str] = []
        awaited: Any = task.get_coro()
        while awaited is not None and getattr(awaited, "cr_frame", None) is not None:
            frame = awaited.cr_frame
            chain.append(
                f"{frame.f_code.co_name} ({Path(frame.f_code.co_filename).name}:{frame.f_lineno})"
            )
            awaited = awaited.cr_await
        lines.append(f"  {task.get_name()}: {' -> '.join(chain) or 'not started'}")
    return "\n".join(sorted(lines))

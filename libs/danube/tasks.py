"""One owner for background tasks: :class:`TaskSet`.

A service's long-lived helpers (a partition's uploader, a leader's live publisher, a
replica's follower, a repair) run as tasks that nobody awaits while they work. Left to
``asyncio.create_task`` each site chooses what a failure means, and an exception nobody
retrieves is lost with its task. A :class:`TaskSet` is their owner instead:

- :meth:`TaskSet.spawn` starts a task (with no request's trace id: it outlives the request)
  under a name and a failure policy: ``"fail"`` (the default: a task that ends with an
  exception fails its owner, through the owner's ``on_failure``, and is logged) or ``"log"``
  (the task says its failure is its own: it is logged, nothing more);
- a task that ends by cancellation, or returns, is simply forgotten;
- :meth:`TaskSet.cancel` stops one task and waits for it (within a deadline: on Python 3.11
  a task can swallow a cancellation, :func:`danube.aio.cancel_and_wait` cancels again);
- :meth:`TaskSet.join` waits for them to end by themselves; :meth:`TaskSet.close` stops
  them all, and no task may be spawned after it; :meth:`TaskSet.cancel_all` cancels them
  all at once from code that cannot wait (an owner failing in a callback), and a later
  ``close`` waits for them.

Only ``TaskGroup`` does more (it cancels siblings and raises from ``async with``); it suits
work whose tasks end together. A TaskSet suits tasks that come and go while their owner
lives.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine
from typing import Any, Literal, TypeVar

from danube import trace
from danube.aio import cancel_and_wait

log = logging.getLogger(__name__)

T = TypeVar("T")
FailurePolicy = Literal["fail", "log"]
OnFailure = Callable[[str, BaseException], None]

STOP_TIMEOUT_S = 10.0
"""How long :meth:`TaskSet.cancel` and :meth:`TaskSet.close` wait for a cancelled task."""


class TaskSetClosedError(RuntimeError):
    """A task spawned on a closed TaskSet (a bug in its owner)."""


class TaskSet:
    """The tasks of one owner (named ``owner`` in logs); ``on_failure(task name, error)``
    is what a ``"fail"`` task's failure does to the owner (None: it is logged only)."""

    def __init__(self, owner: str, *, on_failure: OnFailure | None = None) -> None:
        self.owner = owner
        self._on_failure = on_failure
        # None: stopped by cancel_all, its end no failure (as one stopped by cancel)
        self._tasks: dict[asyncio.Task[Any], FailurePolicy | None] = {}
        self._closed = False

    def __len__(self) -> int:
        return len(self._tasks)

    def __contains__(self, task: object) -> bool:
        return task in self._tasks

    def spawn(
        self,
        work: Coroutine[Any, Any, T],
        *,
        name: str,
        on_failure: FailurePolicy = "fail",
    ) -> asyncio.Task[T]:
        """Start ``work`` as a task of this set, named ``name``."""
        if self._closed:
            work.close()  # never started: no "never awaited" warning
            raise TaskSetClosedError(f"{self.owner}: cannot start {name}: closed")
        # A helper outlives the request that may have started it (a claim over the bus, a
        # produce that created a topic): it carries no trace id of it (danube.trace).
        with trace.bound(None):
            task = asyncio.get_running_loop().create_task(work, name=name)
        self._tasks[task] = on_failure
        task.add_done_callback(self._ended)
        return task

    async def cancel(
        self, task: asyncio.Task[Any] | None, *, timeout_s: float = STOP_TIMEOUT_S
    ) -> bool:
        """Cancel ``task`` (one of this set's, or None) and wait until it is done; False if
        it outlived ``timeout_s``. Its exception, if any, is not a failure: it was stopped."""
        if task is None:
            return True
        self._tasks.pop(task, None)
        return await cancel_and_wait(task, timeout_s=timeout_s)

    def cancel_all(self) -> None:
        """Cancel every task now without waiting (for synchronous code: an owner that
        fails in a callback stops its helpers at once); :meth:`close` waits for them later.
        What one raises as it stops is no failure, as with :meth:`cancel`."""
        for task in self._tasks:
            self._tasks[task] = None
            task.cancel()

    async def join(self, *, timeout_s: float = STOP_TIMEOUT_S) -> bool:
        """Wait (at most ``timeout_s``) for the tasks running now to end by themselves;
        False if some did not."""
        if not self._tasks:
            return True
        _, pending = await asyncio.wait(list(self._tasks), timeout=timeout_s)
        return not pending

    async def close(self, *, timeout_s: float = STOP_TIMEOUT_S) -> None:
        """Cancel every task and wait for them all (each within ``timeout_s``); no task may
        be spawned after."""
        self._closed = True
        tasks, self._tasks = list(self._tasks), {}
        for task in tasks:
            task.cancel()
        for task in tasks:
            await cancel_and_wait(task, timeout_s=timeout_s)

    def _ended(self, task: asyncio.Task[Any]) -> None:
        policy = self._tasks.pop(task, None)
        if task.cancelled():
            return  # not a failure
        exc = task.exception()  # read also when its owner stopped it: never "not retrieved"
        if exc is None or policy is None:
            return  # returned, or stopped by its owner: not a failure
        log.error("%s: task %s failed: %r", self.owner, task.get_name(), exc, exc_info=exc)
        if policy == "fail" and self._on_failure is not None:
            self._on_failure(task.get_name(), exc)

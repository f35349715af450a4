"""danube.aio's futures awaited where they start: an awaited_task outlives an awaiter that
leaves and its unclaimed exception is never reported as lost; wait_any returns at the first
event, or at its timeout, and leaves nothing running; cancel_all_and_wait ends a task that
swallowed a cancellation and says when one outlives its deadline."""

from __future__ import annotations

import asyncio
import contextlib
import gc
from typing import Any

import pytest

from danube.aio import awaited_task, cancel_all_and_wait, wait_any

pytestmark = pytest.mark.unit


class Boom(Exception):
    pass


async def test_an_awaited_task_outlives_a_leaving_awaiter_and_its_error_is_not_lost() -> None:
    reported: list[dict[str, Any]] = []
    loop = asyncio.get_running_loop()
    loop.set_exception_handler(lambda _, context: reported.append(context))
    release = asyncio.Event()

    async def work() -> None:
        await release.wait()
        raise Boom("nobody is left to take this")

    task = awaited_task(work(), name="shared")

    async def awaiter(shared: asyncio.Task[None]) -> None:
        await asyncio.shield(shared)

    waiter = asyncio.create_task(awaiter(task))
    await asyncio.sleep(0)
    waiter.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await waiter
    assert not task.done()  # the awaiter left; the work goes on
    release.set()
    await asyncio.wait({task})
    await asyncio.sleep(0)  # done callbacks run
    del task
    gc.collect()
    assert reported == []  # read by awaited_task: no "exception was never retrieved"


async def test_wait_any_returns_at_the_first_event_or_the_timeout() -> None:
    first, second = asyncio.Event(), asyncio.Event()
    before = len(asyncio.all_tasks())
    asyncio.get_running_loop().call_soon(second.set)
    async with asyncio.timeout(5):
        await wait_any(first, second)
    async with asyncio.timeout(5):
        await wait_any(first, timeout_s=0.01)  # never set: the timeout ends it
    assert len(asyncio.all_tasks()) == before  # its waits are gone


async def test_cancel_all_and_wait_ends_a_task_that_swallowed_its_first_cancellation() -> None:
    """As asyncio.wait_for on Python 3.11 may (a cancellation meeting its result): the task
    goes on as if never cancelled; a TaskGroup would wait for it for ever."""
    swallowed = 0

    async def stubborn() -> None:
        nonlocal swallowed
        while True:
            try:
                await asyncio.sleep(3600)
            except asyncio.CancelledError:
                if swallowed:
                    raise
                swallowed += 1

    async def plain() -> None:
        await asyncio.sleep(3600)

    tasks = [asyncio.create_task(stubborn()), asyncio.create_task(plain()), None]
    await asyncio.sleep(0)
    assert await cancel_all_and_wait(tasks, timeout_s=2.0)
    assert swallowed == 1
    assert all(task.cancelled() for task in tasks if task is not None)


async def test_cancel_all_and_wait_says_when_a_task_outlives_the_deadline() -> None:
    release = asyncio.Event()

    async def deaf() -> None:
        while not release.is_set():
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.sleep(3600)

    task = asyncio.create_task(deaf())
    await asyncio.sleep(0)
    assert not await cancel_all_and_wait([task], timeout_s=0.2)
    release.set()
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task

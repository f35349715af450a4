"""The task owner (danube.tasks): failures reach the owner by policy, cancellation is no
failure, close stops everything and takes nothing after, cancel_all stops everything at once."""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging

import pytest

from danube import trace
from danube.tasks import TaskSet, TaskSetClosedError

pytestmark = pytest.mark.unit


class Boom(Exception):
    pass


async def _fail_soon() -> None:
    await asyncio.sleep(0)
    raise Boom("broken")


async def test_a_failing_task_fails_its_owner_unless_it_says_otherwise(
    caplog: pytest.LogCaptureFixture,
) -> None:
    failures: list[tuple[str, BaseException]] = []
    tasks = TaskSet("node-1", on_failure=lambda name, exc: failures.append((name, exc)))
    owned = tasks.spawn(_fail_soon(), name="upload-/ns/t")
    own = tasks.spawn(_fail_soon(), name="best-effort", on_failure="log")
    with caplog.at_level(logging.ERROR, logger="danube.tasks"):
        await asyncio.wait({owned, own})
        await asyncio.sleep(0)  # done callbacks run
    assert [(name, type(exc)) for name, exc in failures] == [("upload-/ns/t", Boom)]
    assert len(tasks) == 0
    logged = [r.getMessage() for r in caplog.records]
    assert any("upload-/ns/t failed" in m for m in logged)
    assert any("best-effort failed" in m for m in logged)


async def test_cancelled_or_finished_tasks_are_no_failure_and_are_forgotten() -> None:
    failures: list[str] = []
    tasks = TaskSet("node-1", on_failure=lambda name, exc: failures.append(name))
    done = tasks.spawn(asyncio.sleep(0, result=7), name="quick")
    waiting = tasks.spawn(asyncio.sleep(3600), name="forever")
    assert await done == 7
    assert await tasks.cancel(waiting)
    assert waiting.cancelled()
    other = tasks.spawn(asyncio.sleep(3600), name="other")
    await asyncio.sleep(0)
    other.cancel()  # cancelled from elsewhere: still no failure
    with contextlib.suppress(asyncio.CancelledError):
        await other
    await asyncio.sleep(0)
    assert failures == []
    assert len(tasks) == 0


async def test_close_stops_every_task_even_one_that_swallows_a_cancel() -> None:
    stubborn_stopped = asyncio.Event()

    async def stubborn() -> None:
        with contextlib.suppress(asyncio.CancelledError):  # swallowed once (as wait_for can)
            await asyncio.sleep(3600)
        try:
            await asyncio.sleep(3600)
        finally:
            stubborn_stopped.set()

    tasks = TaskSet("node-1")
    plain = tasks.spawn(asyncio.sleep(3600), name="plain")
    hard = tasks.spawn(stubborn(), name="stubborn")
    await asyncio.sleep(0)
    await tasks.close(timeout_s=5)
    assert plain.done()
    assert hard.done()
    assert stubborn_stopped.is_set()
    late = _fail_soon()
    with pytest.raises(TaskSetClosedError, match="closed"):
        tasks.spawn(late, name="late")
    assert inspect.getcoroutinestate(late) == inspect.CORO_CLOSED  # no "never awaited"


async def test_cancel_all_stops_every_task_at_once_and_fails_no_owner(
    caplog: pytest.LogCaptureFixture,
) -> None:
    failures: list[str] = []
    tasks = TaskSet("node-1", on_failure=lambda name, exc: failures.append(name))

    async def raises_as_it_stops() -> None:
        try:
            await asyncio.sleep(3600)
        finally:
            raise Boom("while stopping")

    plain = tasks.spawn(asyncio.sleep(3600), name="plain")
    loud = tasks.spawn(raises_as_it_stops(), name="loud")
    await asyncio.sleep(0)
    with caplog.at_level(logging.ERROR):
        tasks.cancel_all()  # synchronous: from a failure callback, say
        await asyncio.wait({plain, loud})
        await asyncio.sleep(0)  # done callbacks run
    assert plain.cancelled()
    assert isinstance(loud.exception(), Boom)
    assert failures == []  # stopped by its owner: no failure of the owner's
    assert caplog.records == []
    await tasks.close(timeout_s=5)
    assert len(tasks) == 0


async def test_a_spawned_helper_carries_no_trace_of_the_request_that_started_it() -> None:
    """A helper started while a request is served (a claim over the bus starts a partition's
    live stream) outlives it: what it sends on the bus carries no trace header of it."""
    seen: list[dict[str, str]] = []

    async def helper() -> None:
        seen.append(trace.bus_headers())  # what its bus messages would carry

    tasks = TaskSet("test")
    with trace.bound("the-claim-request"):
        task = tasks.spawn(helper(), name="helper")
        assert trace.bus_headers() != {}  # the request itself keeps its id
    await task
    assert seen == [{}]
    await tasks.close()

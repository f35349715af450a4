"""danube.admission.last_good: the last answer read, to answer with while etcd does not
answer (fails, or is slower than STALE_WAIT_S)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

import pytest

from danube.admission import refresh
from danube.admission.last_good import LastGood
from danube.meta.errors import MetaTimeoutError, MetaUnavailableError


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def answers(value: str) -> Callable[[], Awaitable[str]]:
    async def read() -> str:
        return value

    return read


def fails(error: Exception) -> Callable[[], Awaitable[str]]:
    async def read() -> str:
        raise error

    return read


async def test_an_answer_read_is_given_and_kept_for_when_etcd_does_not_answer() -> None:
    clock = Clock()
    kept: LastGood[str, str] = LastGood(clock=clock)
    assert await kept.read("t", answers("node-a")) == ("node-a", None)
    clock.now += 7.5
    assert await kept.read("t", fails(MetaTimeoutError("etcd get: no answer"))) == ("node-a", 7.5)
    assert await kept.read("t", fails(MetaUnavailableError("refused"))) == ("node-a", 7.5)
    # A newer answer replaces it, and its age starts again.
    assert await kept.read("t", answers("node-b")) == ("node-b", None)
    clock.now += 1.0
    assert await kept.read("t", fails(MetaTimeoutError("x"))) == ("node-b", 1.0)


async def test_nothing_kept_or_kept_too_long_raises_the_etcd_error() -> None:
    clock = Clock()
    kept: LastGood[str, str] = LastGood(max_age_s=60.0, clock=clock)
    with pytest.raises(MetaTimeoutError):
        await kept.read("never-read", fails(MetaTimeoutError("x")))
    await kept.read("t", answers("node-a"))
    clock.now += 60.5
    with pytest.raises(MetaUnavailableError):
        await kept.read("t", fails(MetaUnavailableError("refused")))
    assert len(kept) == 0  # dropped: a later failure does not find it either


async def test_errors_other_than_etcd_failing_are_raised_as_they_are() -> None:
    kept: LastGood[str, str] = LastGood(clock=Clock())
    await kept.read("t", answers("node-a"))
    with pytest.raises(LookupError):
        await kept.read("t", fails(LookupError("the topic is gone")))


async def test_etcd_slower_than_the_stale_wait_is_not_waited_for(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(refresh, "STALE_WAIT_S", 0.05)
    clock = Clock()
    kept: LastGood[str, str] = LastGood(clock=clock)

    async def stalled() -> str:
        await asyncio.sleep(30)
        return "never"

    await kept.read("t", answers("node-a"))
    clock.now += 2.0
    started = time.monotonic()
    assert await kept.read("t", stalled) == ("node-a", 2.0)
    assert time.monotonic() - started < 1.0
    # A key never answered has nothing else to give: it waits for the read.
    with pytest.raises(TimeoutError):
        async with asyncio.timeout(0.2):
            await kept.read("other", stalled)


async def test_at_most_max_entries_are_kept_the_one_answered_longest_ago_dropped() -> None:
    clock = Clock()
    kept: LastGood[str, str] = LastGood(max_entries=2, clock=clock)
    for key in ("a", "b"):
        await kept.read(key, answers(f"{key}-1"))
    await kept.read("a", answers("a-2"))  # answered again: now the newest
    await kept.read("c", answers("c-1"))  # over the bound: "b" goes
    assert len(kept) == 2
    timeout = fails(MetaTimeoutError("x"))
    assert await kept.read("a", timeout) == ("a-2", 0.0)
    assert await kept.read("c", timeout) == ("c-1", 0.0)
    with pytest.raises(MetaTimeoutError):
        await kept.read("b", timeout)


def test_a_bound_below_one_is_refused() -> None:
    with pytest.raises(ValueError, match="max_entries"):
        LastGood(max_entries=0)

"""The event loop lag histogram (danube.runtime.looplag): a callback that blocks the loop
shows as lag of about its length; an idle loop shows none to speak of."""

from __future__ import annotations

import asyncio
import time

import pytest
from prometheus_client import REGISTRY

from danube.runtime.looplag import watch_loop_lag

pytestmark = pytest.mark.unit

PERIOD_S = 0.02
BLOCK_S = 0.1


def _lag() -> tuple[float, float]:
    count = REGISTRY.get_sample_value("danube_event_loop_lag_seconds_count") or 0.0
    total = REGISTRY.get_sample_value("danube_event_loop_lag_seconds_sum") or 0.0
    return count, total


def _hog_the_loop(seconds: float) -> None:
    """Run on the loop's thread without yielding, as a slow handler would."""
    until = time.perf_counter() + seconds
    while time.perf_counter() < until:
        pass


async def test_a_blocked_loop_shows_as_lag() -> None:
    count_before, sum_before = _lag()
    watcher = asyncio.create_task(watch_loop_lag(PERIOD_S))
    try:
        await asyncio.sleep(PERIOD_S * 3)  # a few idle samples
        _hog_the_loop(BLOCK_S)  # the watcher's timer fires late
        await asyncio.sleep(PERIOD_S * 3)
    finally:
        watcher.cancel()
        await asyncio.gather(watcher, return_exceptions=True)
    count, total = _lag()
    assert count - count_before >= 3
    # The late wake-up carries nearly the whole block (less at most one period it had
    # already slept when the block began).
    assert total - sum_before >= BLOCK_S - PERIOD_S

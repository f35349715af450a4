"""How long ready work waits for this process's event loop: a request's handler, a bus
reply, a WebSocket frame all queue behind whatever runs now. A timer asks to wake every
``LOOP_LAG_PERIOD_S``; how late it wakes is the wait of everything queued with it. One
histogram per process (every service runs one event loop)."""

from __future__ import annotations

import asyncio

from prometheus_client import Histogram

LOOP_LAG_PERIOD_S = 0.25  # four samples a second: cheap, and a stall of a second shows
EVENT_LOOP_LAG_SECONDS = Histogram(
    "danube_event_loop_lag_seconds",
    "How late a timer callback ran: the time ready work (request handlers, bus replies) "
    "waits for this process's event loop",
    buckets=(0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0),
)


async def watch_loop_lag(period_s: float = LOOP_LAG_PERIOD_S) -> None:
    """Sample the event loop's lag every ``period_s`` until cancelled."""
    loop = asyncio.get_running_loop()
    while True:
        asked_s = loop.time()
        await asyncio.sleep(period_s)
        EVENT_LOOP_LAG_SECONDS.observe(max(0.0, loop.time() - asked_s - period_s))

"""The clock of one served subscription: its machine is handed a Tick (ack deadlines,
redeliveries, delayed messages and cursor writes fall due with time) every
``TICK_INTERVAL_S`` while it holds something, and every ``QUIET_TICK_S`` (or at its next
event) while it is quiet (SubscriptionMachine.quiet): idle subscriptions cost next to
nothing. A delayed message falling due sooner shortens the wait: it is handed out at its
time, not at the next tick (at most one such tick every ``DUE_TICK_GAP_S``)."""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Awaitable, Callable

from danube.dispatcher.delivery import SubscriptionMachine

TICK_INTERVAL_S = 0.05
# A tick for delayed messages falling due comes at least this long after the one before:
# while thousands fall due a second (some every millisecond), each tick releases what fell
# due since the last, rather than a tick, a wake-up of every waiting poll and a send to each
# consumer every millisecond. A delayed message is handed out up to this much later.
DUE_TICK_GAP_S = 0.005
# A quiet subscription (nothing held, no cursor to write: SubscriptionMachine.quiet) ticks
# this often instead, or at its next event: idle subscriptions cost next to nothing.
QUIET_TICK_S = 1.0


async def tick_loop(
    machine: Callable[[], SubscriptionMachine],
    changed: Callable[[float], Awaitable[None]],
    tick: Callable[[float, int], Awaitable[None]],
) -> None:
    """Call ``tick(monotonic now_s, wall_ms)`` for ever, as often as ``machine()`` needs:
    ``changed(timeout_s)`` waits at most that long for the subscription's next change (it
    ends a quiet wait: danube.dispatcher.changes)."""
    while True:
        if machine().quiet():
            # Nothing can fall due before the next event (it wakes us) or the next
            # delayed message's time; consumer sessions (a minute by default) are looked
            # at on this clock too.
            await changed(until_due_s(machine(), QUIET_TICK_S))
        else:
            await asyncio.sleep(until_due_s(machine(), TICK_INTERVAL_S))
        await tick(time.monotonic(), wall_ms())


def until_due_s(machine: SubscriptionMachine, tick_s: float) -> float:
    """``tick_s`` (jittered), or less when a delayed message falls due sooner: it is handed
    out at its time (within ``DUE_TICK_GAP_S`` of the last tick), not at the next tick."""
    wait_s = tick_s * random.uniform(0.9, 1.1)
    due_ms = machine.next_due_ms()
    if due_ms is not None:
        wait_s = min(wait_s, max(DUE_TICK_GAP_S, (due_ms - time.time() * 1000) / 1000))
    return wait_s


def wall_ms() -> int:
    """The wall clock in milliseconds (delayed messages and expiry are on it)."""
    return int(time.time() * 1000)

"""A clock a test moves by hand, and a way to let background tasks run (unit tests of the
discovery caches' refresh-ahead)."""

from __future__ import annotations

import asyncio


class Clock:
    """Monotonic seconds that move only when the test sets ``now_s``."""

    def __init__(self) -> None:
        self.now_s = 0.0

    def __call__(self) -> float:
        return self.now_s


async def settle(turns: int = 5) -> None:
    """Let the loop run a few turns: a background read and its bookkeeping take a few."""
    for _ in range(turns):
        await asyncio.sleep(0)

"""A served subscription's change signal: every event that may let a waiting poll take
something (messages read, an ack freeing window room, time making redeliveries due) calls
:meth:`Changes.notify`, and everything waiting for the next change wakes at once."""

from __future__ import annotations

import asyncio
import contextlib


class Changes:
    """The next change of one subscription, as an event replaced at every change: a waiter
    holds the one current when it began to wait, which the next :meth:`notify` sets."""

    def __init__(self) -> None:
        self._next = asyncio.Event()

    def notify(self) -> None:
        """Wake everything waiting: messages may be available."""
        changed, self._next = self._next, asyncio.Event()
        changed.set()

    async def wait(self, timeout_s: float) -> None:
        """Until the next change, or at most ``timeout_s``."""
        changed = self._next
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout_s):
                await changed.wait()

"""What happens to a batch once durable: it enters the cache and goes to the durable listeners.

A batch is split into runs of consecutive offsets (an ``advance_to`` between two appends of one
batch makes two runs), so a listener always gets ``(first offset, payloads)`` whose offsets are
``first, first + 1, ...``, in offset order across calls.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

from danube.ingest.wal.cache import MessageCache

log = logging.getLogger(__name__)

DurableListener = Callable[[int, Sequence[bytes]], None]
"""Called with ``(first offset, payloads)``: consecutive offsets, just made durable, in order."""


class DurableFeed:
    """The cache and the listeners that every durable batch feeds (event loop only)."""

    def __init__(self, cache: MessageCache) -> None:
        self.cache = cache
        self._listeners: list[DurableListener] = []
        self.messages = 0
        self.batches = 0

    def add_listener(self, listener: DurableListener) -> Callable[[], None]:
        """Register ``listener``; returns the function that removes it."""
        self._listeners.append(listener)

        def remove() -> None:
            if listener in self._listeners:
                self._listeners.remove(listener)

        return remove

    def publish(self, batch: Sequence[tuple[Any, ...]]) -> None:
        """Feed a durable batch of ``(first offset, payloads, ...)`` appends, in offset order."""
        self.batches += 1
        run_first: int = batch[0][0]
        run = list(batch[0][1])  # a fresh list: listeners may keep it
        for item in batch[1:]:
            if item[0] != run_first + len(run):
                self._run(run_first, run)
                run_first, run = item[0], []
            run.extend(item[1])
        self._run(run_first, run)

    def _run(self, first: int, payloads: list[bytes]) -> None:
        self.messages += len(payloads)
        self.cache.extend(first, payloads)
        for listener in tuple(self._listeners):
            try:
                listener(first, payloads)
            except Exception:  # one bad listener must not stop the writer or the others
                log.exception("WAL durable listener failed", extra={"first_offset": first})

"""What happens to a batch once durable: it enters the cache and goes to the durable listeners.

A batch is split into runs of consecutive offsets (an ``advance_to`` between two appends of one
batch makes two runs), so a listener always gets ``(first offset, payloads, frames)`` whose
offsets are ``first, first + 1, ...``, in offset order across calls; ``frames``: the run's
frames as the writer wrote them (offsets and CRCs set), when one write held exactly the run
(None otherwise): whoever sends them on takes them as they are instead of framing again.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from danube.ingest.wal.cache import MessageCache

log = logging.getLogger(__name__)

DurableListener = Callable[[int, Sequence[bytes | memoryview], bytes | None], None]
"""Called with ``(first offset, payloads, frames)``: consecutive offsets, just made durable, in
order; their frames as written, or None."""


_L = TypeVar("_L")


def registered(listeners: list[_L], listener: _L) -> Callable[[], None]:
    """Add ``listener`` to ``listeners``; the function that removes it (once, harmlessly
    again)."""
    listeners.append(listener)

    def remove() -> None:
        if listener in listeners:
            listeners.remove(listener)

    return remove


class DurableFeed:
    """The cache and the listeners that every durable batch feeds (event loop only)."""

    def __init__(self, cache: MessageCache) -> None:
        self.cache = cache
        self._listeners: list[DurableListener] = []
        self.messages = 0
        self.batches = 0

    def add_listener(self, listener: DurableListener) -> Callable[[], None]:
        """Register ``listener``; returns the function that removes it."""
        return registered(self._listeners, listener)

    def publish(self, batch: Sequence[tuple[Any, ...]], frames: Sequence[bytes] = ()) -> None:
        """Feed a durable batch of ``(first offset, payloads, ...)`` appends, in offset order;
        ``frames``: what the writer wrote for it (one entry per write)."""
        self.batches += 1
        run_first: int = batch[0][0]
        run = list(batch[0][1])  # a fresh list: listeners may keep it
        runs = 1
        for item in batch[1:]:
            if item[0] != run_first + len(run):
                self._run(run_first, run, None)
                run_first, run = item[0], []
                runs += 1
            run.extend(item[1])
        # One run written in one write: those bytes are exactly its frames.
        self._run(run_first, run, frames[0] if runs == 1 and len(frames) == 1 else None)

    def _run(self, first: int, payloads: list[bytes], frames: bytes | None) -> None:
        self.messages += len(payloads)
        self.cache.extend(first, payloads, frames)
        for listener in tuple(self._listeners):
            try:
                listener(first, payloads, frames)
            except Exception:  # one bad listener must not stop the writer or the others
                log.exception("WAL durable listener failed", extra={"first_offset": first})

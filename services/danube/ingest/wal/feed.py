"""What happens to a batch once durable: it enters the cache and goes to the durable listeners.

A batch is split into runs of consecutive offsets (an ``advance_to`` between two appends of one
batch makes two runs), so a listener always gets a :class:`DurableRun` whose offsets are
``first, first + 1, ...``, in offset order across calls, with the run's frames as the writer
wrote them (offsets and CRCs set) when one write held exactly the run: whoever sends them on
takes them as they are instead of framing again. A run of one append hands on its
:class:`~danube.frame.batch.FrameBatch` as its payloads (views made only when read), and its
byte count, so that a listener that only counts builds nothing per message.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple, TypeVar

from danube.frame import append_frame
from danube.frame.batch import FrameBatch
from danube.ingest.wal.cache import MessageCache

log = logging.getLogger(__name__)

Payloads = Sequence[bytes | memoryview]


class DurableRun(NamedTuple):
    """Messages of consecutive offsets just made durable: the first offset, the records,
    their frames as the writer wrote them (None: not one write of exactly this run), and the
    records' bytes."""

    first: int
    payloads: Payloads
    frames: bytes | None
    payload_bytes: int

    def framed(self) -> bytes:
        """The run's frames: the writer's bytes as they are, or framed here."""
        if self.frames is not None:
            return self.frames
        out = bytearray()
        for index, payload in enumerate(self.payloads):
            append_frame(out, self.first + index, payload)
        return bytes(out)


DurableListener = Callable[[DurableRun], None]
"""Called with each run just made durable, in offset order."""


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
        """Feed a durable batch of ``(first offset, frames, ...)`` appends, in offset order;
        ``frames``: what the writer wrote for it (one entry per write)."""
        self.batches += 1
        first: int = batch[0][0]
        appended: FrameBatch = batch[0][1]
        if len(batch) == 1:  # one append: its batch as it is (nobody changes it now)
            written = frames[0] if len(frames) == 1 else None
            self._run(DurableRun(first, appended, written, appended.record_bytes()))
            return
        run: list[bytes | memoryview] = list(appended)
        size = appended.record_bytes()
        runs = 1
        for item in batch[1:]:
            if item[0] != first + len(run):
                self._run(DurableRun(first, run, None, size))
                first, run, size = item[0], [], 0
                runs += 1
            run.extend(item[1])
            size += item[1].record_bytes()
        # One run written in one write: those bytes are exactly its frames.
        self._run(
            DurableRun(first, run, frames[0] if runs == 1 and len(frames) == 1 else None, size)
        )

    def _run(self, run: DurableRun) -> None:
        self.messages += len(run.payloads)
        self.cache.extend(run.first, run.payloads, run.frames, run.payload_bytes)
        for listener in tuple(self._listeners):
            try:
                listener(run)
            except Exception:  # one bad listener must not stop the writer or the others
                log.exception("WAL durable listener failed", extra={"first_offset": run.first})

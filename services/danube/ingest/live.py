"""The live stream of one partition its node leads: committed batches, published on the
partition's live subject in offset order, a message only once it can no longer disappear.

Live delivery is an optimization, never the record: dispatchers catch up through fetch. So a
full queue drops (counted), and a body the bus can never carry is dropped (counted). Reliable
partitions publish a wake-up (``durable_next``, with the frames when they are small: see
:meth:`LiveStream.wakeup_body`); non-reliable (memory) ones publish their frames, which is
how their readers get them.

The stream knows the partition only through three questions it is given: how far the log is
committed (the high watermark), where the WAL starts, and whether the partition stopped.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Callable, Sequence

from danube.bus import Bus
from danube.errors import DanubeError
from danube.frame import FRAME_HEADER_BYTES
from danube.ingest import metrics
from danube.ingest.wal.feed import DurableRun as Run
from danube.meta import TopicName
from danube.meta.backoff import backoff_s
from danube.wire.ingest import protocol
from danube.wire.sizes import body_limit

log = logging.getLogger(__name__)

LIVE_QUEUE_BATCHES_MAX = 1024


class LiveStream:
    """Committed batches of ``name`` waiting to be published, and the loop that publishes
    them (:meth:`run`, one task per term)."""

    def __init__(
        self,
        name: TopicName,
        bus: Bus,
        *,
        carries_payloads: bool,
        committed: Callable[[], int],
        wal_start: Callable[[], int],
        stopped: Callable[[], bool],
    ) -> None:
        self.name = name
        self._bus = bus
        self._subject = bus.subjects.live(name)
        self.carries_payloads = carries_payloads
        self._committed = committed
        self._wal_start = wal_start
        self._stopped = stopped
        self._queue: deque[Run] = deque()
        self._ready = asyncio.Event()

    def offer(self, run: Run) -> None:
        """A run the WAL made durable: queued until committed, or dropped (counted) when
        the queue is full."""
        if len(self._queue) >= LIVE_QUEUE_BATCHES_MAX:
            metrics.LIVE_DROPPED.inc(len(run.payloads))
            return
        self._queue.append(run)
        self._ready.set()

    def committed_moved(self) -> None:
        """The high watermark moved: queued batches may be published now."""
        self._ready.set()

    async def run(self) -> None:
        """Publish committed batches in offset order until cancelled."""
        limit = max(body_limit(self._bus.max_payload_bytes), 1024)
        while True:
            await self._ready.wait()
            self._ready.clear()
            wakeup: protocol.Wakeup | None = None
            ready: list[Run] = []
            while self._queue:
                run = self._queue[0]
                first, payloads = run.first, run.payloads
                if first + len(payloads) > self._committed():
                    break  # the next watermark move sets _ready again
                self._queue.popleft()
                if not self.carries_payloads:
                    # Reliable readers deliver frames as the WAL holds them; the live
                    # subject wakes them: one body for every committed batch ready now,
                    # with their frames when they are small (wakeup_body).
                    count = len(payloads) + (wakeup.count if wakeup else 0)
                    size = run.payload_bytes + (wakeup.payload_bytes if wakeup else 0)
                    wakeup = protocol.Wakeup(first + len(payloads), count, size)
                    ready.append(run)
                    continue
                for body, count in frame_chunks(run, limit):
                    await self._publish(body, count)
            if wakeup is not None:
                await self._publish(self.wakeup_body(wakeup, ready), wakeup.count)

    def wakeup_body(self, wakeup: protocol.Wakeup, runs: Sequence[Run]) -> bytes:
        """A plain wake-up, or one carrying the frames of ``runs`` (protocol.Carried)
        when they are small and one run of offsets (a batch dropped from a full live queue
        leaves a gap: then readers fetch)."""
        if wakeup.payload_bytes > protocol.LIVE_CARRY_BYTES_MAX:
            return wakeup.encode()
        expected = runs[0].first
        for run in runs:
            if run.first != expected:
                return wakeup.encode()
            expected = run.first + len(run.payloads)
        frames = b"".join(run.framed() for run in runs)
        return protocol.Carried.encode(runs[0].first, self._wal_start(), wakeup, frames)

    async def _publish(self, body: bytes, count: int) -> None:
        """Publish one live body, retrying what may work later (the bus reconnecting) with
        capped backoff, one warning per burst of failures. A body the bus can never carry
        is dropped and counted: live delivery is only a wake-up, readers fetch the record."""
        failures = 0
        while not self._stopped():
            try:
                await self._bus.publish(self._subject, body)
            except Exception as exc:
                if not isinstance(exc, DanubeError) or not exc.retriable:
                    # Too large, or a bug: retrying the same body would block the stream.
                    metrics.LIVE_DROPPED.inc(count)
                    log.error("%s: live body of %d message(s) dropped: %r", self.name, count, exc)
                    return
                if failures == 0:
                    log.warning("%s: live publish failed, retrying: %s", self.name, exc)
                failures += 1
                await asyncio.sleep(backoff_s(failures - 1, base_s=0.05, cap_s=1.0))
                continue
            if failures:
                log.info("%s: live publish works again after %d failures", self.name, failures)
            return


def frame_chunks(run: Run, limit_bytes: int) -> list[tuple[bytes, int]]:
    """The frames of ``run`` packed into bodies of at most the limit (a single frame over
    the limit travels alone; the bus refuses it and counts it), each with the number of
    frames it holds: slices of its frames, cut where a frame ends."""
    frames = run.framed()
    if len(frames) <= limit_bytes:
        return [(frames, len(run.payloads))]
    bodies: list[tuple[bytes, int]] = []
    start = end = count = 0
    for payload in run.payloads:
        size = FRAME_HEADER_BYTES + len(payload)
        if count and end + size - start > limit_bytes:
            bodies.append((frames[start:end], count))
            start, count = end, 0
        end += size
        count += 1
    bodies.append((frames[start:end], count))
    return bodies

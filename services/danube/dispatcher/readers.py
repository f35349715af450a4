"""Reading one partition for a subscription, and where a new subscription starts.

The live subject of the partition is a wake-up signal: every message handed to the
machine comes from a fetch of the ingest owner starting at the cursor's read position, or
from a wake-up that carried its frames (small commits: ``protocol.Carried``) when they
start exactly at that position, which is what the fetch would have answered. Either is
authoritative about the range it covers, so the switch from catching up to following live
has no gap and no duplicate by construction.

A read below the WAL's start (segments already dropped by retention) goes to the cloud tier
(any cloud_reader): it answers frames of one object and where to continue, and the reader keeps
following ``next_offset`` until it is back above the WAL's start; every answer, from either
tier, covers ``[from, next)`` authoritatively, so the hand-off has no gap and no duplicate.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar

from danube.aio import awaited_task
from danube.bus import Bus, BusError, Message, NoRespondersError, RemoteError, Subscription
from danube.dispatcher import metrics, tiers
from danube.dispatcher.damage import DamageBook
from danube.dispatcher.events import MessagesAvailable
from danube.frame import RawFrame
from danube.meta import TopicName
from danube.meta.backoff import backoff_s
from danube.wire.cloud.client import CloudClient
from danube.wire.ingest.client import FetchReply, IngestClient, carried_reply
from danube.wire.ingest.protocol import Carried, Wakeup

log = logging.getLogger(__name__)

_R = TypeVar("_R")

# With no live wake-up, a fetch anyway after IDLE_POLL_S (a wake-up can be lost: a full
# pending queue, a reconnect), then twice as long after each one that found nothing, up to
# IDLE_POLL_MAX_S: an idle partition costs a fetch every few seconds, not two a second.
IDLE_POLL_S = 0.5
IDLE_POLL_MAX_S = 4.0
FETCH_TIMEOUT_S = 5.0
FETCH_MAX_COUNT = 1000
FETCH_MAX_BYTES = 1 << 20
# Wake-ups with frames kept for the next read (a tailing reader needs one, two when a second
# came before it read): up to 2 x 64 KiB per reader; one behind them fetches instead.
CARRIED_KEPT = 2
_BACKOFF_BASE_S = 0.05
_BACKOFF_CAP_S = 2.0


@dataclass(frozen=True)
class ReadLinks:
    """What every reader of one subscription shares (built once by its runtime): where it
    reads, and where it reports a range no copy holds intact."""

    bus: Bus
    ingest: IngestClient
    damage: DamageBook
    notify: Callable[[], None]
    """Wakes the subscription's waiting polls (they answer a damage error at once)."""
    where: str
    """``topic/sub``, for the logs."""


Position = Callable[[], int | None]
"""Where a reader reads next (None: nothing to read now)."""
Deliver = Callable[[MessagesAvailable], Awaitable[None]]
"""Hands one read over (to the machine, and carries out what it decides)."""


class PartitionReader:
    """Feeds one partition of a subscription to its machine until cancelled: reads from
    ``position()`` and hands each read to ``deliver``."""

    def __init__(
        self,
        links: ReadLinks,
        partition: TopicName,
        name: str,
        *,
        position: Position,
        deliver: Deliver,
    ) -> None:
        self.links = links
        self.partition = partition
        self.name = name
        self.cloud = CloudClient(links.bus)
        self._position = position
        self._deliver = deliver
        self._wake = asyncio.Event()
        self._resumed = asyncio.Event()
        self._resumed.set()
        # The highest committed end a live wake-up announced (None: a live body that was
        # not a wake-up came, so the end is not known from the live subject). A fetch that
        # reached it needs no follow-up fetch: the next wake-up says when there is more.
        self.live_end: int | None = 0
        # Idle polls in a row that found nothing (each waits twice as long as the last).
        self._idle_polls = 0
        # Wake-ups that carried their frames, oldest first (at most CARRIED_KEPT): a read
        # at one's first offset takes it instead of fetching.
        self._carried: deque[Carried] = deque(maxlen=CARRIED_KEPT)
        # The fetch sent ahead (see the module's docstring): its from offset and its task.
        self._ahead: tuple[int, asyncio.Task[FetchReply[RawFrame]]] | None = None

    def set_paused(self, paused: bool) -> None:
        """Honour PauseReading / ResumeReading from the machine."""
        if paused:
            self._resumed.clear()
            self._carried.clear()  # a paused reader would be behind them when it resumes
            self._drop_ahead()  # no reply held while the machine holds too many
        else:
            self._resumed.set()
            self._wake.set()

    def wake(self) -> None:
        """Fetch now rather than at the next idle poll."""
        self._wake.set()

    async def _on_live(self, message: Message) -> None:
        carried = Carried.decode(message.body)
        # Kept for the next read unless paused (it would be behind them when it resumes).
        if (
            carried is not None
            and self._resumed.is_set()
            and carried.wakeup.count <= FETCH_MAX_COUNT
        ):
            self._carried.append(carried)
        wakeup = carried.wakeup if carried is not None else Wakeup.decode(message.body)
        if wakeup is None:
            self.live_end = None
        elif self.live_end is not None:
            self.live_end = max(self.live_end, wakeup.next_offset)
        self._wake.set()

    async def run(self) -> None:
        """Fetch whenever woken (live traffic), else after an idle wait; never returns."""
        bus = self.links.bus
        live: Subscription | None = None
        try:
            # A bounded pending queue: a wake-up lost to a full queue is caught by the idle poll.
            live = await bus.subscribe(
                bus.subjects.live(self.partition), self._on_live, pending_msgs_limit=64
            )
            failures = 0
            task = asyncio.current_task()
            while True:
                # On Python 3.11 a cancel that lands as a bus reply arrives can be swallowed
                # (asyncio.wait_for in the NATS client, fixed in 3.12): the loop would then go
                # on, or wait paused for ever, and the subscription's stop would never end.
                if task is not None and task.cancelling():
                    raise asyncio.CancelledError
                await self._resumed.wait()
                self._wake.clear()
                try:
                    more = await self._read_once()
                    failures = 0
                except (BusError, TimeoutError) as exc:
                    failures += 1
                    if isinstance(exc, RemoteError) and exc.code == "object_corrupt":
                        log.error("%s: cannot read on: %s", self.partition, exc)
                    elif not isinstance(exc, NoRespondersError):  # no owner: nothing produced
                        log.debug("fetch of %s failed: %s", self.partition, exc)
                    delay_s = backoff_s(failures - 1, base_s=_BACKOFF_BASE_S, cap_s=_BACKOFF_CAP_S)
                    await asyncio.sleep(delay_s)
                    continue
                if more:
                    continue
                try:
                    async with asyncio.timeout(self.idle_wait_s()):
                        await self._wake.wait()
                    self._idle_polls = 0
                except TimeoutError:
                    self._idle_polls += 1
        finally:
            self._drop_ahead()
            if live is not None:
                with contextlib.suppress(Exception):
                    await live.unsubscribe()

    async def _read_once(self) -> bool:
        """One read from the read position, from the WAL or, when the WAL cannot serve it
        (below its start, damaged), from the cloud tier (danube.dispatcher.tiers); whether
        more may be waiting right away."""
        position = self._position()
        if position is None:
            return False
        reply = self._carried_at(position)
        if reply is None:
            reply = await self._fetched_at(position)
        else:
            self._drop_ahead()  # a fetch sent ahead from here would answer the same frames
            metrics.LIVE_CARRIED.inc(len(reply.frames))
        step = tiers.after_wal(position, reply)
        if isinstance(step, tiers.AskCloud):
            cloud = await self._timed("cloud", self.cloud.fetch, position)
            outcome = tiers.after_cloud(str(self.partition), step, cloud)
            if isinstance(outcome, tiers.Blocked):
                self._blocked(outcome.damage)
                return False
            step = outcome
        if not step.messages and step.next_offset <= position:
            return False
        self._unblocked()
        if step.messages:
            self._idle_polls = 0  # an idle poll found something: a wake-up was lost
        if step.gone:
            log.warning(
                "%s: offsets %d..%d are in neither the WAL nor object storage; skipping to %d",
                self.partition,
                position,
                step.next_offset - 1,
                step.next_offset,
            )
        metrics.TIER_MESSAGES.labels(step.tier).inc(len(step.messages))
        more = step.tier == "cloud" or (
            bool(step.messages) and not self.reached_live_end(step.next_offset)
        )
        if more and step.tier == "wal":
            self._fetch_ahead(step.next_offset)
        event = MessagesAvailable(self.name, step.messages, position, step.next_offset)
        await self._deliver(event)
        return more

    async def _fetched_at(self, position: int) -> FetchReply[RawFrame]:
        """The WAL's answer to a fetch from ``position``: the one sent ahead from there, or
        a fetch now (one sent ahead from elsewhere is dropped)."""
        ahead = self._ahead
        if ahead is not None and ahead[0] == position:
            self._ahead = None
            return await ahead[1]
        self._drop_ahead()
        return await self._fetch(position)

    async def _fetch(self, position: int) -> FetchReply[RawFrame]:
        return await self._timed("wal", self.links.ingest.fetch_frames, position)

    async def _timed(self, tier: str, fetch: Callable[..., Awaitable[_R]], position: int) -> _R:
        """``fetch`` (a tier's client) from ``position`` with the reader's limits, timed."""
        started_s = time.perf_counter()
        reply = await fetch(
            self.partition,
            position,
            max_bytes=FETCH_MAX_BYTES,
            max_count=FETCH_MAX_COUNT,
            timeout_s=FETCH_TIMEOUT_S,
        )
        metrics.FETCH_SECONDS.labels(tier).observe(time.perf_counter() - started_s)
        return reply

    def _fetch_ahead(self, position: int) -> None:
        self._drop_ahead()
        # Its outcome is taken by the read from `position`; one dropped unread is not an error
        # (and run()'s end drops it).
        task = awaited_task(self._fetch(position), name=f"fetch-ahead {self.partition}")
        self._ahead = (position, task)

    def _drop_ahead(self) -> None:
        if self._ahead is not None:
            self._ahead[1].cancel()
            self._ahead = None

    def _carried_at(self, position: int) -> FetchReply[RawFrame] | None:
        """The frames a wake-up carried from ``position`` on, as a fetch would answer them;
        None when none starts there (then the reader fetches). Older ones are dropped."""
        carried = self._carried
        while carried and carried[0].wakeup.next_offset <= position:
            carried.popleft()
        if not carried or carried[0].first_offset != position:
            return None
        return carried_reply(self.partition, carried.popleft())

    def idle_wait_s(self) -> float:
        """How long to wait for a wake-up before fetching anyway."""
        return min(IDLE_POLL_S * (1 << min(self._idle_polls, 8)), IDLE_POLL_MAX_S)

    def reached_live_end(self, next_offset: int) -> bool:
        """Whether a read up to ``next_offset`` took everything the wake-ups announced:
        then a fetch right after would come back empty (a tailing reader would fetch twice
        per wake-up), and the next wake-up (or the idle poll) says when to read again."""
        return self.live_end is not None and 0 < self.live_end <= next_offset

    def _blocked(self, damage: tiers.Damage) -> None:
        """No intact copy at the read position: stop here, say so once (the loop asks both
        tiers again at every idle poll: a repaired range reads on by itself)."""
        book = self.links.damage
        before = len(book)
        if book.report(damage):
            metrics.DAMAGED_RANGES.inc()
            log.error("%s: %s", self.links.where, damage.describe())
            self.links.notify()  # waiting polls answer the error now
        metrics.DAMAGED_PARTITIONS.inc(len(book) - before)

    def _unblocked(self) -> None:
        cleared = self.links.damage.clear(str(self.partition))
        if cleared is not None:
            metrics.DAMAGED_PARTITIONS.dec()
            log.warning("%s: reads on past %s", self.partition, cleared.describe())


class DelayRescanReader(PartitionReader):
    """Reads a partition again for its delayed messages not acked (from the stored
    ``delay_from`` up to the stored next offset: danube.dispatcher.delayed) after a resume,
    beside the usual reader, so the partition's other messages are not held back while it
    does; it ends when the rescan does (``position()`` is None: the runtime hands in the
    machine's ``rescan_position``, and a ``deliver`` that rereads)."""

    async def run(self) -> None:
        """Read until the rescan ends (or the task is cancelled)."""
        failures = 0
        try:
            while True:
                if self._position() is None:
                    return
                try:
                    more = await self._read_once()
                    failures = 0
                except (BusError, TimeoutError) as exc:
                    failures += 1
                    log.debug("rescan of %s failed: %s", self.partition, exc)
                    delay_s = backoff_s(failures - 1, base_s=_BACKOFF_BASE_S, cap_s=_BACKOFF_CAP_S)
                    await asyncio.sleep(delay_s)
                    continue
                if not more:
                    await asyncio.sleep(IDLE_POLL_S)  # not readable yet: ask again soon
        finally:
            self._drop_ahead()

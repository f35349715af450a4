"""One partition this node leads: produce, the high watermark, the ISR, the live stream.

``produce`` refuses while the ISR is smaller than ``min_insync_replicas``, appends to the
WAL (offsets are the WAL's: contiguous for the partition's whole life) and answers once the
high watermark passed the batch — every in-sync replica holds it durably — and only while
this node still leads. Followers' fetches move the watermark (danube.ingest.isr); the ISR
changes are written to etcd before they count (danube.ingest.leader_replicas, with the
moves of leadership and replicas). Committed batches go to the live stream
(danube.ingest.live).

**Without its node lease** (an etcd outage longer than the lease; docs/replication.md,
"Serving through an etcd outage") the leader goes on acknowledging only while every
follower counted for the high watermark has fetched at this epoch within ``contact_s``
(:meth:`IsrTracker.confirmed`): the high watermark needs them all, and a follower that
moved to a newer epoch fetches here no more. When one stops confirming, the leader fences
itself at once so that its subscriptions go and producers reach the new leader. With no
follower counted (factor 1, or an ISR of the leader alone, which no other replica may
claim) it serves on. A non-reliable partition (memory only) stops with its lease: a claim
may move it to a live node without its old leader's say (leadership.replace_volatile).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Sequence

from prometheus_client import Counter

from danube.bus import Bus
from danube.frame.record import SequenceRun
from danube.ingest import metrics
from danube.ingest.epochs import EpochHistory
from danube.ingest.isr import IsrTracker
from danube.ingest.leader_replicas import LeaderReplicas
from danube.ingest.leadership import (
    NotEnoughReplicasError,
    NotLeaderError,
    Term,
)
from danube.ingest.live import LiveStream
from danube.ingest.message_ids import MessageIds, message_id, plan_ids, read_back
from danube.ingest.nodelease import NodeLease
from danube.ingest.producers import ProducerStates
from danube.ingest.sequencing import (
    SEQUENCE_GAP_WAIT_S,
    Admission,
    Fresh,
    InFlight,
    SequencedBatch,
    SequenceGapError,
    Stored,
    Verdict,
    sequenced_batch,
)
from danube.ingest.wal import Durability, Wal, WalFailedError
from danube.ingest.wal.feed import DurableRun
from danube.ingest.wal.wal import QueuedHook
from danube.meta import MetaStore, TopicName
from danube.runtime.topic_metrics import topic_label
from danube.tasks import TaskSet
from danube.wire.ingest import protocol

log = logging.getLogger(__name__)


class Partition(LeaderReplicas):
    """Leads one partition for one term (epoch); a new term makes a new object."""

    def __init__(
        self,
        name: TopicName,
        wal: Wal,
        term: Term,
        history: EpochHistory,
        *,
        store: MetaStore,
        bus: Bus,
        node_id: str,
        lease: NodeLease,
        lag_max_s: float,
        contact_s: float = 1.0,
        may_shrink: Callable[[], bool] = lambda: True,
        high_watermark: int,
        on_fenced: Callable[[Partition, bool], None],
        on_change: Callable[[], None] = lambda: None,
        producers: ProducerStates | None = None,
    ) -> None:
        self.name = name
        self.wal = wal
        self.term = term
        self.history = history
        self._store = store
        self._bus = bus
        self._node_id = node_id
        self._lease = lease
        # Without the lease, every counted follower must have fetched this recently.
        self.contact_s = contact_s
        # Followers' silence counts against them only while this node's bus round trips
        # succeed (danube.ingest.buswatch): a leader cut from the bus keeps its ISR whole,
        # so that one of them may claim once it gives way.
        self._may_shrink = may_shrink
        self._on_fenced = on_fenced
        self._on_change = on_change  # the ISR changed: the replica reconsiders transfers
        self._transferring: str | None = None  # appends refused: leadership is moving here
        self._inflight = 0  # produces between their checks and their answer
        # The topic's counters of what came in (bound at the first commit).
        self._topic_in: tuple[Counter, Counter] | None = None
        self._progress = asyncio.Event()  # a fetch, a commit or an answer: a transfer looks
        # Every write of the partition's state (ISR changes, completing a reassignment, the
        # hand-over) holds this: each compares on the state's revision, so two at once would
        # make the loser believe its term was over.
        self._state_lock = asyncio.Lock()
        self._leaving: set[str] = set()  # followers that said they stop: out of the ISR
        # The assignment's own cap on catch-up bytes/s (None: the node's alone).
        self.catchup_bytes_s: int | None = None
        self.tracker = _tracker(
            node_id, term, history, lag_max_s, min(high_watermark, wal.durable_next)
        )
        # A produce waits for its commit at most this long: past lag_max_s the laggard
        # leaves the ISR and the watermark moves on without it.
        self.commit_timeout_s = 2 * lag_max_s + 5.0
        self._fenced: str | None = None
        # Idempotent producers: their states come from the log (the replica keeps them
        # across terms); what this term has pending is its own.
        self.admission = Admission(producers if producers is not None else ProducerStates())
        self.message_ids = MessageIds()
        self._ids_lock = asyncio.Lock()  # one read-back of the message ids at a time
        self._hw_event = asyncio.Event()
        self.tasks = self._helpers_owner()
        self._isr_task: asyncio.Task[None] | None = None  # one ISR change at a time
        self.live = self._live_stream(bus)
        self._remove_listener = wal.add_durable_listener(self._on_durable)
        # A failed WAL fences at once, whether or not a produce of ours waits on it (its
        # caller may have been cancelled at its deadline).
        self._remove_failure_listener = wal.add_failure_listener(self._on_wal_failed)
        self._advance()

    def _helpers_owner(self) -> TaskSet:
        """The owner of the leader's helpers (the live stream, the ISR's upkeep and its
        changes; started by danube.ingest.leading, stopped when leading stops). One that
        fails would leave a leader that acknowledges but publishes nothing live, or never
        changes its ISR: it fences instead, and another term starts clean."""
        return TaskSet(
            f"leader of {self.name}",
            on_failure=lambda task, exc: self.fence(f"{task} failed: {exc!r}"),
        )

    def _live_stream(self, bus: Bus) -> LiveStream:
        # Non-reliable (memory) partitions fan out from the live subject: it carries their
        # frames. Reliable ones carry a durable_next wake-up (danube.wire.ingest.protocol).
        return LiveStream(
            self.name,
            bus,
            carries_payloads=self.wal.options.durability is Durability.MEMORY,
            committed=lambda: self.tracker.high_watermark,
            wal_start=lambda: self.wal.start_offset,
            stopped=lambda: self.fenced,
        )

    # --- state -------------------------------------------------------------------------

    @property
    def fenced(self) -> bool:
        return self._fenced is not None

    @property
    def high_watermark(self) -> int:
        """Everything below is durable on every in-sync replica: what readers may see."""
        return self.tracker.high_watermark

    @property
    def isr(self) -> frozenset[str]:
        return self.tracker.isr

    def fence(self, reason: str, *, fatal: bool = False) -> None:
        """Stop acknowledging anything: leadership is gone (lease lost, a new epoch), or
        the WAL failed (``fatal``: the node restarts to reopen it from disk)."""
        if self._fenced is None:
            self._fenced = reason
            log.warning("%s fenced: %s", self.name, reason)
            self._remove_listener()
            self._remove_failure_listener()
            stopped = NotLeaderError(f"{self.name}: not led here any more ({reason})")
            self.admission.clear(stopped)
            self.message_ids.clear(stopped)
            self._hw_event.set()  # wake producers waiting for a commit
            if self._isr_task is not None:
                self._isr_task.cancel()
            self._on_fenced(self, fatal)

    def _on_wal_failed(self, reason: str) -> None:
        # After a failed write or fsync the file's state is unknown ("fsyncgate"): never
        # retry on the same descriptor; the node restarts and recovers from disk.
        self.fence(f"WAL failed: {reason}", fatal=True)

    def _check_leader(self) -> None:
        if self._transferring is not None:
            raise NotLeaderError(
                f"{self.name}: leadership is moving to {self._transferring}; send again"
            )
        if self._fenced is not None:
            raise NotLeaderError(f"{self.name}: not led here any more ({self._fenced})")
        self._check_confirmed()

    def _check_confirmed(self) -> None:
        """Without the node lease: fence unless every counted follower still confirms this
        epoch (see the module docstring)."""
        if self._lease.alive:
            return
        if self.live.carries_payloads:
            # Non-reliable (memory only): a claim may move it to a live node without asking
            # the old one (leadership.replace_volatile), so it stops with its lease.
            self.fence("node lease lost (a non-reliable partition stops with it)")
            raise NotLeaderError(f"{self.name}: this node's lease is lost")
        if not self.tracker.confirmed(time.monotonic(), within_s=self.contact_s):
            metrics.LEASELESS_FENCES.inc()
            self.fence("node lease lost and an in-sync follower stopped confirming this epoch")
            raise NotLeaderError(f"{self.name}: this node's lease is lost")

    def _check_insync(self, when: str) -> None:
        isr, needed = len(self.tracker.isr), self.term.min_insync
        if isr < needed:
            raise NotEnoughReplicasError(
                f"{self.name}: {isr} in-sync replica(s) ({', '.join(sorted(self.tracker.isr))})"
                f" {when}, min_insync_replicas is {needed}"
            )

    # --- produce -----------------------------------------------------------------------

    async def produce(
        self,
        records: Sequence[bytes | memoryview],
        *,
        runs: list[SequenceRun] | None = None,
        message_id_window_s: int | None = None,
    ) -> protocol.ProduceReply:
        """Append ``records`` (a :class:`~danube.frame.batch.FrameBatch`: a produce's
        frames, given their offsets where they lie); answer their offsets once the ISR holds
        them durably.

        An idempotent producer's batch is admitted first (danube.ingest.sequencing): a
        resend is answered with the offsets it was stored at, once committed, and nothing is
        appended (``runs``: its sequenced records as runs, when the request's decoding read
        them already). Unsequenced records with a message id, on a topic with a message id
        window, are checked against the ids stored within it (danube.ingest.message_ids). A
        caller cancelled while it waits leaves the append to finish (the WAL writes what it
        queued; its failure fences through the WAL's failure listener)."""
        self._check_leader()
        self._check_insync("before the append")
        batch = sequenced_batch(records, runs)
        if batch is not None:
            verdict = await self._admitted(batch)
            if not isinstance(verdict, Fresh):
                return await self._resent(verdict, batch)
            entry = verdict.pending
            first = await self._append(
                records,
                lambda first, durable: self.admission.queued(entry, first, durable),
                lambda exc: self.admission.failed(entry, exc),
            )
        elif message_id_window_s is not None and any(ids := [message_id(r) for r in records]):
            return await self._produce_with_ids(records, ids, message_id_window_s)
        else:
            first = await self._append(records)
        return protocol.ProduceReply(first, len(records))

    async def _admitted(self, batch: SequencedBatch) -> Verdict:
        """The admission's verdict on ``batch``; one that arrived before an earlier batch of
        its producer waits for it (at most SEQUENCE_GAP_WAIT_S), then is refused."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + SEQUENCE_GAP_WAIT_S
        while True:
            try:
                return self.admission.admit(batch)
            except SequenceGapError:
                remaining_s = deadline - loop.time()
                if remaining_s <= 0:
                    raise
                await self.admission.gap_closed(batch.producer, remaining_s)
                self._check_leader()

    async def _append(
        self,
        records: Sequence[bytes | memoryview],
        on_queued: QueuedHook | None = None,
        on_failed: Callable[[BaseException], None] | None = None,
    ) -> int:
        """Append ``records``; their first offset once they may be acknowledged."""
        self._inflight += 1
        try:
            try:
                first = await self.wal.append(records, on_queued=on_queued)
            except WalFailedError as exc:  # failed before this append (the listener fenced)
                if on_failed is not None:
                    on_failed(exc)
                self.fence(f"WAL failed: {exc}", fatal=True)
                raise
            except Exception as exc:
                if on_failed is not None:
                    on_failed(exc)
                raise
            await self._acknowledged(first + len(records))
            return first
        finally:
            self._inflight -= 1
            self._progress.set()

    async def _produce_with_ids(
        self, records: Sequence[bytes | memoryview], ids: list[str | None], window_s: int
    ) -> protocol.ProduceReply:
        """:meth:`produce` of records some of which carry a message id: those stored within
        the window (or earlier in this request) are answered with the first one's offset,
        marked; the others are appended."""
        known = self.message_ids
        if known.loaded_window_s is None or known.loaded_window_s < window_s:
            async with self._ids_lock:  # one read-back at a time, once per term and window
                if known.loaded_window_s is None or known.loaded_window_s < window_s:
                    await read_back(self.wal, known, window_s, name=self.name)
                    known.loaded_window_s = window_s
        known.expire(window_s)
        plan = plan_ids(records, ids, known)
        pending = known.pend(plan.fresh_ids)
        if len(plan.fresh) == len(records):  # none stored before: a plain append
            first = await self._append(records, pending.queued, pending.failed)
            return protocol.ProduceReply(first, len(records))
        first = 0
        if plan.fresh:
            first = await self._append(plan.fresh, pending.queued, pending.failed)
        stored = [
            where if isinstance(where, int) else await asyncio.shield(where)
            for kind, where in plan.places
            if kind == "before"
        ]
        listed = plan.listed(first, stored)
        repeats = len(records) - len(plan.fresh)
        self._inflight += 1
        try:
            await self._acknowledged(max(o & ~protocol.DUPLICATE_MARK for o in listed) + 1)
        finally:
            self._inflight -= 1
            self._progress.set()
        metrics.DUPLICATES.inc(repeats)
        return protocol.ProduceReply(
            listed[0] & ~protocol.DUPLICATE_MARK,
            len(records),
            duplicate=repeats == len(records),
            listed=tuple(listed),
        )

    async def _resent(
        self, verdict: Stored | InFlight, batch: SequencedBatch
    ) -> protocol.ProduceReply:
        """Answer a resend with the offsets its batch was stored at, once committed."""
        if isinstance(verdict, Stored):
            first = verdict.first_offset
        else:
            first = await asyncio.shield(verdict.pending.durable) + verdict.skip
        self._inflight += 1
        try:
            await self._acknowledged(first + batch.count)
        finally:
            self._inflight -= 1
            self._progress.set()
        metrics.DUPLICATES.inc(batch.count)
        return protocol.ProduceReply(first, batch.count, duplicate=True)

    async def _acknowledged(self, end: int) -> None:
        """Return once everything below ``end`` may be acknowledged: committed, while this
        node still leads (and, without its lease, its followers confirm it)."""
        if self.tracker.high_watermark < end:  # replicas to wait for (never at factor 1)
            await self._committed(end)
        if self._fenced is not None:  # never acknowledge after leadership is gone
            raise NotLeaderError(f"{self.name}: not led here any more ({self._fenced})")
        leaseless = not self._lease.alive
        self._check_confirmed()
        self._check_insync("after the append (it may be stored; a retry may duplicate)")
        if leaseless:
            metrics.LEASELESS_ACKS.inc()

    async def _committed(self, end: int) -> None:
        deadline = asyncio.get_running_loop().time() + self.commit_timeout_s
        while self.tracker.high_watermark < end:
            if self._fenced is not None:
                raise NotLeaderError(f"{self.name}: not led here any more ({self._fenced})")
            self._hw_event.clear()
            remaining_s = deadline - asyncio.get_running_loop().time()
            if remaining_s <= 0:
                raise NotEnoughReplicasError(
                    f"{self.name}: offsets below {end} not replicated to the ISR "
                    f"({', '.join(sorted(self.tracker.isr))}) in {self.commit_timeout_s:.0f}s"
                )
            if not self._lease.alive:  # look at the followers at least every contact_s
                self._check_confirmed()
                remaining_s = min(remaining_s, self.contact_s)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(remaining_s):
                    await self._hw_event.wait()

    def _advance(self) -> None:
        before = self.tracker.high_watermark
        if self.tracker.advance(self.wal.durable_next) > before:
            self._hw_event.set()
            self.live.committed_moved()
            self._progress.set()

    @property
    def under_replicated(self) -> bool:
        return len(self.tracker.isr) < len(self.term.replicas)

    def max_follower_lag(self) -> int:
        lags = self.tracker.lag(self.wal.durable_next).values()
        return max((lag for lag in lags if lag is not None), default=0)

    def stats(self) -> dict[str, object]:
        end = self.wal.durable_next
        return {
            "leader_epoch": self.term.epoch,
            "high_watermark": self.high_watermark,
            "replicas": list(self.term.replicas),
            "isr": [n for n in self.term.replicas if n in self.tracker.isr],
            "min_insync_replicas": self.term.min_insync,
            "followers": {
                node: {"end": view.end, "lag": lag}
                for (node, view), lag in zip(
                    sorted(self.tracker.followers.items()),
                    self.tracker.lag(end).values(),
                    strict=True,
                )
            },
        }

    # --- committed batches --------------------------------------------------------------

    def _on_durable(self, run: DurableRun) -> None:
        self._advance()
        # Counted two loop steps later: the producers this commit answers resume in the next
        # step and nats-py's flusher writes their replies in the one after; the counters,
        # run cold after an idle spell, cost more than the rest of this callback.
        loop = asyncio.get_running_loop()
        loop.call_soon(loop.call_soon, self._count_durable, len(run.payloads), run.payload_bytes)
        self.live.offer(run)

    def _count_durable(self, count: int, size_bytes: int) -> None:
        metrics.APPENDED_MESSAGES.inc(count)
        metrics.APPENDED_BYTES.inc(size_bytes)
        if self._topic_in is None:  # the topic's series, looked up once per term
            topic = topic_label(self.name)
            self._topic_in = (
                metrics.TOPIC_MESSAGES_IN.labels(topic),
                metrics.TOPIC_BYTES_IN.labels(topic),
            )
        self._topic_in[0].inc(count)
        self._topic_in[1].inc(size_bytes)
        metrics.BATCH_MESSAGES.observe(count)


def _tracker(
    node_id: str, term: Term, history: EpochHistory, lag_max_s: float, high_watermark: int
) -> IsrTracker:
    """The ISR of a new term, counted from its epoch's start."""
    return IsrTracker(
        node_id,
        term.replicas,
        term.isr,
        lag_max_s=lag_max_s,
        epoch_start=history.entries[-1][1] if history.entries else 0,
        high_watermark=high_watermark,
        now_s=time.monotonic(),
    )

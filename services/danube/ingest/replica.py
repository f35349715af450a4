"""This node's copy of one partition: its WAL and epoch history, and its role in the
partition's replication (leader, follower, or waiting), reconciled against etcd.

One task per replica (:meth:`Replica.run`) reads the partition's keys whenever the node's
watch sees them change (or every poll period), asks danube.ingest.roles what to do and does
it. The replica owns its WAL for its whole life; as leader it lends it to a
:class:`~danube.ingest.partition.Partition` and serves the partition's subjects, as follower
it runs :mod:`danube.ingest.fetcher`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import shutil
import time
from pathlib import Path
from typing import Literal

from danube.bus import Responder
from danube.ingest import epochs, leadership, metrics
from danube.ingest.context import NodeContext as NodeContext
from danube.ingest.context import contact_s as contact_s
from danube.ingest.copies import serve_copy_reads
from danube.ingest.epochs import EpochHistory
from danube.ingest.fetcher import Fetcher
from danube.ingest.leading import LeaderActs, Leading
from danube.ingest.partition import Partition
from danube.ingest.producer_tracking import ProducerTracking
from danube.ingest.producers import ProducerStates
from danube.ingest.repairs import Repairer, in_sync_peers
from danube.ingest.roles import Act, Decision, decide
from danube.ingest.wal import Durability, Wal, WalOptions
from danube.ingest.wal.truncate import truncate_dir
from danube.meta import TopicName
from danube.meta import keys as meta_keys
from danube.meta.backoff import backoff_s
from danube.meta.records import Assignment, TopicConfig
from danube.tasks import TaskSet
from danube.wire.ingest import protocol
from danube.wire.sizes import RECORD_OVERHEAD_BYTES

log = logging.getLogger(__name__)

# Frame bytes accepted but not yet durable, per partition: producers wait beyond it.
PENDING_BYTES_MIN = 64 * 1024 * 1024
_POLL_S = 1.0  # re-read etcd at least this often while no leader is known (a safety net)
# A replica with a role (leading, following) re-reads its keys this often besides the node's
# watch, which wakes it on every change (and re-reads after a compaction): a safety net,
# jittered so that a node's replicas, started together, do not read together. Each read is
# an etcd range per replica: at 5 s, 300 idle partitions cost ingest and etcd ~5 % of a core
# each (docs/performance.md).
_IDLE_POLL_S = 30.0
_IDLE_JITTER = 0.2
# A leader with a move to make (a reassignment under way, a preferred leader catching up)
# looks again this often besides the wake-ups of ISR changes and etcd.
_MOVING_POLL_S = 0.5
_LEAVE_TIMEOUT_S = 2.0


class Replica(LeaderActs):
    """One partition's copy on this node. Create, then run :meth:`run` as a task."""

    def __init__(self, name: TopicName, directory: Path, ctx: NodeContext) -> None:
        self.name = name
        self.directory = directory
        self.ctx = ctx
        self.wal: Wal | None = None
        self.history: EpochHistory | None = None
        self.high_watermark = 0  # as last heard from a leader (or computed as one)
        self.leading: Leading | None = None
        self._fetcher: Fetcher | None = None
        self._follow_task: asyncio.Task[None] | None = None
        # The follower's fetcher. One that fails is dropped, and the next reconcile (at its
        # poll: a failure that comes back at once does not spin) follows afresh.
        self._tasks = TaskSet(f"replica {name}", on_failure=lambda *_: self._lost_fetcher())
        self._wake = asyncio.Event()
        self._stopped = False
        self._release = False
        # Why this copy is deleted when it closes: "retired" (a reassignment moved the
        # partition away), "deleted" (its topic was deleted); None: kept.
        self._discard: Literal["retired", "deleted"] | None = None
        self._assignment: Assignment | None = None  # as last read
        self._next_leading: asyncio.Future[None] | None = None
        # A truncation (the WAL closed and cut) and a repair's rewrite never run together.
        self._wal_lock = asyncio.Lock()
        self.repairer = Repairer(
            name,
            ctx.bus,
            wal=lambda: self.wal,
            committed_end=self.committed_end,
            peers=lambda: in_sync_peers(ctx.store, name, ctx.node_id, self.partition),
            on_change=self.kick,
            guard=self._wal_lock,
            held=self._repair_held,
            directory=directory,
        )
        self._leaderless_since_ms: int | None = None  # when this replica saw no leader
        # A damaged leader's hand-over failed: it repairs while it leads instead.
        self._damaged_hand_over_failed = False
        self._copy_reads: Responder | None = None
        self._owner_gone_s: float | None = None  # since when the owner key is seen absent
        ingest = ctx.settings.ingest
        # Idempotent producers as this copy's log knows them (across terms and roles).
        self.producers = ProducerTracking(
            directory,
            ProducerStates(idle_s=ingest.producer_idle_s, producers_max=ingest.producer_states_max),
        )

    @property
    def partition(self) -> Partition | None:
        """The partition as led here, if this node leads it."""
        return None if self.leading is None else self.leading.partition

    def kick(self) -> None:
        """Something about the partition changed in etcd: reconcile now."""
        self._wake.set()

    def next_leading(self) -> asyncio.Future[None]:
        """Done when this replica next starts leading, its handlers serving (a claim
        request waits on it rather than polling etcd; never done if it does not lead)."""
        if self._next_leading is None:
            self._next_leading = asyncio.get_running_loop().create_future()
        return self._next_leading

    # --- the reconcile loop --------------------------------------------------------------

    async def run(self) -> None:
        """Open the WAL, then follow etcd until the node is no replica any more (or the
        task is cancelled); close everything on the way out."""
        try:
            failures = 0
            loaded = False  # the damaged offsets an earlier run kept
            while (self.wal is None or self._copy_reads is None) and not self._stopped:
                try:
                    if self.wal is None:
                        await self._open()
                    if not loaded:
                        await self.repairer.load()
                        loaded = True
                    self._copy_reads = await serve_copy_reads(
                        self.ctx.bus,
                        self.name,
                        self.ctx.node_id,
                        wal=lambda: self.wal,
                        committed_end=self.committed_end,
                        on_damage=self.repairer.report,
                    )
                except Exception as exc:  # etcd (the topic's durability), the disk, the bus
                    failures += 1
                    log.warning("%s: opening the replica failed: %s", self.name, exc)
                    await asyncio.sleep(backoff_s(failures - 1, base_s=0.1, cap_s=5.0))
            failures = 0
            while not self._stopped:
                try:
                    wait_s = await self._step()
                    failures = 0
                except Exception as exc:  # etcd, the bus or the WAL failed: try again, capped
                    failures += 1
                    log.warning("%s: replica step failed: %s", self.name, exc)
                    wait_s = backoff_s(failures - 1, base_s=0.05, cap_s=2.0)
                if wait_s is None:
                    continue
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(wait_s):
                        await self._wake.wait()
                self._wake.clear()
        finally:
            await self.close(release=self._release)

    def stop(self, *, release: bool, deleted: bool = False) -> None:
        """Make :meth:`run` end (``release``: hand leadership on at once; ``deleted``: the
        topic is gone, so the copy is removed as it closes, with no snapshot written for
        the next start); await the task."""
        self._stopped = True
        self._release = release
        if deleted:
            self._discard = "deleted"
        self.kick()

    async def _step(self) -> float | None:
        """One reconcile; returns how long to wait before the next (None: at once)."""
        ctx = self.ctx
        await self.producers.upkeep(self.wal)
        if self.leading is not None and ctx.bus_lost:
            await self._give_way_bus_lost()
        if self.leading is not None and self.leading.partition.fenced:
            await self._stop_leading()  # its subscriptions go now, whatever etcd says
        if not ctx.lease.alive:
            # etcd is away (or was, and the session takes a new lease: it kicks us then).
            # Leaders serve on by their followers' confirmation (Partition), followers
            # follow on; nothing here may write etcd.
            return _MOVING_POLL_S
        view = await leadership.read(ctx.store, self.name)
        self._assignment = view.assignment
        leading_epoch = None if self.leading is None else self.leading.partition.term.epoch
        following = None if self._fetcher is None else self._fetcher.epoch
        now_ms = int(time.time() * 1000)
        if view.owner is not None or self.leading is not None:
            self._leaderless_since_ms = None
        elif self._leaderless_since_ms is None:
            self._leaderless_since_ms = now_ms
        decision = decide(
            ctx.node_id,
            view,
            leading_epoch=leading_epoch,
            following_epoch=following,
            has_history=self.history is not None,
            now_ms=now_ms,
            damaged=self.repairer.damaged,
            leaderless_ms=now_ms - (self._leaderless_since_ms or now_ms),
            leader_heard=self._leader_heard(view),
        )
        return await self._act(decision, view, leading_epoch)

    async def _act(
        self, decision: Decision, view: leadership.PartitionView, leading_epoch: int | None
    ) -> float | None:
        """Carry out ``decision``; how long to wait before the next reconcile."""
        ctx = self.ctx
        act = decision.act
        if act is Act.HOLD:
            return _MOVING_POLL_S  # its owner key comes back, or the grace runs out
        if act is Act.RECLAIM:
            assert self.leading is not None
            led = self.leading.partition.term
            if await leadership.reclaim(ctx.store, ctx.node_id, ctx.lease, led, view):
                metrics.RECLAIMS.inc()
                return _idle_poll_s()
            return None  # the term is over, or the view stale: read again
        if act in (Act.STOP, Act.RETIRE):
            log.info("%s: not a replica here any more", self.name)
            self._stopped = True
            if act is Act.RETIRE:
                self._discard = "retired"
            elif view.assignment is None:  # its topic was deleted: the copy goes too,
                self._discard = "deleted"  # whether or not the bus's wal.delete comes
            return None
        if act is Act.KEEP:
            if self.leading is not None:
                return await self._lead(view)
            return _idle_poll_s()
        if act is Act.DEMOTE:
            self._demote(f"epoch {leading_epoch} is over")
            await self._stop_leading()
            return None
        if act is Act.FOLLOW:
            assert decision.leader is not None
            assert decision.epoch is not None
            await self._stop_following()
            self._start_following(decision.leader, decision.epoch)
            return _idle_poll_s()
        await self._stop_following()
        if act is Act.RESTART:
            assert view.state is not None
            assert view.state.restart_at is not None
            await self._restart_log(view.state.restart_at)
        if act in (Act.CLAIM, Act.RESTART):
            if ctx.bus_lost:
                return _MOVING_POLL_S  # no request would reach us: leave it to the others
            assert self.wal is not None
            term = await leadership.claim(
                ctx.store, ctx.node_id, ctx.lease, self.name, view, log_end=self.wal.next_offset
            )
            if term is None:
                return None  # lost a race: read again
            await self._start_leading(term)
            return _idle_poll_s()
        if act is Act.DELETE_STALE_OWNER:
            log.info("%s: deleting the owner key of an earlier incarnation", self.name)
            await leadership.delete_stale_owner(ctx.store, ctx.node_id, self.name, view)
            return None
        return _POLL_S  # WAIT: no leader we may follow or become

    def _leader_heard(self, view: leadership.PartitionView) -> bool:
        """Whether the leader this replica follows answers it lately while its owner key
        has been gone for less than the grace period (Act.HOLD)."""
        now_s = time.monotonic()
        if view.owner is not None:
            self._owner_gone_s = None
            return False
        if self._owner_gone_s is None:
            self._owner_gone_s = now_s
        fetcher = self._fetcher
        return (
            fetcher is not None
            and fetcher.heard_within(self.ctx.contact_s, now_s)
            and now_s - self._owner_gone_s < self.ctx.reclaim_grace_s
        )

    async def _lead(self, view: leadership.PartitionView) -> float | None:
        """A leader's step besides keeping its term: take the replica set as etcd holds it,
        complete a reassignment whose target set is in sync, and hand leadership over when
        this node leaves the set or the preferred leader is in sync (docs/replication.md,
        "Moving partitions")."""
        assert self.leading is not None
        assert view.assignment is not None
        partition, assignment = self.leading.partition, view.assignment
        ingest = self.ctx.settings.ingest
        partition.set_assignment(assignment)
        if not self.repairer.damaged:
            self._damaged_hand_over_failed = False
        elif not self._damaged_hand_over_failed:
            if await self._hand_over_damaged(partition, assignment):
                await self._stop_leading()
                return None
            self._damaged_hand_over_failed = True  # repair here (Repairer is held till now)
        if assignment.moving and await partition.complete(assignment, view.assignment_rev):
            return None  # read the new assignment back
        to = partition.transfer_target(assignment, settle_s=ingest.preferred_leader_settle_s)
        if to is not None:
            # A node that leaves the set, or stops, does not stay in the ISR it hands over.
            stays = self.ctx.node_id in assignment.target and not self._stopped
            timeout_s = ingest.transfer_timeout_s
            if await partition.transfer(to, timeout_s=timeout_s, stays=stays):
                await self._stop_leading()
                return None
            return _MOVING_POLL_S
        # Look again soon while a move waits on time (a copy catching up, a preferred leader
        # settling in the ISR); ISR changes wake this replica anyway.
        preferred = assignment.preferred
        settling = preferred != self.ctx.node_id and preferred in partition.isr
        if assignment.moving or settling:
            return _MOVING_POLL_S
        return _idle_poll_s()

    # --- the WAL ---------------------------------------------------------------------------

    async def _open(self) -> None:
        settings = self.ctx.settings
        durability = await self._durability()
        max_message_bytes = settings.ingest.max_message_bytes + RECORD_OVERHEAD_BYTES
        self._options = WalOptions.from_config(
            settings.wal_cloud.wal,
            durability,
            max_frame_payload_bytes=max_message_bytes,
            max_pending_bytes=max(PENDING_BYTES_MIN, 2 * max_message_bytes),
        )
        await asyncio.to_thread(self.directory.mkdir, parents=True, exist_ok=True)
        self.wal = await Wal.open(self.directory, self._options, file_ops=self.ctx.file_ops)
        await self.producers.opened(self.wal)
        history = await asyncio.to_thread(epochs.load, self.directory)
        if history is not None:
            # A crash during a truncation may leave entries past the log's end: drop them.
            history = EpochHistory(
                tuple(e for e in history.entries if e[1] <= self.wal.next_offset)
            )
        self.history = history

    async def _durability(self) -> Durability:
        config = await self.ctx.store.get_model(meta_keys.topic_key(self.name.parent), TopicConfig)
        if config is None or (config.dispatch == "reliable" and config.durability == "fsync"):
            return Durability.FSYNC
        if config.dispatch == "non_reliable":
            return Durability.MEMORY
        return Durability.INTERVAL

    async def truncate(self, end: int) -> int:
        """Cut the log to end before ``end`` (close, cut the files, reopen); return how many
        messages went. Only while following: nothing else uses the WAL then."""
        async with self._wal_lock:
            return await self._truncate(end)

    async def _truncate(self, end: int) -> int:
        assert self.leading is None
        assert self.wal is not None
        if end >= self.wal.next_offset:
            return 0
        await self.wal.close()
        try:
            removed = await asyncio.to_thread(
                truncate_dir,
                self.ctx.file_ops,
                self.directory,
                end,
                max_payload_bytes=self._options.max_frame_payload_bytes,
            )
        finally:
            self.wal = await Wal.open(self.directory, self._options, file_ops=self.ctx.file_ops)
            await self.producers.opened(self.wal)
        if self.history is not None:
            await self.store_history(self.history.truncated(end))
        metrics.TRUNCATED_MESSAGES.inc(removed)
        log.warning("%s: truncated %d messages at and past %d", self.name, removed, end)
        return removed

    async def _restart_log(self, offset: int) -> None:
        """An operator's unclean move: make this log empty at ``offset``, with no history
        (whatever it held is given up; the new leader's history starts at ``offset``)."""
        wal = self.wal
        assert wal is not None
        if self.history is None and wal.start_offset == wal.next_offset == offset:
            return  # done already (a claim lost to another replica of the new set)
        if wal.next_offset > 0:
            await self.truncate(0)
        self.history = None
        await asyncio.to_thread(epochs.remove, self.directory)
        self.producers.started_over()
        assert self.wal is not None
        await self.wal.advance_to(offset)
        log.warning("%s: unclean move: the log starts over, empty, at %d", self.name, offset)

    async def store_history(self, history: EpochHistory) -> None:
        """Make ``history`` this replica's, durably, before anything it describes is written."""
        if history != self.history:
            await asyncio.to_thread(epochs.store, self.directory, history)
            self.history = history

    # --- other copies: reads around damage, repair ------------------------------------------

    def committed_end(self) -> int:
        """The high watermark this replica knows: its own as leader, else as last heard."""
        partition = self.partition
        return self.high_watermark if partition is None else partition.high_watermark

    @property
    def copy_damaged(self) -> bool:
        """Whether this copy holds a damaged range not repaired yet (it tells its leader:
        it is not handed leadership before it repaired)."""
        return self.repairer.damaged

    # --- following -------------------------------------------------------------------------

    def _start_following(self, leader: str, epoch: int) -> None:
        self._fetcher = Fetcher(self, leader, epoch)
        self._follow_task = self._tasks.spawn(
            self._fetcher.run(), name=f"follow-{self.name}-{epoch}"
        )
        metrics.FOLLOWING.inc()

    async def _stop_following(self) -> None:
        task, self._follow_task, self._fetcher = self._follow_task, None, None
        if task is not None:
            await self._tasks.cancel(task, timeout_s=10.0)
            metrics.FOLLOWING.dec()

    def _lost_fetcher(self) -> None:
        self._fetcher = None  # following no epoch now (its task is reaped when one starts)

    def follow_ended(self) -> None:
        """The fetcher gave up on its epoch (the leader moved on): reconcile."""
        self._fetcher = None
        self.kick()

    # --- the end -----------------------------------------------------------------------------

    async def close(self, *, release: bool = False) -> None:
        """Stop every role and close the WAL. ``release`` (a clean shutdown): hand
        leadership to an in-sync follower first, or at least delete the owner key so
        another may claim at once; as a follower, leave the ISR."""
        leading = self.leading
        if release and leading is not None and self.ctx.lease.alive:
            await self._hand_over_for_shutdown(leading.partition)
            leading = self.leading
        await self._stop_leading()  # no acknowledgement after this: then hand over
        if release and leading is not None and self.ctx.lease.alive:
            try:
                await leadership.release(
                    self.ctx.store, self.ctx.node_id, self.name, leading.partition.term.epoch
                )
            except Exception as exc:
                log.warning("could not release %s: %s", self.name, exc)
        await self._stop_following()
        if self._copy_reads is not None:
            await self._copy_reads.drain()
            self._copy_reads = None
        await self.repairer.stop()
        if release and self.ctx.lease.alive and self._discard is None:
            # Whether it followed or had just handed leadership over (its successor may
            # count it in the ISR): out of the ISR now, not after replica_lag_max_s.
            await self._leave_isr()
        if self.wal is not None:
            if self._discard is None:
                await self.producers.snapshot(self.wal)  # a restart reads no log to rebuild
            await self.wal.close()
        self.producers.closed()
        if self._discard is not None:
            await asyncio.to_thread(shutil.rmtree, self.directory, True)
        if self._discard == "retired":
            metrics.RETIRED_COPIES.inc()
            log.info("%s: moved away by a reassignment; local copy deleted", self.name)

    async def _leave_isr(self) -> None:
        """Ask the leader to take this node out of the ISR now (its commits would wait
        ``replica_lag_max_s`` for it otherwise); best effort."""
        bus = self.ctx.bus
        try:
            await bus.request(
                bus.subjects.repl_leave(self.name),
                protocol.encode_node(self.ctx.node_id),
                timeout_s=_LEAVE_TIMEOUT_S,
            )
        except Exception as exc:  # no leader now, or it is slow: it shrinks the ISR later
            log.info("%s: could not leave the ISR at once: %s", self.name, exc)


def _idle_poll_s() -> float:
    return _IDLE_POLL_S * random.uniform(1 - _IDLE_JITTER, 1 + _IDLE_JITTER)

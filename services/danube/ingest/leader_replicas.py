"""A partition leader's dealings with the partition's other replicas, as a mix-in of
:class:`~danube.ingest.partition.Partition`: followers' fetches, the ISR kept and its
changes written to etcd (before they count), a new replica set taken, a reassignment
completed, a follower's removal, and leadership handed over.

**Moving leadership** (docs/replication.md, "Moving partitions"): :meth:`transfer` stops
taking appends (new produces are answered ``not_owner`` at once: retriable, the client
retries and reaches the new leader), waits until the chosen in-sync follower holds the whole
log and every produce under way is answered, then writes the hand-over
(danube.ingest.leadership.hand_over) and fences itself; the follower's claim follows.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from danube.ingest import metrics
from danube.ingest.isr import IsrTracker
from danube.ingest.leadership import (
    NotLeaderError,
    Term,
    complete_reassignment,
    hand_over,
    update_isr,
)
from danube.ingest.wal import Wal
from danube.meta import MetaStore, TopicName
from danube.meta.records import Assignment
from danube.tasks import TaskSet

log = logging.getLogger(__name__)


class LeaderReplicas:
    """The replica acts of a :class:`~danube.ingest.partition.Partition` (which holds the
    state declared here)."""

    name: TopicName
    wal: Wal
    term: Term
    tracker: IsrTracker
    tasks: TaskSet
    catchup_bytes_s: int | None
    _store: MetaStore
    _node_id: str
    _may_shrink: Callable[[], bool]
    _on_change: Callable[[], None]
    _transferring: str | None
    _inflight: int
    _progress: asyncio.Event
    _state_lock: asyncio.Lock
    _leaving: set[str]
    _isr_task: asyncio.Task[None] | None

    if TYPE_CHECKING:

        @property
        def fenced(self) -> bool: ...

        def fence(self, reason: str, *, fatal: bool = False) -> None: ...

        def _advance(self) -> None: ...

    # --- followers -----------------------------------------------------------------------

    def on_follower_fetch(self, node: str, fetch_offset: int, *, damaged: bool = False) -> None:
        """Follower ``node`` holds everything below ``fetch_offset`` durably (``damaged``:
        its copy holds a range it has not repaired yet: it may not be handed leadership)."""
        self._leaving.discard(node)  # fetching again: a new incarnation of a node that left
        now_s = time.monotonic()
        self.tracker.on_fetch(node, fetch_offset, self.wal.durable_next, now_s, damaged=damaged)
        self._advance()
        self._progress.set()
        if self._transferring is not None:
            return  # the ISR stays as the hand-over will write it
        if self.tracker.to_expand() and self._isr_task is None and not self.fenced:
            self._start_isr_change()

    async def maintain_isr(self) -> None:
        """Shrink the ISR of followers that stopped keeping up, until cancelled."""
        period_s = max(0.05, self.tracker.lag_max_s / 4)
        while True:  # ends by cancellation only (its owner reports any other end)
            await asyncio.sleep(period_s)
            if self.fenced:
                continue  # the replica stops leading and cancels this soon
            shrink = self.tracker.to_shrink(time.monotonic())
            if shrink and not self._may_shrink():
                continue
            if shrink and self._isr_task is None and self._transferring is None:
                self._start_isr_change()

    def _start_isr_change(self) -> asyncio.Task[None]:
        self._isr_task = self.tasks.spawn(self._change_isr(), name=f"isr-change-{self.name}")
        return self._isr_task

    async def _change_isr(self) -> None:
        try:
            async with self._state_lock:
                now = time.monotonic()
                tracker = self.tracker
                lagging = tracker.to_shrink(now) if self._may_shrink() else frozenset()
                out = lagging | self._leaving
                isr = (tracker.isr - out) | (tracker.to_expand() - out)
                if (isr == tracker.isr and not tracker.pending) or self.fenced:
                    return
                ordered = tuple(n for n in self.term.replicas if n in isr)
                # Counted before the write: etcd may hold the addition even if its answer
                # is lost, and a new leader may then be chosen from it (isr.py).
                tracker.expanding(ordered)
                await update_isr(self._store, self._node_id, self.term, ordered)
                change = "shrink" if len(ordered) < len(tracker.isr) else "expand"
                tracker.set_isr(ordered, time.monotonic())
            metrics.ISR_CHANGES.labels(change).inc()
            self._advance()
            self._on_change()
        except NotLeaderError as exc:
            self.fence(str(exc))
        except Exception as exc:  # etcd down: the next check tries again
            log.warning("%s: ISR change failed: %s", self.name, exc)
        finally:
            self._isr_task = None

    # --- moving leadership and replicas ---------------------------------------------------

    def set_assignment(self, assignment: Assignment) -> None:
        """Take the partition's replica set as etcd holds it now (a reassignment added or
        removed replicas): followed replicas and ``min_insync_replicas`` follow it."""
        replicas = assignment.replicas
        self.catchup_bytes_s = assignment.catchup_bytes_s
        if (
            replicas == self.term.replicas
            and assignment.min_insync_replicas == self.term.min_insync
        ):
            return
        self.term.replicas = replicas
        self.term.min_insync = assignment.min_insync_replicas
        self.tracker.set_replicas(replicas, time.monotonic())
        log.info("%s: replicas now %s", self.name, ", ".join(replicas))

    def transfer_target(self, assignment: Assignment, *, settle_s: float) -> str | None:
        """To whom leadership should move now, if anyone: the first ready replica of the
        target set when this node leaves it; else the preferred leader once it has been in
        sync for ``settle_s``."""
        now_s = time.monotonic()
        me = self._node_id
        if me not in assignment.target:
            for node in assignment.target:
                if self.tracker.ready_to_lead(node, now_s, settle_s=0.0):
                    return node
            return None
        preferred = assignment.preferred
        if preferred != me and self.tracker.ready_to_lead(preferred, now_s, settle_s=settle_s):
            return preferred
        return None

    async def complete(self, assignment: Assignment, assignment_rev: int) -> bool:
        """End a reassignment whose target set is in sync and led here; whether it ended."""
        if not assignment.moving or self._node_id not in assignment.target:
            return False
        async with self._state_lock:
            if not set(assignment.target) <= self.tracker.isr or self.fenced:
                return False
            done = await complete_reassignment(
                self._store, self._node_id, self.term, assignment, assignment_rev
            )
            if done is None:
                return False
            self.set_assignment(done)
            self.tracker.set_isr(self.term.isr, time.monotonic())
        self._advance()
        metrics.REASSIGNMENTS_COMPLETED.inc()
        return True

    async def transfer(self, to: str, *, timeout_s: float, stays: bool = False) -> bool:
        """Hand leadership to follower ``to`` (see the module docstring); whether it was.
        Appends are refused meanwhile; when ``to`` does not hold the whole log within
        ``timeout_s`` the transfer is abandoned and appends resume. ``stays``: this node
        remains a replica (it follows ``to`` at once and stays in the ISR)."""
        if self.fenced or to not in self.tracker.followers:
            return False
        loop = asyncio.get_running_loop()
        started = loop.time()
        deadline = started + timeout_s
        self._transferring = to
        try:
            while True:
                end = self.wal.next_offset
                view = self.tracker.followers.get(to)
                if self.fenced or view is None or to not in self.tracker.isr:
                    metrics.TRANSFERS.labels("abandoned").inc()
                    return False
                held = view.end is not None and view.end >= end and self.wal.durable_next >= end
                settled = self.tracker.high_watermark >= end and self._inflight == 0
                if held and (settled or loop.time() >= deadline):
                    break  # past the deadline, producers still waiting get not_owner
                if loop.time() >= deadline:
                    log.info("%s: transfer to %s abandoned: it did not catch up", self.name, to)
                    metrics.TRANSFERS.labels("abandoned").inc()
                    return False
                self._progress.clear()
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(min(0.05, max(0.0, deadline - loop.time()))):
                        await self._progress.wait()
            async with self._state_lock:
                handed = not self.fenced and await hand_over(
                    self._store, self._node_id, self.term, to, stays=stays
                )
            if not handed:
                metrics.TRANSFERS.labels("fenced").inc()
                self.fence("its term ended during a transfer")
                return False
            metrics.TRANSFER_PAUSE_SECONDS.observe(loop.time() - started)
            metrics.TRANSFERS.labels("done").inc()
            self.fence(f"leadership handed to {to}")
            return True
        finally:
            self._transferring = None

    async def remove_follower(self, node: str, *, timeout_s: float = 5.0) -> bool:
        """Follower ``node`` is stopping (a clean shutdown): take it out of the ISR now,
        instead of after ``replica_lag_max_s`` without a fetch; whether it is out."""
        if node == self._node_id:
            return False
        self._leaving.add(node)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while node in self.tracker.isr and not self.fenced and loop.time() < deadline:
            changing = self._isr_task or self._start_isr_change()
            await asyncio.wait({changing}, timeout=max(0.0, deadline - loop.time()))
            if node in self.tracker.isr:
                await asyncio.sleep(0.05)  # etcd refused for now: the next try backs off
        return node not in self.tracker.isr

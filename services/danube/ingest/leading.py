"""A replica's acts as leader, as a mix-in of :class:`~danube.ingest.replica.Replica`:
start leading (a :class:`~danube.ingest.partition.Partition` and its handlers), stop
leading, give way when the bus is lost, and hand leadership over to an intact in-sync
replica (a damaged copy's hand-over before it repairs, a clean shutdown's). The reconcile
loop that decides when (danube.ingest.replica) stays with the replica."""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from danube.bus import Responder
from danube.ingest import leadership, metrics
from danube.ingest.context import NodeContext
from danube.ingest.epochs import EpochHistory
from danube.ingest.handlers import PartitionHandlers
from danube.ingest.partition import Partition
from danube.ingest.producer_tracking import ProducerTracking
from danube.ingest.repairs import Repairer
from danube.ingest.wal import Wal
from danube.meta import TopicName
from danube.meta.records import Assignment
from danube.tasks import TaskSet

log = logging.getLogger(__name__)


@dataclass
class Leading:
    partition: Partition
    handlers: PartitionHandlers  # its requests, from the bus or the data door
    responders: list[Responder]
    tasks: TaskSet  # the leader's helpers: one that fails ends the leadership


class LeaderActs:
    """The leader's acts of a :class:`~danube.ingest.replica.Replica` (which holds the
    state declared here)."""

    name: TopicName
    ctx: NodeContext
    wal: Wal | None
    history: EpochHistory | None
    high_watermark: int
    leading: Leading | None
    repairer: Repairer
    producers: ProducerTracking
    _stopped: bool
    _assignment: Assignment | None
    _next_leading: asyncio.Future[None] | None
    _damaged_hand_over_failed: bool

    if TYPE_CHECKING:

        def kick(self) -> None: ...

        async def store_history(self, history: EpochHistory) -> None: ...

        @property
        def partition(self) -> Partition | None: ...

    def _intact_target(self, partition: Partition) -> str | None:
        """An in-sync replica ready to lead (not damaged itself), the target set first."""
        assignment = self._assignment
        order = [*(assignment.target if assignment else ()), *partition.term.replicas]
        return partition.tracker.first_ready(order, time.monotonic())

    def _repair_held(self) -> bool:
        """A damaged leader hands leadership to an intact replica before it repairs (as a
        follower); with nobody to hand it to, it repairs while it leads."""
        partition = self.partition
        if partition is None or self._damaged_hand_over_failed:
            return False
        return self._intact_target(partition) is not None

    async def _hand_over_damaged(self, partition: Partition, assignment: Assignment) -> bool:
        """This leader's copy is damaged: hand leadership to an intact in-sync replica
        (it stays a replica and repairs its copy as a follower); whether it was handed."""
        to = self._intact_target(partition)
        if to is None:
            return False
        log.warning(
            "%s: this copy is damaged at offset %s; handing leadership to %s",
            self.name,
            self.repairer.lowest,
            to,
        )
        stays = self.ctx.node_id in assignment.target and not self._stopped
        timeout_s = self.ctx.settings.ingest.transfer_timeout_s
        return await partition.transfer(to, timeout_s=timeout_s, stays=stays)

    async def _start_leading(self, term: leadership.Term) -> None:
        ctx, wal = self.ctx, self.wal
        assert wal is not None
        history = (self.history or EpochHistory()).with_epoch(term.epoch, wal.next_offset)
        await self.store_history(history)
        partition = Partition(
            self.name,
            wal,
            term,
            history,
            store=ctx.store,
            bus=ctx.bus,
            node_id=ctx.node_id,
            lease=ctx.leases,
            lag_max_s=ctx.settings.ingest.replica_lag_max_s,
            contact_s=ctx.contact_s,
            may_shrink=ctx.bus_fresh,
            high_watermark=self.high_watermark,
            on_fenced=self._on_fenced,
            on_change=self.kick,
            producers=self.producers.states,
        )
        handlers = PartitionHandlers(
            partition,
            ctx.settings,
            node_id=ctx.node_id,
            store=ctx.store,
            catchup=ctx.catchup,
            on_damage=self.repairer.report,
            links=ctx.links,
        )
        responders = await handlers.serve(ctx.bus)
        tasks = partition.tasks  # one that fails fences the partition
        tasks.spawn(partition.live.run(), name=f"live-{self.name}")
        tasks.spawn(partition.maintain_isr(), name=f"isr-{self.name}")
        self.leading = Leading(partition, handlers, responders, tasks)
        metrics.LEADER_ELECTIONS.inc()
        started, self._next_leading = self._next_leading, None
        if started is not None and not started.done():
            started.set_result(None)

    async def _give_way_bus_lost(self) -> None:
        """This node lost the bus (danube.ingest.buswatch): acknowledge nothing more, then
        delete the owner key of this epoch so an in-sync follower claims now rather than
        when the cut ends (without the lease, etcd away too, the key lapses with it). The
        subscriptions go last and without a drain: a drain's flush waits on the lost link."""
        assert self.leading is not None
        epoch = self.leading.partition.term.epoch
        self.leading.partition.fence("the bus is lost: no request reaches this leader")
        metrics.BUS_LOST_RESIGNATIONS.inc()
        if self.ctx.lease.alive:
            try:
                await leadership.release(self.ctx.store, self.ctx.node_id, self.name, epoch)
            except Exception as exc:  # etcd: the key lapses with the lease instead
                log.warning("%s: could not release epoch %d: %s", self.name, epoch, exc)
        await self._stop_leading(drain=False)

    def _on_fenced(self, partition: Partition, fatal: bool) -> None:
        if fatal:
            self.ctx.on_fatal()
        self.kick()

    def _demote(self, reason: str) -> None:
        if self.leading is not None:
            self.leading.partition.fence(reason)

    async def _stop_leading(self, *, drain: bool = True) -> None:
        """Stop serving the partition (``drain``: answer the requests taken first)."""
        leading, self.leading = self.leading, None
        if leading is None:
            return
        leading.partition.fence("stopped leading")
        self.high_watermark = leading.partition.high_watermark
        for responder in leading.responders:
            await (responder.drain() if drain else responder.unsubscribe())
        await leading.tasks.close(timeout_s=5.0)

    async def _hand_over_for_shutdown(self, partition: Partition) -> None:
        """Transfer leadership to the first ready replica (the target set's order first)."""
        node = self._intact_target(partition)
        if node is not None:
            timeout_s = self.ctx.settings.ingest.transfer_timeout_s
            try:
                await partition.transfer(node, timeout_s=timeout_s)
            except Exception as exc:  # etcd: fall back to releasing the owner key
                log.warning("%s: transfer to %s failed: %s", self.name, node, exc)

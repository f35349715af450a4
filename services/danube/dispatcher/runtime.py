"""One subscription at run time: the pure :class:`SubscriptionMachine` wired to its readers,
its timer, etcd (cursors) and ingest (dead letters).

Every call into the machine is synchronous (it does no I/O), so the event loop serialises
them; the actions it returns are carried out here (danube.dispatcher.actions). Those with I/O (a
dead letter, a cursor write) run one batch at a time under its ``io_lock``, in the order the
machine gave them, so a dead letter is always produced before the cursor write that moves
past it.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
import uuid
from collections.abc import Callable, Coroutine
from typing import Any

from danube.bus import Bus
from danube.config import DispatcherConfig
from danube.dispatcher import metrics, policies, policy_admin, starting, ticking, tiers
from danube.dispatcher.actions import ActionRunner
from danube.dispatcher.changes import Changes
from danube.dispatcher.counting import SubscriptionCounts
from danube.dispatcher.cursor import FlushPolicy
from danube.dispatcher.cursors_admin import CursorMoves
from danube.dispatcher.damage import DamageBook
from danube.dispatcher.delay_serving import DelayServing
from danube.dispatcher.delivery import SubscriptionMachine
from danube.dispatcher.events import (
    Ack,
    Action,
    ConsumerAttached,
    ConsumerDetached,
    Deliver,
    Event,
    Nack,
    NotInFlight,
    Poll,
    Tick,
)
from danube.dispatcher.expiring import expiry_for
from danube.dispatcher.keyed import new_machine
from danube.dispatcher.positions import resolve_all
from danube.dispatcher.readers import ReadLinks
from danube.dispatcher.reading import SubscriptionReaders
from danube.dispatcher.redelivery import DeliverySettings
from danube.dispatcher.sessions import ConsumerSessions
from danube.dispatcher.stats import subscription_stats
from danube.dispatcher.store import NotOwnerError, SubscriptionStore
from danube.errors import ConflictError, NotFoundError
from danube.meta import TopicName
from danube.meta.failure_policy import FailurePolicy
from danube.meta.records import SubscriptionConfig
from danube.storage import ObjectStore
from danube.tasks import TaskSet, TaskSetClosedError
from danube.wire import codes
from danube.wire.cloud.client import CloudClient
from danube.wire.dispatcher import protocol
from danube.wire.dispatcher.errors import SubscriptionNotFoundError
from danube.wire.ingest.client import IngestClient

log = logging.getLogger(__name__)


class SubscriptionRuntime:
    """Serves one subscription while this dispatcher owns it. ``on_failed`` is called (once)
    when it can no longer be served safely (fenced, or a dead letter could not be written)."""

    dispatch = "reliable"

    def __init__(
        self,
        store: SubscriptionStore,
        bus: Bus,
        config: DispatcherConfig,
        *,
        on_failed: Callable[[SubscriptionRuntime, str], None],
        objects: ObjectStore | None = None,
    ) -> None:
        self.store = store
        self.bus = bus
        self.config = config
        self.ingest = IngestClient(bus)
        self.cloud = CloudClient(bus)
        self.machine: SubscriptionMachine | None = None
        self.damage = DamageBook()  # partitions stopped at offsets no copy holds intact
        self._on_failed = on_failed
        self._partitions: dict[str, TopicName] = {}
        self._changes = Changes()  # waiting polls wake at every change
        self._sessions = ConsumerSessions()
        self._where = where = f"{store.topic}/{store.sub}"  # for logs and errors
        self._readers = SubscriptionReaders(
            ReadLinks(bus, self.ingest, self.damage, self._changes.notify, where),
            machine=self._machine,
            run_actions=self.run_actions,
            spawn=self._spawn,
        )
        self._resolve = functools.partial(resolve_all, self.ingest, self.cloud)
        self._failure = policy_admin.FailurePolicyAdmin(
            config, store.topic, where, write=store.write_config
        )
        self._actions = ActionRunner(
            store,
            self.ingest,
            self._partitions,
            self._readers,
            self._sessions,
            machine=self._machine,
            dead_letter_target=self._failure.dead_letter_target,
            fail=self.fail,
        )
        self._add_helpers(objects)
        # Its tasks (timer, readers, eviction, delays, growth): one that fails leaves a
        # subscription that can no longer be served safely, so it fails (to be claimed again).
        self._tasks = TaskSet(
            where, on_failure=lambda name, exc: self.fail(f"task {name} failed: {exc!r}")
        )
        self._activate_lock = asyncio.Lock()
        self.failed = False
        self.deleted = False  # set (for good) when a delete begins
        self.closing = False  # set on stop: waiting polls answer at once
        self._counts = SubscriptionCounts(store.topic, store.sub)
        self._policy = FlushPolicy(
            flush_acks=config.cursor_flush_acks,
            flush_interval_s=config.cursor_flush_interval_s,
        )

    def _add_helpers(self, objects: ObjectStore | None) -> None:
        """The operators' work (seek, skip), the topic policies' (eviction) and the delayed
        messages', each built with what it needs of this subscription."""
        self._moves = CursorMoves(
            self.store.topic,
            self.store.sub,
            self._partitions,
            self.damage,
            resolve=self._resolve,
            move=self.handle,
            check_serving=self.check_serving,
        )
        self._eviction = policies.BacklogEviction(
            self._where,
            self._partitions,
            read_policies=functools.partial(policies.policies_of, self.store),
            ingest=self.ingest,
            machine=self.subscription,
            move=self.handle,
        )
        self._delays = DelayServing(
            self.config,
            # Where delay snapshots go (danube.dispatcher.sealed); None: a takeover reads the log.
            objects if self.config.delayed_seal_interval_s > 0 else None,
            self.store.topic,
            self.store.sub,
            self._partitions,
            machine=lambda: self.machine,
            claim_revision=lambda: None if self.store.claim is None else self.store.claim.revision,
            links=self._readers.links,
            spawn=self._spawn,
        )

    # --- life cycle ------------------------------------------------------------------------

    async def start(self) -> None:
        """Resume an existing subscription (config and cursors in etcd); a new one waits
        for its first attach."""
        config = await self.store.load_config()
        if config is not None:
            await self._activate(config, config.initial_position)

    async def _activate(
        self,
        config: SubscriptionConfig,
        start: protocol.StartPosition,
        resolved: dict[TopicName, int] | None = None,
    ) -> None:
        """Serve ``config``: partitions without a stored cursor start at ``resolved`` (the
        first attach resolves its start before creating the config), else at ``start``."""
        begun = await starting.load_start(self.store, self._resolve, start, resolved, self._policy)
        self._partitions.update((p.topic, p) for p in begun.partitions)
        if begun.fresh:  # stored before any consumer sees a message (starting.Start)
            try:
                await self.store.write_cursors(begun.fresh)
            except NotOwnerError as exc:
                # Fenced (the subscription was deleted, or claimed elsewhere): stop serving,
                # so the caller's retry claims afresh rather than meet this one again.
                self.fail(str(exc))
                raise
        self._failure.stored = config
        self.machine = new_machine(
            config.type,
            begun.cursors,
            DeliverySettings.from_config(self.config, config.failure_policy),
        )
        self.machine.detach_payload = tiers.detached
        if self.machine.delayed is not None:  # shared, key-shared: bounded, spilled to files
            self.machine.delayed = self._delays.new_messages()
            await self._delays.resume(begun.stored, self._partitions)
        self.machine.expiry_of = expiry_for((await policies.policies_of(self.store)).message_ttl_s)
        for name, partition in self._partitions.items():
            self._readers.start(partition, name)
        self._delays.rescan(self._partitions)
        self._delays.spawn_loops()
        ticks = ticking.tick_loop(self._machine, self._changes.wait, self._tick)
        self._spawn(ticks, f"tick-{self.store.topic}-{self.store.sub}")
        self._spawn(self._eviction.run(), f"quota-{self.store.topic}-{self.store.sub}")
        log.info("serving subscription %s/%s (%s)", self.store.topic, self.store.sub, config.type)

    def grow(self, count: int) -> None:
        """The topic has ``count`` partitions now: read those not read yet from offset 0
        (a new partition holds only what came after the growth), in a task of our own."""
        if self.machine is not None and count > len(self._partitions):
            self._spawn(self._grow(count), f"grow-{self.store.topic}-{self.store.sub}")

    async def _grow(self, count: int) -> None:
        async with self._activate_lock:
            new = [p for p in self.store.topic.partitions(count) if p.topic not in self._partitions]
            if self.machine is None or self.failed or not new:
                return
            grown = await starting.load_grown(self.store, new, self._policy)  # not written now
            self.machine.add_partitions(grown.cursors)
            await self._delays.resume(grown.stored, {p.topic: p for p in new})
            for partition in new:
                self._partitions[partition.topic] = partition
                self._readers.start(partition, partition.topic)
            self._delays.rescan({p.topic: p for p in new})
        log.info("%s/%s reads %d partitions now", self.store.topic, self.store.sub, count)

    def _spawn(self, work: Coroutine[Any, Any, None], name: str) -> None:
        with contextlib.suppress(TaskSetClosedError):  # stopped or deleted: nothing starts
            self._tasks.spawn(work, name=name)

    def fail(self, reason: str) -> None:
        """Stop serving at once (no more cursor writes) and tell the owner."""
        if self.failed:
            return
        self.failed = True
        if self.deleted:
            log.info("subscription %s/%s stops: %s", self.store.topic, self.store.sub, reason)
        else:
            log.error("subscription %s/%s fails: %s", self.store.topic, self.store.sub, reason)
        self._tasks.cancel_all()  # at once: no more cursor writes; stop() waits for them
        self._delays.drop()
        self._on_failed(self, reason)

    def hold_cursors(self, held: bool) -> None:
        """Without the node lease (``held``): answer acks once they count in memory and keep
        cursor writes there; with it again (after the reclaim), write them as before (the
        next tick writes every dirty cursor, fenced on the new owner key)."""
        self.store.held = held
        self._actions.durability.hold(held)
        self._changes.notify()

    async def flush_held(self) -> None:
        """Write every dirty cursor now (after the reclaim), fenced on the owner key."""
        if self.machine is None or self.failed:
            return
        machine = self.machine
        await self.run_actions(machine.flush_dirty(list(self._partitions), time.monotonic()))

    def begin_stop(self) -> None:
        """Make waiting polls answer now, so the responder drains quickly."""
        self.closing = True
        self._changes.notify()

    async def stop(self) -> None:
        """Stop the tasks and write every cursor a last time (unless fenced)."""
        self.begin_stop()
        metrics.DAMAGED_PARTITIONS.dec(len(self.damage))
        self._sessions.clear()  # forgotten with the subscription
        await self._tasks.close()
        if not self.failed and not self.store.held:
            await self._delays.seal_last()
        self._delays.drop()
        if self.machine is None or self.failed or self.store.held:
            return  # held cursors die with the process: their acks come again (redelivery)
        await self._actions.write_last(self.machine)

    def unacked_count(self) -> int:
        """Messages delivered and not acked, over every consumer."""
        if self.machine is None:
            return 0
        return sum(unacked for _, _, unacked in self.machine.consumer_details())

    # --- requests --------------------------------------------------------------------------

    async def attach(self, request: protocol.AttachRequest) -> str:
        """Add a consumer (creating the subscription on its first attach); its id. The
        topic's policies may refuse it (``too_many_subscriptions``, ``too_many_consumers``)."""
        limits = await policies.policies_of(self.store)
        async with self._activate_lock:
            self.check_serving()
            if self.machine is None:
                # Resolved (and an offset past an end refused) before anything is stored.
                config, resolved = await starting.create_config(
                    self.store, self._resolve, request, limits
                )
                await self._activate(config, request.start, resolved)
            assert self._failure.stored is not None
            policy_admin.check_attach(self._failure.stored, request.failure_policy)
        machine = self._machine()
        if request.type != machine.delivery_type:
            raise ConflictError(
                f"the subscription is {machine.delivery_type}, not {request.type}",
                code="subscription_type_mismatch",
            )
        policies.check_consumers(limits, len(self._sessions), self._where)
        consumer_id = uuid.uuid4().hex
        await self.handle(
            ConsumerAttached(
                consumer_id, request.name, tuple(request.key_filters), request.hold_delayed
            )
        )
        self._sessions.begin(consumer_id, time.monotonic())
        return consumer_id

    async def poll(self, request: protocol.PollRequest, wait_s: float) -> bytes:
        """The poll reply (a delivery batch) of messages for the consumer, built from the
        machine's delivery in one pass; waits up to ``wait_s`` for the first one."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait_s
        self.check_serving()
        while True:
            self._sessions.seen(request.consumer_id, time.monotonic())
            wanted = protocol.poll_reply_max(
                request.max, self.bus.max_payload_bytes, self._readers.record_bytes_max
            )
            actions = self._machine().handle(
                Poll(request.consumer_id, wanted, time.monotonic(), ticking.wall_ms())
            )
            self._counts.follow(self._machine())
            delivered = [a for a in actions if isinstance(a, Deliver)]
            await self.run_actions([a for a in actions if not isinstance(a, Deliver)])
            if delivered:
                (deliver,) = delivered  # a poll's answer is one Deliver
                return self._counts.poll_reply(deliver)
            damaged = self.damage.error()
            if damaged is not None:
                raise damaged  # never silent empty polls while a partition is stopped
            remaining_s = deadline - loop.time()
            if remaining_s <= 0 or self.closing or self.failed:
                return protocol.encode_poll_columns([], [], [])
            # Taken only now: this poll's own actions notified the one before. Redeliveries
            # fall due with time, not with an event: look again at least every other tick.
            await self._changes.wait(min(remaining_s, ticking.TICK_INTERVAL_S * 2))

    async def ack(self, request: protocol.AckRequest, timeout_s: float) -> list[tuple[str, int]]:
        """Acknowledge messages; returns once the cursor holding the acks is stored, so an
        acknowledged message is never delivered again, even after a crash. AckNotDurableError
        when that takes longer than ``timeout_s`` (the acks still count in memory). Returns
        the refs that were not in flight (the ack did nothing for them)."""
        self.check_serving()
        started_s = time.monotonic()
        self._sessions.seen(request.consumer_id, time.monotonic())
        refs = request.refs()
        actions = await self.handle(Ack(request.consumer_id, refs))
        ignored = [ref for a in actions if isinstance(a, NotInFlight) for ref in a.refs]
        metrics.ACKED.inc(len(refs) - len(ignored))
        if self.store.held:
            metrics.LEASELESS_ACKS.inc(len(refs) - len(ignored))
        if ignored:
            acked = {partition for partition, _ in set(refs).difference(ignored)}
        else:  # the usual case: every partition named had an ack that counted
            acked = request.partitions()
        await self._actions.durability.wait(self._machine(), acked, timeout_s, self._where)
        metrics.ACK_SECONDS.observe(time.monotonic() - started_s)
        return ignored

    async def nack(self, request: protocol.AckRequest) -> None:
        """Refuse messages: redelivered after ``delay_ms``."""
        self.check_serving()
        self._sessions.seen(request.consumer_id, time.monotonic())
        refs = request.refs()
        await self.handle(Nack(request.consumer_id, refs, request.delay_ms, time.monotonic()))
        metrics.NACKED.inc(len(refs))

    async def detach(self, consumer_id: str) -> None:
        """Remove a consumer; its unacked messages go to the others."""
        self.check_serving()
        await self.handle(ConsumerDetached(consumer_id, time.monotonic()))
        self._sessions.end(consumer_id)

    # --- administration --------------------------------------------------------------------

    async def seek(self, position: protocol.StartPosition) -> dict[str, int]:
        """Every partition's cursor to ``position`` (danube.dispatcher.cursors_admin)."""
        self.check_serving()
        self.subscription()  # SubscriptionNotFoundError before the first attach
        return await self._moves.seek(position)

    async def skip(self, name: str, to_offset: int | None) -> protocol.SkipReply:
        """Partition ``name``'s cursor forward on purpose (cursors_admin)."""
        self.check_serving()
        return await self._moves.skip(self.subscription(), name, to_offset)

    async def failure_policy(self, policy: FailurePolicy | None) -> protocol.PolicyReply:
        """Replace the failure policy with ``policy`` and apply it now, or (None) read it
        (danube.dispatcher.policy_admin); SubscriptionNotFoundError before the first attach."""
        async with self._activate_lock:
            self.check_serving()
            machine = self.subscription()
            if policy is None:
                return self._failure.read()
            return await self._failure.replace(
                machine, policy, check_serving=self.check_serving, carry_out=self._carry_out
            )

    async def stats(self) -> protocol.SubscriptionStats:
        """Cursors, WAL ends, backlog, damage and blocking poison messages per partition;
        consumers and what they hold; the failure policy in effect."""
        self.check_serving()
        machine = self.subscription()
        found = await subscription_stats(self.ingest, machine, self._partitions, self.damage)
        return self._failure.with_policy(
            found, self._actions.dropped, self._actions.dead_lettered
        ).model_copy(update={"expired": machine.expired, "delayed": machine.delayed_count})

    async def delete(self) -> None:
        """Delete the subscription: detach every consumer, stop reading, delete its keys
        (config, cursors, owner) fenced on our owner key, then stop serving.

        Once ``deleted`` is set (under the attach lock, so a first attach either finished
        before or is refused after) every request is refused with ``not_owner``, which the
        client retries: after the responder is gone it claims afresh, and the new owner
        finds no config, so a racing attach creates a new subscription from its own start
        position and never sees this one's cursors. No cursor write of ours can land after
        the delete: the timer and readers are stopped first, a write already under way
        finishes before it (the action runner's ``io_lock``), and any later one is fenced
        on the deleted owner key. Consumers learn it at their next poll
        (``consumer_not_found``)."""
        async with self._activate_lock:
            self.check_serving()
            self.deleted = True
        self.begin_stop()
        try:
            await self._tasks.close()
            async with self._actions.io_lock:
                await self.store.delete()
        finally:
            # Stop serving either way: if the delete failed, the next owner loads what is
            # stored and the caller's retry deletes it there.
            self.fail("deleted")

    def check_serving(self) -> None:
        """NotOwnerError once the subscription is being deleted or stopped."""
        if self.deleted or self.failed:
            raise NotOwnerError(
                f"{self.store.topic}/{self.store.sub} is being deleted or stopped; ask again"
            )

    def subscription(self) -> SubscriptionMachine:
        """The state machine (SubscriptionNotFoundError before the first attach)."""
        if self.machine is None:
            raise SubscriptionNotFoundError(
                f"subscription {self.store.sub!r} of {self.store.topic} does not exist"
            )
        return self.machine

    # --- the machine -----------------------------------------------------------------------

    def _machine(self) -> SubscriptionMachine:
        if self.machine is None:
            raise NotFoundError(self.store.absent(), code=codes.CONSUMER_NOT_FOUND)
        return self.machine

    async def handle(self, event: Event) -> list[Action]:
        """Feed ``event`` to the machine and carry out what it decides."""
        actions = self._machine().handle(event)
        self._counts.follow(self._machine())
        # Acks free window room, nacks and detaches return messages, time makes them due:
        # every waiting poll looks again (a poll itself wakes nobody).
        self._changes.notify()
        await self.run_actions(actions)
        return actions

    async def _carry_out(self, actions: list[Action]) -> None:
        """Carry out what the machine decided outside an event (a new failure policy)."""
        self._changes.notify()
        await self.run_actions(actions)

    async def run_actions(self, actions: list[Action]) -> None:
        """Carry out the machine's actions (danube.dispatcher.actions)."""
        await self._actions.run(actions)

    async def _tick(self, now_s: float, wall_ms: int) -> None:
        """Time passes for the machine; consumers not heard from for their session
        timeout are detached (danube.dispatcher.ticking runs this)."""
        await self.handle(Tick(now_s, wall_ms))
        timeout_s = self.config.consumer_session_timeout_s
        for consumer_id in self._sessions.expired(now_s, timeout_s):
            log.info("consumer %s of %s/%s expired", consumer_id, self.store.topic, self.store.sub)
            await self.detach(consumer_id)

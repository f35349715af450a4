"""The cluster controller: one leader among the discovery instances looks after partitions.

Every discovery instance runs a :class:`Controller`; they campaign on ``elections/controller``
(:class:`danube.meta.Election`, lease TTL ``discovery.lease_ttl_s``) and exactly one leads.
While it leads, it watches ``nodes/ingest/``, ``topics/`` and ``partitions/``; after any
change (and at least every :data:`RESYNC_S`) it re-reads them, asks
:func:`danube.discovery.controller.assignment.plan` what to change and applies it: forgetting the
replica sets and leadership state of partitions whose topic is gone. While
``discovery.balance_enabled``, it also **balances**
(:mod:`danube.discovery.controller.balance`) when
ingest nodes come, go or are drained and every ``discovery.balance_interval_s``: it writes
reassignments (:mod:`danube.meta.reassign`) that the partitions' leaders carry out. Each
write is one transaction that also compares the election key's create revision with the
term's: a deposed leader's writes fail, however late they arrive; a reassignment is also
compared on the assignment's mod revision.
"""

from __future__ import annotations

import asyncio
import logging
import time

from danube.aio import wait_any
from danube.config import DanubeSettings
from danube.discovery import metrics
from danube.discovery.controller.assignment import ClusterView, Plan, partitions_of, plan
from danube.discovery.controller.balance import (
    REASONS,
    BalancePlan,
    BalanceView,
    Move,
    PartitionView,
    plan_balance,
)
from danube.discovery.controller.partition_records import read_drained, read_partition_records
from danube.meta import (
    DeposedError,
    Election,
    InvalidNameError,
    Leadership,
    MetaDecodeError,
    MetaError,
    MetaStore,
    TopicName,
    WatchError,
    WatchEvent,
    decode_model,
    encode_model,
    run_as_leader,
)
from danube.meta import keys as meta_keys
from danube.meta.backoff import backoff_s
from danube.meta.reassign import ReassignError, reassign
from danube.meta.records import Assignment, NodeRecord
from danube.meta.topics import read_topics
from danube.meta.txn import TXN_OPS_MAX
from danube.tasks import TaskSet

log = logging.getLogger(__name__)

# Changes arrive in bursts (a node's lease expiring deletes its key and all its owner keys
# at once): wait this long after the first event so one plan covers the whole burst.
DEBOUNCE_S = 0.05
# Re-read everything at least this often even without events: a safety net, not the path.
RESYNC_S = 5.0
# Writes per transaction: etcd allows 128 ops; one compare fences each transaction.
_WRITES_PER_TXN = TXN_OPS_MAX // 2
_RETRY_BASE_S = 0.1
_RETRY_CAP_S = 5.0
_WATCH_BUFFER_EVENTS = 1024


class Controller:
    """Campaign for the controller role; while leader, keep partitions assigned."""

    def __init__(self, settings: DanubeSettings, *, node_id: str, store: MetaStore) -> None:
        self.node_id = node_id
        self._store = store
        self._election = Election(
            store, meta_keys.CONTROLLER_ELECTION, node_id, ttl_s=settings.discovery.lease_ttl_s
        )
        self.plans_applied = 0  # plans that wrote something, for tests and logs
        config = settings.discovery
        self._balance_enabled = config.balance_enabled
        self._balance_interval_s = config.balance_interval_s
        self._balance_moves_max = config.balance_moves_max
        self._balance_slack = config.balance_slack
        self._balance_at = 0.0  # time.monotonic() of the next periodic balance
        self._members_changed = True  # ingest nodes or drains changed since the last balance
        self.moves_started = 0  # reassignments this instance wrote, for tests and logs
        for reason in REASONS:  # every series from the start, at 0
            metrics.REASSIGNMENTS_STARTED.labels(reason=reason)

    @property
    def is_leader(self) -> bool:
        """Whether this instance leads right now (as far as it can know)."""
        return self._election.is_leader

    @property
    def term(self) -> Leadership | None:
        """The current or last term this instance won (its ``revision`` fences writes)."""
        return self._election.term

    async def leader(self) -> str | None:
        """The node id of the current controller leader, or ``None`` if there is none."""
        return await self._election.leader()

    async def run(self, stop: asyncio.Event) -> None:
        """Campaign, lead while elected, campaign again; return once ``stop`` is set.

        etcd failures are retried with capped, jittered backoff; leaving resigns, so
        another instance takes over at once instead of after the lease TTL.
        """
        try:
            await run_as_leader(
                self._election,
                self._lead,
                stop,
                cancel_timeout_s=self._store.request_timeout_s,
                role="controller",
            )
        finally:
            log.info("controller %s stopped", self.node_id)

    async def _lead(self, term: Leadership, stop: asyncio.Event) -> None:
        """Keep the assignments right until the term ends or ``stop`` is set."""
        log.info("controller %s leads (term revision %d)", self.node_id, term.revision)
        dirty = asyncio.Event()
        # A watch that dies (not an etcd failure: it restarts those) would leave a leader
        # blind to changes until the next resync: the term ends instead, and the next one
        # starts with fresh watches.
        broken = asyncio.Event()
        watchers = TaskSet(f"controller {self.node_id}", on_failure=lambda *_: broken.set())
        for prefix in (
            meta_keys.nodes_prefix("ingest"),
            meta_keys.drains_prefix("ingest"),
            meta_keys.topics_prefix(),
            meta_keys.partitions_prefix(),
        ):
            watchers.spawn(self._watch(prefix, dirty), name=f"controller-watch-{prefix}")
        self._members_changed = True
        try:
            await self._reconcile_loop(term, stop, dirty, broken)
        finally:
            await watchers.close(timeout_s=self._store.request_timeout_s)
            metrics.BALANCE_IMBALANCE.set(0)  # only the leader reports them
            metrics.REASSIGNMENTS_UNDER_WAY.set(0)

    async def _reconcile_loop(
        self, term: Leadership, stop: asyncio.Event, dirty: asyncio.Event, broken: asyncio.Event
    ) -> None:
        # Always start from a full read; each watch also sets dirty once it (re)starts, so a
        # read follows the newest watch and nothing changed before it exists is missed.
        dirty.set()
        failures = 0
        while term.active and not stop.is_set():
            await wait_any(dirty, term.lost, stop, broken, timeout_s=self._wait_s())
            if broken.is_set():
                log.error("controller %s: a watch failed; ending this term", self.node_id)
                await wait_any(stop, timeout_s=_RETRY_CAP_S)  # a watch that always fails
                return
            if not term.active or stop.is_set():
                return
            await asyncio.sleep(DEBOUNCE_S)
            dirty.clear()
            try:
                await self.reconcile(term)
                failures = 0
            except DeposedError as exc:
                log.warning("controller %s deposed: %s", self.node_id, exc)
                return
            except MetaError as exc:  # etcd unreachable: the lease decides whether we lead on
                failures += 1
                log.warning("controller %s: reconcile failed: %s", self.node_id, exc)
                dirty.set()
                delay_s = backoff_s(failures - 1, base_s=_RETRY_BASE_S, cap_s=_RETRY_CAP_S)
                await wait_any(term.lost, stop, timeout_s=delay_s)

    async def _watch(self, prefix: str, dirty: asyncio.Event) -> None:
        """Set ``dirty`` on every relevant change under ``prefix``; restart a broken watch."""
        failures = 0
        while True:
            try:
                async with self._store.watch_prefix(
                    prefix, buffer_size=_WATCH_BUFFER_EVENTS
                ) as events:
                    dirty.set()  # whatever changed before this watch existed: re-read
                    async for event in events:
                        failures = 0
                        if _relevant(event.key):
                            dirty.set()
                        if _joins_or_leaves(event):
                            self._members_changed = True
            except WatchError as exc:
                log.info("controller watch on %s ended: %s; restarting", prefix, exc)
            except MetaError as exc:
                log.warning("controller watch on %s failed: %s", prefix, exc)
            failures += 1
            await asyncio.sleep(backoff_s(failures - 1, base_s=_RETRY_BASE_S, cap_s=1.0))

    def _wait_s(self) -> float:
        """How long the loop may sleep without events: until the resync or the balance."""
        return max(0.0, min(RESYNC_S, self._balance_at - time.monotonic()))

    async def reconcile(self, term: Leadership) -> Plan:
        """Read the cluster, plan, and write the plan fenced on ``term``; then balance when
        it is due (nodes or drains changed, or ``balance_interval_s`` passed). Return the
        plan of partitions forgotten."""
        view = await self.read_view()
        result = plan(view)
        if not result.empty:
            await self._apply(term, result)
            self.plans_applied += 1
            log.info("controller %s: forgot %d partitions", self.node_id, len(result.unassign))
        now = time.monotonic()
        # Switched off, the balancer still carries out drains (an operator asked for them).
        if self._members_changed or now >= self._balance_at:
            self._members_changed = False
            self._balance_at = now + self._balance_interval_s
            await self.balance(term, view.partitions)
        return result

    async def balance(self, term: Leadership, partitions: frozenset[TopicName]) -> BalancePlan:
        """Plan the balancer's reassignments and write them fenced on ``term``."""
        view, revisions = await self.read_balance_view(partitions)
        result = plan_balance(
            view,
            moves_max=self._balance_moves_max,
            slack=self._balance_slack,
            spread=self._balance_enabled,
        )
        metrics.BALANCE_IMBALANCE.set(result.imbalance)
        started = 0
        for move in result.moves:
            current = view.partitions[move.partition].assignment
            if await self._start_move(term, move, current, revisions[move.partition]):
                started += 1
        metrics.REASSIGNMENTS_UNDER_WAY.set(result.under_way + started)
        if started:
            self.moves_started += started
            log.info(
                "controller %s: started %d reassignments (%s); %d were under way",
                self.node_id,
                started,
                ", ".join(
                    f"{m.partition} -> {','.join(m.target)} ({m.reason})" for m in result.moves
                ),
                result.under_way,
            )
        return result

    async def _start_move(
        self, term: Leadership, move: Move, current: Assignment, revision: int
    ) -> bool:
        """Write one reassignment, compared on the assignment's revision (an operator or a
        leader completing one meanwhile wins: the next round sees it)."""
        if not term.active:
            raise DeposedError(f"the term ended ({term.lost_reason})")
        try:
            record = reassign(current, move.target, now_ms=int(time.time() * 1000))
        except ReassignError as exc:  # a planner bug, not a cluster state: say so, go on
            log.error("controller: planned %s -> %s: %s", move.partition, move.target, exc)
            return False
        key = meta_keys.partition_assignment_key(move.partition)
        election_key = meta_keys.election_key(meta_keys.CONTROLLER_ELECTION)
        txn = self._store.txn().if_create_revision(election_key, "==", term.revision)
        txn.if_mod_revision(key, "==", revision).then_put(key, encode_model(record))
        if (await txn.commit()).succeeded:
            metrics.REASSIGNMENTS_STARTED.labels(reason=move.reason).inc()
            return True
        election = await self._store.get(election_key)
        if election is None or election.create_revision != term.revision:
            raise DeposedError("the election key changed: another controller leads")
        log.info("controller: the assignment of %s changed meanwhile; next round", move.partition)
        return False

    async def read_balance_view(
        self, partitions: frozenset[TopicName]
    ) -> tuple[BalanceView, dict[TopicName, int]]:
        """What the balancer plans from, read from etcd now (only the partitions of
        ``partitions``, those that exist), and each assignment's mod revision."""
        nodes: dict[str, float | None] = {}
        for kv in await self._store.range(meta_keys.nodes_prefix("ingest")):
            try:
                record = decode_model(kv, NodeRecord)
            except MetaDecodeError:
                continue  # a node the balancer cannot judge gets nothing new
            nodes[record.node_id] = record.load
        views: dict[TopicName, PartitionView] = {}
        revisions: dict[TopicName, int] = {}
        for partition, records in (await read_partition_records(self._store)).items():
            if records.assignment is None or partition not in partitions:
                continue
            views[partition] = PartitionView(
                records.assignment,
                leader=None if records.owner is None else records.owner.node_id,
                isr=() if records.state is None else records.state.isr,
            )
            revisions[partition] = records.assignment_revision
        drained = await read_drained(self._store)
        return BalanceView(views, nodes, drained), revisions

    async def read_view(self) -> ClusterView:
        """The live ingest nodes, the partitions that exist, and who is assigned and owns
        each, as stored in etcd now."""
        nodes: dict[str, float | None] = {}
        for kv in await self._store.range(meta_keys.nodes_prefix("ingest")):
            _, node_id = meta_keys.parse_node_key(kv.key)
            try:
                nodes[node_id] = decode_model(kv, NodeRecord).load
            except MetaDecodeError as exc:  # the key's presence is the liveness that matters
                log.warning("controller: %s", exc)
                nodes[node_id] = None
        topics = await read_topics(self._store)
        assignments: dict[TopicName, tuple[str, ...]] = {}
        for kv in await self._store.range(meta_keys.partitions_prefix()):
            try:
                partition, record = meta_keys.parse_partition_key(kv.key)
                if record == "assignment":
                    assignments[partition] = decode_model(kv, Assignment).replicas
            except (MetaDecodeError, InvalidNameError) as exc:
                log.warning("controller: skipping %s: %s", kv.key, exc)
        return ClusterView(partitions_of(topics), nodes, assignments)

    async def _apply(self, term: Leadership, result: Plan) -> None:
        """Forget the plan's partitions in transactions fenced on the term's election key
        (a partition whose topic was created again meanwhile is left alone)."""
        election_key = meta_keys.election_key(meta_keys.CONTROLLER_ELECTION)
        per_txn = _WRITES_PER_TXN // 2
        for start in range(0, len(result.unassign), per_txn):
            if not term.active:
                raise DeposedError(f"the term ended ({term.lost_reason})")
            txn = self._store.txn().if_create_revision(election_key, "==", term.revision)
            batch = result.unassign[start : start + per_txn]
            for topic in sorted({p.parent for p in batch}, key=str):
                txn.if_absent(meta_keys.topic_key(topic))
            for partition in batch:
                txn.then_delete(meta_keys.partition_assignment_key(partition))
                txn.then_delete(meta_keys.partition_state_key(partition))
            if (await txn.commit()).succeeded:
                continue
            election = await self._store.get(election_key)
            if election is None or election.create_revision != term.revision:
                raise DeposedError("the election key changed: another controller leads")
            log.info("a topic of the plan was created again meanwhile; planning again")
            return


def _relevant(key: str) -> bool:
    """Changes that can alter a plan (leadership, uploader keys... cannot)."""
    if key.startswith(meta_keys.partitions_prefix()):
        return key.endswith("/assignment")
    return True


def _joins_or_leaves(event: WatchEvent) -> bool:
    """An ingest node registered or gone, or a drain asked or lifted (a node's load
    report rewrites its key: the periodic balance sees that)."""
    key = event.key
    members = key.startswith(meta_keys.nodes_prefix("ingest")) or key.startswith(
        meta_keys.drains_prefix("ingest")
    )
    return members and (event.kind == "delete" or event.create_revision == event.mod_revision)

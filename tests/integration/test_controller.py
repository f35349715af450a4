"""The controller on real etcd: one leader among controllers (a deposed one cannot write);
replica sets of deleted topics forgotten, and never moved when their nodes die; the balancer
writes reassignments (fenced, compared on the assignment) for a new node and a drain, within
its moves limit, and only drains while switched off."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path

import pytest

from danube.bus import TopicName
from danube.config import (
    BusConfig,
    DanubeSettings,
    DiscoveryConfig,
    IngestConfig,
    MetadataConfig,
    WalCloudConfig,
    WalConfig,
)
from danube.discovery.controller.assignment import Plan
from danube.discovery.controller.controller import Controller
from danube.meta import DeposedError, Leadership, MetaStore
from danube.meta import keys as meta_keys
from danube.meta.reassign import completed
from danube.meta.records import Assignment, DrainRecord, NodeRecord, Owner, TopicConfig
from danube.up import free_port

pytestmark = [pytest.mark.integration, pytest.mark.timeout(90)]

LEASE_TTL_S = 3
ORDERS = TopicName("default", "orders")
PLAIN = TopicName("default", "plain")
PARTITIONS = [*ORDERS.partitions(4), PLAIN]


def _settings(nats_url: str, etcd: str, prefix: str, wal_dir: Path) -> DanubeSettings:
    return DanubeSettings(
        bus=BusConfig(servers=[nats_url]),
        wal_cloud=WalCloudConfig(
            wal=WalConfig(dir=wal_dir),
            metadata=MetadataConfig(etcd_endpoint=etcd, prefix=prefix),
        ),
        ingest=IngestConfig(lease_ttl_s=LEASE_TTL_S, metrics_port=free_port()),
        discovery=DiscoveryConfig(lease_ttl_s=LEASE_TTL_S, grpc_port=0),
    )


@asynccontextmanager
async def running_controller(
    settings: DanubeSettings, node_id: str, store: MetaStore
) -> AsyncIterator[Controller]:
    controller = Controller(settings, node_id=node_id, store=store)
    stop = asyncio.Event()
    task = asyncio.create_task(controller.run(stop))
    try:
        yield controller
    finally:
        stop.set()
        async with asyncio.timeout(10):
            await task


@pytest.fixture
def settings_for(
    nats_url: str, etcd_endpoint: str, meta_prefix: str, tmp_path: Path
) -> Callable[[str], DanubeSettings]:
    return lambda node: _settings(nats_url, etcd_endpoint, meta_prefix, tmp_path / node)


async def _create_topics(store: MetaStore) -> None:
    await store.put_model(meta_keys.topic_key(ORDERS), TopicConfig(partitions=4, created_ms=1))
    await store.put_model(meta_keys.topic_key(PLAIN), TopicConfig(partitions=0, created_ms=1))


async def _until(check: Callable[[], Awaitable[bool]], *, timeout_s: float) -> None:
    """Poll ``check`` until it holds; fail after ``timeout_s``."""
    async with asyncio.timeout(timeout_s):
        while True:
            if await check():
                return
            await asyncio.sleep(0.02)


async def test_one_leader_takeover_on_lease_loss_and_a_deposed_leader_cannot_write(
    store: MetaStore, settings_for: Callable[[str], DanubeSettings]
) -> None:
    settings = settings_for("ctl")
    async with (
        running_controller(settings, "ctl-1", store) as one,
        running_controller(settings, "ctl-2", store) as two,
    ):

        async def one_leader() -> bool:
            return [one.is_leader, two.is_leader].count(True) == 1

        await _until(one_leader, timeout_s=10)
        leader = one if one.is_leader else two
        assert await one.leader() == leader.node_id
        old_term = leader.term
        assert old_term is not None

        election = await store.get(meta_keys.election_key(meta_keys.CONTROLLER_ELECTION))
        assert election is not None
        loop = asyncio.get_running_loop()
        revoked_at = loop.time()
        await store.revoke_lease(election.lease_id)

        async def a_new_term() -> bool:
            # One leader on a newer term: the other candidate, watching the key, or the
            # deposed one, which campaigns again at once with a new lease and may win.
            leading = [c for c in (one, two) if c.is_leader]
            if len(leading) != 1:
                return False
            term = leading[0].term
            return (
                term is not None
                and term.revision > old_term.revision
                and await one.leader() == leading[0].node_id
            )

        await _until(a_new_term, timeout_s=LEASE_TTL_S + 2)
        assert loop.time() - revoked_at < LEASE_TTL_S + 2
        assert not old_term.active

        # A write fenced on the old term fails in etcd even if its holder believes it leads.
        stale = Leadership(old_term.name, old_term.candidate_id, old_term.lease, old_term.revision)
        fresh = TopicName("default", "fresh")
        placed = Assignment(replicas=("node-q",), assigned_ms=1)
        await store.put_model(meta_keys.partition_assignment_key(fresh), placed)
        with pytest.raises(DeposedError):
            await leader._apply(stale, Plan((fresh,)))
        assert await store.get(meta_keys.partition_assignment_key(fresh)) is not None


async def _assignments(store: MetaStore) -> dict[TopicName, tuple[str, ...]]:
    found = {}
    for kv in await store.range(meta_keys.partitions_prefix()):
        partition, record = meta_keys.parse_partition_key(kv.key)
        if record == "assignment":
            found[partition] = Assignment.model_validate_json(kv.value).replicas
    return found


async def test_replica_sets_never_move_and_are_forgotten_with_their_topic(
    store: MetaStore, settings_for: Callable[[str], DanubeSettings]
) -> None:
    for node_id in ("node-p", "node-q"):
        record = NodeRecord(node_id=node_id, kind="ingest", started_ms=1)
        await store.put_model(meta_keys.node_key("ingest", node_id), record)
    await _create_topics(store)
    for partition in PARTITIONS:
        placed = Assignment(replicas=("node-p", "node-q"), assigned_ms=1)
        await store.put_model(meta_keys.partition_assignment_key(partition), placed)
    async with running_controller(settings_for("ctl"), "ctl-1", store) as controller:
        await _until(lambda: _true(controller.is_leader), timeout_s=10)
        # A replica's node dies: nothing moves (its copy comes back with it, or an
        # operator moves it); the controller's plan is empty.
        await store.delete(meta_keys.node_key("ingest", "node-p"))
        term = controller.term
        assert term is not None
        assert (await controller.reconcile(term)).empty
        assert set((await _assignments(store)).values()) == {("node-p", "node-q")}

        await store.delete(meta_keys.topic_key(ORDERS))

        async def only_plain() -> bool:
            return set(await _assignments(store)) == {PLAIN}

        await _until(only_plain, timeout_s=5)


async def _true(value: bool) -> bool:
    return value


async def _led_on(store: MetaStore, partition: TopicName, replicas: tuple[str, ...]) -> None:
    """A partition with a replica set and a live leader (its owner key)."""
    placed = Assignment(replicas=replicas, assigned_ms=1)
    await store.put_model(meta_keys.partition_assignment_key(partition), placed)
    owner = Owner(node_id=replicas[0], epoch=1, assigned_ms=1)
    await store.put_model(meta_keys.partition_owner_key(partition), owner)


async def _records(store: MetaStore) -> dict[TopicName, Assignment]:
    found = {}
    for kv in await store.range(meta_keys.partitions_prefix()):
        partition, record = meta_keys.parse_partition_key(kv.key)
        if record == "assignment":
            found[partition] = Assignment.model_validate_json(kv.value)
    return found


async def test_the_balancer_reassigns_to_a_new_node_and_off_a_drained_one(
    store: MetaStore, settings_for: Callable[[str], DanubeSettings]
) -> None:
    await store.put_model(
        meta_keys.node_key("ingest", "node-p"),
        NodeRecord(node_id="node-p", kind="ingest", started_ms=1),
    )
    await _create_topics(store)
    for partition in PARTITIONS:
        await _led_on(store, partition, ("node-p",))
    settings = settings_for("ctl")
    settings = settings.model_copy(
        update={
            "discovery": settings.discovery.model_copy(
                update={"balance_moves_max": 2, "balance_interval_s": 0.2}
            )
        }
    )
    async with running_controller(settings, "ctl-1", store) as controller:
        await _until(lambda: _true(controller.is_leader), timeout_s=10)
        # A second node joins: at most 2 reassignments at once go its way.
        await store.put_model(
            meta_keys.node_key("ingest", "node-q"),
            NodeRecord(node_id="node-q", kind="ingest", started_ms=1),
        )

        async def two_moving() -> bool:
            records = await _records(store)
            return sum(r.moving for r in records.values()) == 2

        await _until(two_moving, timeout_s=5)
        await asyncio.sleep(0.5)  # more rounds pass: still only 2 under way
        records = await _records(store)
        moving = {p: r for p, r in records.items() if r.moving}
        assert len(moving) == 2
        for record in moving.values():
            assert record.adding == ("node-q",)
            assert record.removing == ("node-p",)

        # The leaders complete them (no ingest runs here: written as a leader would).
        for partition, record in moving.items():
            await store.put_model(
                meta_keys.partition_assignment_key(partition), completed(record, now_ms=2)
            )
            owner = Owner(node_id="node-q", epoch=2, assigned_ms=2)
            await store.put_model(meta_keys.partition_owner_key(partition), owner)

        # An operator drains node-q: what it holds is reassigned back to node-p.
        drain = DrainRecord(node_id="node-q", requested_ms=1)
        await store.put_model(meta_keys.drain_key("ingest", "node-q"), drain)

        async def drained_off() -> bool:
            records = await _records(store)
            return all(records[p].target == ("node-p",) for p in moving)

        await _until(drained_off, timeout_s=5)
        records = await _records(store)
        for partition in moving:
            assert records[partition].removing == ("node-q",)


async def test_the_balancer_switched_off_spreads_nothing_but_drains(
    store: MetaStore, settings_for: Callable[[str], DanubeSettings]
) -> None:
    for node_id in ("node-p", "node-q"):
        record = NodeRecord(node_id=node_id, kind="ingest", started_ms=1)
        await store.put_model(meta_keys.node_key("ingest", node_id), record)
    await _create_topics(store)
    for partition in PARTITIONS:
        await _led_on(store, partition, ("node-p",))
    settings = settings_for("ctl")
    settings = settings.model_copy(
        update={
            "discovery": settings.discovery.model_copy(
                update={"balance_enabled": False, "balance_interval_s": 0.1}
            )
        }
    )
    async with running_controller(settings, "ctl-1", store) as controller:
        await _until(lambda: _true(controller.is_leader), timeout_s=10)
        await asyncio.sleep(0.5)
        assert controller.moves_started == 0
        assert not any(r.moving for r in (await _records(store)).values())
        # A drain is an operator's request: carried out with the balancer switched off.
        drain = DrainRecord(node_id="node-p", requested_ms=1)
        await store.put_model(meta_keys.drain_key("ingest", "node-p"), drain)

        moves_max = settings.discovery.balance_moves_max

        async def draining() -> bool:
            records = await _records(store)
            return sum(r.target == ("node-q",) for r in records.values()) == moves_max

        await _until(draining, timeout_s=5)
        assert all(r.removing == ("node-p",) for r in (await _records(store)).values() if r.moving)

"""The controller on real etcd: one leader among controllers (a deposed one cannot write);
replica sets of deleted topics forgotten, and never moved when their nodes die."""

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
from danube.discovery.assignment import Plan
from danube.discovery.controller import Controller, DeposedError
from danube.meta import Leadership, MetaStore
from danube.meta import keys as meta_keys
from danube.meta.records import Assignment, NodeRecord, TopicConfig
from danube.runtime import free_port

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
        leader, other = (one, two) if one.is_leader else (two, one)
        assert await one.leader() == leader.node_id
        old_term = leader.term
        assert old_term is not None

        election = await store.get(meta_keys.election_key(meta_keys.CONTROLLER_ELECTION))
        assert election is not None
        loop = asyncio.get_running_loop()
        revoked_at = loop.time()
        await store.revoke_lease(election.lease_id)

        async def other_leads() -> bool:
            return other.is_leader and await one.leader() == other.node_id

        await _until(other_leads, timeout_s=LEASE_TTL_S + 2)
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

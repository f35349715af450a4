"""The controller on real etcd and NATS: partitions spread over two ingest nodes, failover when
a node's lease goes, a revived node served without two owners, one leader among controllers."""

from __future__ import annotations

import asyncio
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path

import nats
import orjson
import pytest
from nats.aio.client import Client as NatsClient
from nats.aio.msg import Msg

from danube.bus import Bus, NoRespondersError, RemoteError, TopicName
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
from danube.frame import Record, encode_record
from danube.ingest import app
from danube.ingest.client import IngestClient
from danube.ingest.ownership import RESERVATION_BLOCK
from danube.meta import Leadership, MetaStore
from danube.meta import keys as meta_keys
from danube.meta.records import Assignment, NodeRecord, Owner, TopicConfig
from danube.runtime import free_port

pytestmark = [pytest.mark.integration, pytest.mark.timeout(90)]

LEASE_TTL_S = 3
ORDERS = TopicName("default", "orders")
PLAIN = TopicName("default", "plain")
PARTITIONS = [*ORDERS.partitions(4), PLAIN]
# Revoking a lease deletes its keys at once, so the lease TTL is not part of the wait here:
# the controller reacts (< 1 s) and the new owner claims (< 1 s). docs/controller.md.
MOVE_BOUND_S = 2.5


def _settings(nats_url: str, etcd: str, prefix: str, wal_dir: Path) -> DanubeSettings:
    return DanubeSettings(
        bus=BusConfig(servers=[nats_url]),
        wal_cloud=WalCloudConfig(
            wal=WalConfig(dir=wal_dir),
            metadata=MetadataConfig(etcd_endpoint=etcd, prefix=prefix),
        ),
        ingest=IngestConfig(lease_ttl_s=LEASE_TTL_S, metrics_port=free_port()),
        discovery=DiscoveryConfig(lease_ttl_s=LEASE_TTL_S),
    )


def _records(*payloads: bytes) -> list[bytes]:
    return [encode_record(Record(payload=p, publish_time_ms=7, producer="t")) for p in payloads]


@asynccontextmanager
async def running_node(settings: DanubeSettings, node_id: str) -> AsyncIterator[asyncio.Task[None]]:
    stop = asyncio.Event()
    task = asyncio.create_task(app.serve(settings, node_id, stop))
    try:
        yield task
    finally:
        stop.set()
        await asyncio.gather(task, return_exceptions=True)


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


async def _state(store: MetaStore) -> tuple[dict[TopicName, str], dict[TopicName, Owner]]:
    assignments: dict[TopicName, str] = {}
    owners: dict[TopicName, Owner] = {}
    for kv in await store.range(meta_keys.partitions_prefix()):
        partition, record = meta_keys.parse_partition_key(kv.key)
        if record == "assignment":
            assignments[partition] = Assignment.model_validate_json(kv.value).node_id
        elif record == "owner":
            owners[partition] = Owner.model_validate_json(kv.value)
    return assignments, owners


async def _settled(store: MetaStore, *, timeout_s: float) -> dict[TopicName, Owner]:
    """Wait until every partition is assigned and owned by its assignee; return the owners."""
    async with asyncio.timeout(timeout_s):
        while True:
            assignments, owners = await _state(store)
            if set(assignments) == set(PARTITIONS) and all(
                p in owners and owners[p].node_id == node for p, node in assignments.items()
            ):
                return owners
            await asyncio.sleep(0.02)


@dataclass
class OwnerSampler:
    """Samples owner keys and the partitions' bus responders throughout a test."""

    store: MetaStore
    nats_url: str
    samples: int = 0
    answered: int = 0  # probes one owner answered: the probe does reach the servers
    violations: list[str] = field(default_factory=list)
    epochs: dict[TopicName, tuple[int, str]] = field(default_factory=dict)

    async def run(self, stop: asyncio.Event, bus: Bus) -> None:
        nc = await nats.connect(self.nats_url)
        inbox = f"_INBOX.probe-{uuid.uuid4().hex}"
        replies: dict[str, list[bytes]] = {}

        async def collect(msg: Msg) -> None:
            replies.setdefault(msg.subject, []).append(msg.data)

        sub = await nc.subscribe(inbox + ".*", cb=collect)
        try:
            while not stop.is_set():
                await self._sample_keys()
                await self._sample_responders(nc, bus, inbox, replies)
                self.samples += 1
        finally:
            await sub.unsubscribe()
            await nc.close()

    async def _sample_keys(self) -> None:
        _, owners = await _state(self.store)
        for partition, owner in owners.items():
            seen = self.epochs.get(partition)
            if seen is not None and (
                owner.epoch < seen[0] or (owner.epoch == seen[0] and owner.node_id != seen[1])
            ):
                self.violations.append(f"{partition}: owner went from {seen} to {owner}")
            self.epochs[partition] = (owner.epoch, owner.node_id)

    async def _sample_responders(
        self, nc: NatsClient, bus: Bus, inbox: str, replies: dict[str, list[bytes]]
    ) -> None:
        """Ask every server of each partition's stats subject at once: at most one may
        answer as the unfenced owner."""
        replies.clear()
        for index, partition in enumerate(PARTITIONS):
            await nc.publish(bus.subjects.wal_stats(partition), b"", reply=f"{inbox}.{index}")
        await nc.flush()
        await asyncio.sleep(0.1)
        for index, partition in enumerate(PARTITIONS):
            serving = [
                reply
                for reply in replies.get(f"{inbox}.{index}", [])
                if reply.startswith(b"{") and not orjson.loads(reply)["fenced"]
            ]
            self.answered += len(serving) == 1
            if len(serving) > 1:
                self.violations.append(f"{partition}: {len(serving)} unfenced owners answer")


async def _until(check: Callable[[], Awaitable[bool]], *, timeout_s: float) -> None:
    """Poll ``check`` until it holds; fail after ``timeout_s``."""
    async with asyncio.timeout(timeout_s):
        while True:
            if await check():
                return
            await asyncio.sleep(0.02)


async def test_partitions_spread_fail_over_and_a_revived_node_never_makes_two_owners(
    bus: Bus, store: MetaStore, settings_for: Callable[[str], DanubeSettings], nats_url: str
) -> None:
    client = IngestClient(bus)
    await _create_topics(store)
    async with (
        running_controller(settings_for("ctl"), "ctl-1", store),
        running_node(settings_for("b"), "node-b") as task_b,
    ):
        task_a_cm = running_node(settings_for("a"), "node-a")
        task_a = await task_a_cm.__aenter__()
        try:
            owners = await _settled(store, timeout_s=10)
            assert sorted(Counter(o.node_id for o in owners.values()).values()) == [2, 3]
            assert {o.epoch for o in owners.values()} == {1}
            for partition in PARTITIONS:
                assert await client.produce(partition, _records(b"first"), timeout_s=10) == 0

            sampler = OwnerSampler(store, nats_url)
            stop_sampling = asyncio.Event()
            sampling = asyncio.create_task(sampler.run(stop_sampling, bus))

            # Node A loses its lease: its node and owner keys vanish; B takes over in time.
            on_a = sorted((p for p, o in owners.items() if o.node_id == "node-a"), key=str)
            node_a = await store.get(meta_keys.node_key("ingest", "node-a"))
            assert node_a is not None
            loop = asyncio.get_running_loop()
            revoked_at = loop.time()
            await store.revoke_lease(node_a.lease_id)
            moved = await _settled(store, timeout_s=MOVE_BOUND_S)
            assert loop.time() - revoked_at < MOVE_BOUND_S
            assert {o.node_id for o in moved.values()} == {"node-b"}
            assert all(moved[p].epoch == 2 for p in on_a)
            with pytest.raises(app.LeaseLost):
                await asyncio.wait_for(task_a, 10)
            for partition in on_a:  # offsets continue past A's whole reservation
                assert await client.produce(partition, _records(b"b"), timeout_s=10) >= (
                    RESERVATION_BLOCK
                )
        finally:
            await task_a_cm.__aexit__(None, None, None)

        # A comes back (new incarnation, same id): it gets partitions again only as B lets
        # them go; the sampler checks that no partition ever has two owners meanwhile.
        async with running_node(settings_for("a"), "node-a"):
            async with asyncio.timeout(10):
                while True:
                    owners = await _settled(store, timeout_s=10)
                    if sorted(Counter(o.node_id for o in owners.values()).values()) == [2, 3]:
                        break
                    await asyncio.sleep(0.05)
            for partition in PARTITIONS:
                await client.produce(partition, _records(b"again"), timeout_s=10)
            back_on_a = [p for p, o in owners.items() if o.node_id == "node-a"]
            assert all(owners[p].epoch >= 2 for p in back_on_a)
            stop_sampling.set()
            await sampling
        assert not task_b.done()
    assert sampler.samples >= 5
    assert sampler.answered >= sampler.samples  # most probes, across all partitions
    assert sampler.violations == []


async def test_the_claim_request_of_a_partition_assigned_elsewhere_is_refused(
    bus: Bus, store: MetaStore, settings_for: Callable[[str], DanubeSettings]
) -> None:
    partition = PLAIN
    await store.put_model(
        meta_keys.partition_assignment_key(partition), Assignment(node_id="node-z", assigned_ms=1)
    )
    async with running_node(settings_for("a"), "node-a"):
        async with asyncio.timeout(10):
            while True:  # until the node answers claims (it is starting)
                try:
                    await bus.request(bus.subjects.ownership(partition), b"", timeout_s=5)
                except NoRespondersError:
                    await asyncio.sleep(0.05)
                    continue
                except RemoteError as exc:
                    refused = exc
                    break
                pytest.fail("a partition assigned to another node was claimed")
        assert refused.code == "not_owner"
        assert await store.get(meta_keys.partition_owner_key(partition)) is None


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
        with pytest.raises(DeposedError):
            await leader._apply(stale, Plan({fresh: "node-q"}, (), (), {fresh: "node-q"}))
        assert await store.get(meta_keys.partition_assignment_key(fresh)) is None


async def test_assignments_follow_topics_and_nodes_in_etcd(
    store: MetaStore, settings_for: Callable[[str], DanubeSettings]
) -> None:
    # Registered nodes without any ingest process: only the controller's writes are seen.
    for node_id in ("node-p", "node-q"):
        record = NodeRecord(node_id=node_id, kind="ingest", started_ms=1)
        await store.put_model(meta_keys.node_key("ingest", node_id), record)
    async with running_controller(settings_for("ctl"), "ctl-1", store):
        await _create_topics(store)

        async def all_assigned() -> bool:
            return set((await _state(store))[0]) == set(PARTITIONS)

        await _until(all_assigned, timeout_s=5)
        assignments = (await _state(store))[0]
        assert sorted(Counter(assignments.values()).values()) == [2, 3]

        await store.delete(meta_keys.node_key("ingest", "node-p"))

        async def all_on_q() -> bool:
            return set((await _state(store))[0].values()) == {"node-q"}

        await _until(all_on_q, timeout_s=2)

        await store.delete(meta_keys.topic_key(ORDERS))

        async def only_plain() -> bool:
            return set((await _state(store))[0]) == {PLAIN}

        await _until(only_plain, timeout_s=2)

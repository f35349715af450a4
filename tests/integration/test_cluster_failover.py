"""The store and the bus against 3-member clusters (danube.up.clusters): an etcd member
or a NATS server killed or frozen under traffic costs a bounded failover, no lease, and no
watch event; the launchers themselves."""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import AsyncIterator

import pytest

from danube.bus import Bus, NoRespondersError, Reply, Request
from danube.config import BusConfig
from danube.config.wal_cloud import MetadataConfig
from danube.meta import MetaStore, WatchError, WatchEvent
from danube.meta.follow import follow_prefix
from danube.up import EtcdCluster, NatsCluster

pytestmark = [pytest.mark.integration, pytest.mark.timeout(90)]

# Longer than a refresh on a silent member (a third of it) plus etcd electing a new
# leader (about 1-2 s with its default timing): docs/metadata.md, Failover.
LEASE_TTL_S = 5
WRITES = 60


def _config(endpoints: list[str], prefix: str) -> MetadataConfig:
    return MetadataConfig(etcd_endpoints=endpoints, prefix=prefix, request_timeout_s=2.0)


def _ordered(cluster: EtcdCluster, *, leader_first: bool) -> list[str]:
    """Every member's endpoint, the leader first or a follower first (the one in use)."""
    leader = cluster.leader()
    followers = [cluster.endpoint_of[name] for name in cluster.names if name != leader]
    if leader_first:
        return [cluster.endpoint_of[leader], *followers]
    return [followers[0], cluster.endpoint_of[leader], *followers[1:]]


async def test_the_etcd_launcher_runs_one_cluster(
    etcd_cluster: EtcdCluster, meta_prefix: str
) -> None:
    leader = etcd_cluster.leader()
    assert leader in etcd_cluster.names
    # A write through one member is read through every other: one cluster, not three.
    first, *others = etcd_cluster.endpoints
    async with await MetaStore.connect(_config([first], meta_prefix)) as store:
        await store.put("k", b"v")
    for endpoint in others:
        async with await MetaStore.connect(_config([endpoint], meta_prefix)) as store:
            found = await store.get("k")
            assert found is not None
            assert found.value == b"v"


async def test_connect_skips_a_dead_member(etcd_cluster: EtcdCluster, meta_prefix: str) -> None:
    # A follower, listed first: the cluster keeps its leader, so what is measured is the
    # client skipping the member, not etcd electing another leader.
    leader = etcd_cluster.leader()
    dead = next(name for name in etcd_cluster.names if name != leader)
    endpoints = [etcd_cluster.endpoint_of[dead]] + [
        etcd_cluster.endpoint_of[name] for name in etcd_cluster.names if name != dead
    ]
    etcd_cluster.kill(dead)
    async with await MetaStore.connect(_config(endpoints, meta_prefix)) as store:
        assert store.endpoint != etcd_cluster.endpoint_of[dead]
        await store.put("k", b"v")


@pytest.mark.parametrize("fault", ["kill", "freeze"])
@pytest.mark.parametrize("member", ["leader", "follower"])
async def test_losing_the_connected_member_keeps_leases_and_watches(
    etcd_cluster: EtcdCluster, meta_prefix: str, fault: str, member: str
) -> None:
    """Writes go on after the failover, the lease never lapses (etcd still holds it, with
    its keys), and the watch resumed on the new member sees every write exactly in order.
    Losing the leader adds etcd's own election to the client's failover."""
    endpoints = _ordered(etcd_cluster, leader_first=member == "leader")
    in_use = next(n for n in etcd_cluster.names if etcd_cluster.endpoint_of[n] == endpoints[0])
    seen: list[str] = []
    async with await MetaStore.connect(_config(endpoints, meta_prefix)) as store:
        assert store.endpoint == endpoints[0]
        lease = await store.grant_lease(LEASE_TTL_S)
        await store.put("owned", b"x", lease=lease)
        revision = await store.ping()

        all_seen = asyncio.Event()

        def on_event(event: WatchEvent) -> None:
            seen.append(event.key)
            if len(seen) >= WRITES:
                all_seen.set()

        follower = asyncio.create_task(
            follow_prefix(store, "w/", on_event, start_revision=revision + 1)
        )
        loop = asyncio.get_running_loop()
        failed_at: float | None = None
        recovered_at: float | None = None
        pid = etcd_cluster.process(in_use).pid
        assert pid is not None
        try:
            for i in range(WRITES):
                if i == WRITES // 3:
                    failed_at = loop.time()
                    if fault == "kill":
                        etcd_cluster.kill(in_use)
                    else:
                        os.kill(pid, signal.SIGSTOP)
                while True:  # a write may fail during the failover: the caller retries
                    try:
                        # Create-if-absent: a retry of a write whose answer was lost (it
                        # committed) writes nothing, so each key is one event.
                        await store.create(f"w/{i:04d}", b"v")
                        break
                    except Exception:
                        await asyncio.sleep(0.05)
                if failed_at is not None and recovered_at is None:
                    recovered_at = loop.time()
                await asyncio.sleep(0.02)
            async with asyncio.timeout(10):
                await all_seen.wait()
            # Past a whole TTL after the fault, the lease is the one granted before it.
            assert failed_at is not None
            await asyncio.sleep(max(0.0, failed_at + LEASE_TTL_S + 0.5 - loop.time()))
            assert lease.alive, lease.lost_reason
            owned = await store.get("owned")
            assert owned is not None
            assert owned.lease_id == lease.id
        finally:
            follower.cancel()
            if fault == "freeze":
                os.kill(pid, signal.SIGCONT)
        assert store.endpoint != endpoints[0]
        assert store.failovers >= 1
    assert failed_at is not None
    assert recovered_at is not None
    assert seen == [f"w/{i:04d}" for i in range(WRITES)]  # each once, in order
    took_s = recovered_at - failed_at
    print(f"etcd {fault} of the {member} in use: writes again {took_s:.2f} s after the fault")


async def _once_routed(bus: Bus, subject: str, body: bytes) -> Reply:
    """The answer to a request sent again while the subject's subscription has not reached
    the requester's server yet (no responders), for at most 5 s."""
    deadline = asyncio.get_running_loop().time() + 5.0
    while True:
        try:
            return await bus.request(subject, body, timeout_s=2)
        except NoRespondersError:
            if asyncio.get_running_loop().time() > deadline:
                raise
            await asyncio.sleep(0.02)


async def test_the_nats_launcher_routes_and_the_bus_fails_over(nats_cluster: NatsCluster) -> None:
    """A responder and a requester on different servers of one cluster; the server the
    requester is on is killed: requests answer again within the failover, then all do."""
    urls = nats_cluster.urls

    async def echo(request: Request) -> bytes:
        return request.body

    # The responder prefers server 2, the requester server 0 (no shuffling: one URL each
    # first, the others known from the cluster's INFO).
    responder = await Bus.connect(BusConfig(servers=[urls[2]]), name="responder")
    requester = await Bus.connect(
        BusConfig(servers=[urls[0]], reconnect_wait_s=0.2), name="requester"
    )
    try:
        await responder.serve("t.echo", echo)
        # The subscription reaches the requester's server over the cluster's route a moment
        # after the responder's server has it: until then a request finds no responders.
        assert (await _once_routed(requester, "t.echo", b"a")).body == b"a"
        assert "requester" in nats_cluster.client_names("nats-0")
        loop = asyncio.get_running_loop()
        nats_cluster.kill("nats-0")
        killed_at = loop.time()
        answered_at = None

        async def reconnected() -> float:
            while requester.reconnects == 0:  # noqa: ASYNC110 (the bus offers no event)
                await asyncio.sleep(0.005)
            return loop.time()

        reconnect = asyncio.create_task(reconnected())
        for i in range(200):
            try:
                body = await requester.request("t.echo", b"%d" % i, timeout_s=1.0)
            except Exception:
                assert answered_at is None, "a request failed after the failover"
                await asyncio.sleep(0.02)
                continue
            assert body.body == b"%d" % i
            answered_at = answered_at or loop.time()
        assert answered_at is not None
        reconnected_at = await asyncio.wait_for(reconnect, 1.0)
        assert "requester" not in _clients(nats_cluster, "nats-0")
        print(
            f"nats kill: reconnected {reconnected_at - killed_at:.3f} s after it, "
            f"requests answered again {answered_at - killed_at:.2f} s after it"
        )
        # The request in flight at the kill may be lost (1 s deadline); the next is answered.
        assert answered_at - killed_at < 3.0
    finally:
        await requester.close()
        await responder.close()


def _clients(nats: NatsCluster, server: str) -> list[str]:
    return nats.client_names(server) if nats.process(server).running else []


async def test_a_member_cut_off_from_the_quorum_ends_its_watches(
    etcd_cluster: EtcdCluster, meta_prefix: str
) -> None:
    """Watches ask for a leader (etcd's require-leader flag): the member left alone ends
    them with an error (which moves the client and resumes them elsewhere) instead of
    keeping them open and silent for ever."""
    alone, *others = etcd_cluster.names
    config = _config([etcd_cluster.endpoint_of[alone]], meta_prefix)
    async with await MetaStore.connect(config) as store:
        async with store.watch_prefix("w/") as events:
            for name in others:
                etcd_cluster.kill(name)
            loop = asyncio.get_running_loop()
            cut_at = loop.time()
            with pytest.raises(WatchError) as raised:
                await asyncio.wait_for(_no_events(events), 15)
            ended_s = loop.time() - cut_at
        assert raised.value.retriable
        print(f"etcd member alone: its watch ended {ended_s:.2f} s after losing the quorum")


async def _no_events(events: AsyncIterator[WatchEvent]) -> None:
    async for event in events:
        pytest.fail(f"no write was made, yet {event}")


async def test_a_frozen_nats_server_is_left_after_the_pings(nats_cluster: NatsCluster) -> None:
    """SIGSTOP keeps the connection open and silent: only the pings (ping_interval_s,
    max_outstanding_pings) tell the client to move; with nats-py's default (120 s) it would
    wait minutes."""
    urls = nats_cluster.urls

    async def echo(request: Request) -> bytes:
        return request.body

    responder = await Bus.connect(BusConfig(servers=[urls[2]]), name="responder")
    requester = await Bus.connect(
        BusConfig(servers=[urls[0]], ping_interval_s=0.5, max_outstanding_pings=2),
        name="requester",
    )
    pid = nats_cluster.process("nats-0").pid
    assert pid is not None
    try:
        await responder.serve("t.echo", echo)
        assert "requester" in nats_cluster.client_names("nats-0")
        loop = asyncio.get_running_loop()
        os.kill(pid, signal.SIGSTOP)
        frozen_at = loop.time()
        async with asyncio.timeout(10):
            while requester.reconnects == 0:  # noqa: ASYNC110 (the bus offers no event)
                await asyncio.sleep(0.01)
        moved_s = loop.time() - frozen_at
        assert (await requester.request("t.echo", b"after", timeout_s=2)).body == b"after"
        # Unanswered pings 0.5 s apart, counted past 2: left after about 1.5 s (more when
        # the machine is loaded: the pings are sent by the event loop).
        assert 1.0 <= moved_s <= 8.0, moved_s  # far below the 120 s of nats-py alone
        print(f"nats freeze: the client moved {moved_s:.2f} s after it")
    finally:
        os.kill(pid, signal.SIGCONT)
        await requester.close()
        await responder.close()

"""Ingest at factor 3 / min in-sync 2 on a 3-member etcd cluster and a 3-server NATS cluster
(danube.up.clusters), under a producer: SIGKILL the etcd member the nodes talk to (the
leader, too), then the NATS server the partition's leader is connected to; and the etcd
member again with produce going through discovery's HTTP API. Past the client's failover
time no produce fails, the leader keeps its lease (same epoch), and every acknowledged
offset reads back with its payload (tests/history.py)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from danube.bus import Bus, TopicName
from danube.config import BusConfig
from danube.config.wal_cloud import MetadataConfig
from danube.meta import MetaStore
from danube.up import EtcdCluster, NatsCluster, ProcessSpec
from danube.wire.ingest.client import IngestClient
from tests.history import History

from replication import NODE_ENV, Cluster, Send, TimedProducer, leader, read_all, wait_isr

SpecFactory = Callable[..., ProcessSpec]  # the spec_for fixture of tests/e2e/conftest.py

pytestmark = [pytest.mark.e2e, pytest.mark.fault, pytest.mark.timeout(120)]

P = TopicName("default", "ha-part-0")
NODES = ("ingest-0", "ingest-1", "ingest-2")
# The node lease of production's order (10 s by default) rather than the 2 s of the
# leader-kill tests: what is under test is that the lease survives the member's loss.
LEASE_TTL_S = 5
PRODUCE_TIMEOUT_S = 2.0  # a produce lost with a NATS server costs this, then is sent again
BEFORE_S = 1.0  # producing before the fault
AFTER_S = 6.0  # and after it
# Past this after the fault, no produce may fail (the failover times measured are well
# under it: docs/operations.md).
FAILOVER_BOUND_S = PRODUCE_TIMEOUT_S + 2.0


def _leader_first(etcd: EtcdCluster) -> list[str]:
    first = etcd.leader()
    return [etcd.endpoint_of[first]] + [etcd.endpoint_of[n] for n in etcd.names if n != first]


async def _mesh(
    spec_for: SpecFactory,
    tmp_path: Path,
    etcd: EtcdCluster,
    nats: NatsCluster,
    *,
    discovery: bool = False,
) -> tuple[Cluster, list[str]]:
    endpoints = _leader_first(etcd)
    env = {
        **NODE_ENV,
        "DANUBE_INGEST__LEASE_TTL_S": str(LEASE_TTL_S),
        "DANUBE_DISCOVERY__LEASE_TTL_S": str(LEASE_TTL_S),
        "DANUBE_INGEST__REPLICATION_FACTOR": "3",
        "DANUBE_INGEST__MIN_INSYNC_REPLICAS": "2",
        # Every member and every server, as a deployment names them.
        "DANUBE_WAL_CLOUD__METADATA__ETCD_ENDPOINT": ",".join(endpoints),
        "DANUBE_BUS__SERVERS": json.dumps(nats.urls),
    }
    specs = {node: spec_for("ingest", node, **env) for node in NODES}
    if discovery:
        specs["discovery-0"] = spec_for("discovery", "discovery-0", **env)
    nodes = Cluster(specs, tmp_path)
    await asyncio.gather(*(asyncio.to_thread(nodes.start, node) for node in NODES))
    if discovery:
        await asyncio.to_thread(nodes.start, "discovery-0")
    return nodes, endpoints


async def _run(
    fault: Callable[[], None], client: IngestClient, store: MetaStore, history: History
) -> tuple[TimedProducer, float]:
    """Produce, fault, produce on; the producer and the fault's loop time."""
    producer = TimedProducer(client, P, history, prefix="m", timeout_s=PRODUCE_TIMEOUT_S)
    for _ in range(20):
        await producer.send_one()
    await wait_isr(store, P, 3)
    stop = asyncio.Event()
    running = asyncio.create_task(producer.run(stop))
    await asyncio.sleep(BEFORE_S)
    loop = asyncio.get_running_loop()
    fault_at = loop.time()
    await asyncio.to_thread(fault)
    await asyncio.sleep(AFTER_S)
    stop.set()
    await running
    return producer, fault_at


class HttpProducer:
    """Single-message produces through discovery's HTTP API, one at a time, each retried
    on a retriable answer until acknowledged; every attempt recorded (as TimedProducer)."""

    def __init__(self, http: httpx.AsyncClient, topic: TopicName, history: History) -> None:
        self.http = http
        self.topic = topic
        self.history = history
        self.sends: list[Send] = []
        self.number = 0

    async def send_one(self) -> None:
        msg_id = f"h{self.number}"
        self.number += 1
        path = f"/v1/topics/{self.topic.namespace}/{self.topic.topic}/messages"
        loop = asyncio.get_running_loop()
        while True:
            send = Send(msg_id, loop.time())
            self.sends.append(send)
            try:
                answer = await self.http.post(path, json={"messages": [{"payload": msg_id}]})
            except httpx.HTTPError as exc:
                answer, send.error = None, type(exc).__name__
            send.ended = loop.time()
            if answer is not None and answer.status_code == 200:
                send.offset = answer.json()["results"][0]["offset"]
                self.history.produced(
                    msg_id, partition=str(self.topic), offset=send.offset, acked=True
                )
                return
            if answer is not None:
                assert answer.status_code in (429, 503), answer.text  # retriable only
                send.error = answer.json()["error"]["code"]
            self.history.produced(msg_id, acked=False)
            await asyncio.sleep(0.05)

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            await self.send_one()


def _judge(producer: TimedProducer | HttpProducer, fault_at: float, what: str) -> str:
    failed = [s for s in producer.sends if s.error is not None]
    late = [s for s in failed if s.started > fault_at + FAILOVER_BOUND_S]
    assert not late, f"{what}: produce failed {late[0].started - fault_at:.2f} s after the fault"
    after = [s for s in producer.sends if s.started >= fault_at and s.ended is not None]
    assert after, "nothing was produced after the fault"
    acked = [s for s in after if s.offset is not None]
    longest = max((s.ended or 0) - s.started for s in after)
    answered_again = min(s.ended for s in acked if s.ended is not None) - fault_at
    last_error = max(((s.ended or 0) - fault_at for s in failed), default=0.0)
    return (
        f"{what}: {len(acked)} acked after the fault, {len(failed)} failed attempts "
        f"(last answered {last_error:.2f} s after it), longest produce {longest:.2f} s, "
        f"first ack {answered_again:.2f} s after it"
    )


async def _check_history(client: IngestClient, history: History) -> int:
    offsets = await read_all(client, P, history)
    report = history.check(expect_contiguous_from={str(P): 0})
    assert report.ok, report.summary()
    assert offsets == list(range(len(offsets)))
    return len(offsets)


async def test_losing_the_etcd_member_in_use_under_produce(
    spec_for: SpecFactory,
    tmp_path: Path,
    etcd_cluster: EtcdCluster,
    nats_cluster: NatsCluster,
    meta_prefix: str,
) -> None:
    nodes, endpoints = await _mesh(spec_for, tmp_path, etcd_cluster, nats_cluster)
    in_use = next(n for n in etcd_cluster.names if etcd_cluster.endpoint_of[n] == endpoints[0])
    config = MetadataConfig(etcd_endpoints=endpoints, prefix=meta_prefix)
    history = History()
    bus = await Bus.connect(BusConfig(servers=nats_cluster.urls), name="ha-etcd")
    try:
        async with await MetaStore.connect(config) as store:
            client = IngestClient(bus)
            producer, fault_at = await _run(
                lambda: etcd_cluster.kill(in_use), client, store, history
            )
            before = await leader(store, P)
            summary = _judge(producer, fault_at, f"etcd {in_use} (leader, in use) killed")
            # The leader kept its lease through the failover: no new epoch, same node.
            await asyncio.sleep(LEASE_TTL_S)
            after = await leader(store, P)
            assert (after.node_id, after.epoch) == (before.node_id, before.epoch)
            count = await _check_history(client, history)
        # Every node was talking to the killed member, and moved off it.
        lost = etcd_cluster.endpoint_of[in_use]
        for node in NODES:
            assert f"etcd member {lost} failed" in _logs(tmp_path, node), node
        print(f"{summary}; {count} offsets read back")
    finally:
        await bus.close()
        nodes.stop_all()


async def test_losing_the_nats_server_of_the_leader_under_produce(
    spec_for: SpecFactory,
    tmp_path: Path,
    etcd_cluster: EtcdCluster,
    nats_cluster: NatsCluster,
    meta_prefix: str,
) -> None:
    nodes, endpoints = await _mesh(spec_for, tmp_path, etcd_cluster, nats_cluster)
    config = MetadataConfig(etcd_endpoints=endpoints, prefix=meta_prefix)
    history = History()
    setup = await Bus.connect(BusConfig(servers=nats_cluster.urls), name="ha-setup")
    async with await MetaStore.connect(config) as store:
        await TimedProducer(IngestClient(setup), P, history, prefix="w").send_one()
        owner = await leader(store, P)
    await setup.close()
    server = next(
        name for name in nats_cluster.names if owner.node_id in nats_cluster.client_names(name)
    )
    # The producer on the same server as the leader: both lose their connection. It names
    # that one server; the cluster's INFO tells it the others (where it reconnects).
    bus = await Bus.connect(BusConfig(servers=[nats_cluster.url_of[server]]), name="ha-nats")
    try:
        assert "ha-nats" in nats_cluster.client_names(server)
        async with await MetaStore.connect(config) as store:
            client = IngestClient(bus)
            producer, fault_at = await _run(
                lambda: nats_cluster.kill(server), client, store, history
            )
            summary = _judge(producer, fault_at, f"nats {server} (the leader's) killed")
            assert server not in [
                name for name in nats_cluster.names if owner.node_id in _names(nats_cluster, name)
            ]
            count = await _check_history(client, history)
        print(f"{summary}; {count} offsets read back")
    finally:
        await bus.close()
        nodes.stop_all()


async def test_losing_the_etcd_member_in_use_under_http_produce(
    spec_for: SpecFactory,
    tmp_path: Path,
    etcd_cluster: EtcdCluster,
    nats_cluster: NatsCluster,
    meta_prefix: str,
) -> None:
    """The same through discovery, which reads topic configs from etcd on the produce path
    (cached: docs/configuration.md, topic_cache_ttl_s)."""
    nodes, endpoints = await _mesh(spec_for, tmp_path, etcd_cluster, nats_cluster, discovery=True)
    in_use = next(n for n in etcd_cluster.names if etcd_cluster.endpoint_of[n] == endpoints[0])
    topic = TopicName("default", "ha-http")  # auto-created, not partitioned
    history = History()
    url = f"http://127.0.0.1:{nodes.specs['discovery-0'].port}"
    bus = await Bus.connect(BusConfig(servers=nats_cluster.urls), name="ha-http")
    config = MetadataConfig(etcd_endpoints=endpoints, prefix=meta_prefix)
    try:
        async with (
            httpx.AsyncClient(base_url=url, timeout=10) as http,
            await MetaStore.connect(config) as store,
        ):
            producer = HttpProducer(http, topic, history)
            for _ in range(20):
                await producer.send_one()
            await wait_isr(store, topic, 3)
            before = await leader(store, topic)
            stop = asyncio.Event()
            running = asyncio.create_task(producer.run(stop))
            await asyncio.sleep(BEFORE_S)
            fault_at = asyncio.get_running_loop().time()
            await asyncio.to_thread(etcd_cluster.kill, in_use)
            await asyncio.sleep(AFTER_S)
            stop.set()
            await running
            summary = _judge(producer, fault_at, f"etcd {in_use} killed, produce over HTTP")
            await asyncio.sleep(LEASE_TTL_S)
            after = await leader(store, topic)
            assert (after.node_id, after.epoch) == (before.node_id, before.epoch)
            offsets = await read_all(IngestClient(bus), topic, history)
        report = history.check(expect_contiguous_from={str(topic): 0})
        assert report.ok, report.summary()
        assert offsets == list(range(len(offsets)))
        lost = etcd_cluster.endpoint_of[in_use]
        for node in (*NODES, "discovery-0"):
            assert f"etcd member {lost} failed" in _logs(tmp_path, node), node
        print(f"{summary}; {len(offsets)} offsets read back")
    finally:
        await bus.close()
        nodes.stop_all()


def _names(nats: NatsCluster, server: str) -> list[str]:
    return nats.client_names(server) if nats.process(server).running else []


def _logs(log_dir: Path, node: str) -> str:
    return "".join(path.read_text() for path in log_dir.glob(f"{node}-*.log"))

"""The network fault harness's mesh and run (docs/chaos.md): etcd, nats-server and each ingest
node in a network namespace of its own (tests/netlab.py), producers in the hub (the root
namespace) recording every attempt, a schedule (tests/chaos.py) applied then healed, every
partition read back and the history judged (tests/history.py)."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import sys
import time
import uuid
from collections.abc import AsyncIterator, Callable, Coroutine, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from danube.bus import Bus, NoRespondersError, TopicName
from danube.config import BusConfig, MetadataConfig
from danube.errors import DanubeError
from danube.frame import decode_record
from danube.meta import MetaStore
from danube.meta import keys as meta_keys
from danube.meta.records import Owner, PartitionState
from danube.up import ProcessSpec, ServerProcess
from danube.up.clusters import EtcdCluster, NatsCluster
from danube.wire.ingest.client import IngestClient
from tests.chaos import RunResult, Schedule, Step
from tests.history import History, Report
from tests.netlab import HUB, Lab
from tests.walfiles import segment_frames

from chaosload import Load
from replication import NODE_ENV

log = logging.getLogger(__name__)

NATS_PORT, NATS_MONITOR_PORT, NATS_ROUTE_PORT = 4222, 8222, 6222
ETCD_CLIENT_PORT, ETCD_PEER_PORT = 2379, 2380
INGEST_HEALTH_PORT = 9100
RELAY_BASE_PORT = 14000  # a host's relay to dependency member i listens on 127.0.0.1:base+i
WARMUP_S = 2.0  # load before the faults start
ISR_WAIT_S = 45.0  # after healing, the ISR must be whole again within this
READ_WAIT_S = 30.0  # a read-back waits this long for a serving leader
CONTROL = "ingest"
HUB_PING_INTERVAL_S = 1.0


@dataclass(frozen=True)
class Topology:
    """What runs where: the dependency topology is a parameter (one etcd member and one NATS
    server by default; clusters of either, every client given every member)."""

    etcd_members: int = 1
    nats_servers: int = 1
    ingest_nodes: int = 3
    factor: int = 3
    min_insync: int = 2
    partitions: int = 2
    producers_per_partition: int = 2

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> Topology:
        """The default topology, with ``DANUBE_CHAOS_ETCD`` / ``DANUBE_CHAOS_NATS`` members
        when set (`make chaos CHAOS_NATS=3`)."""
        return cls(
            etcd_members=int(env.get("DANUBE_CHAOS_ETCD") or 1),
            nats_servers=int(env.get("DANUBE_CHAOS_NATS") or 1),
        ).validate()

    def validate(self) -> Topology:
        if (
            not 1 <= self.etcd_members <= 5
            or not 1 <= self.nats_servers <= 5
            or self.ingest_nodes < self.factor
        ):
            raise ValueError(f"bad topology: {self}")
        return self

    @property
    def etcd_hosts(self) -> list[str]:
        return [f"etcd-{i}" for i in range(self.etcd_members)]

    @property
    def nats_hosts(self) -> list[str]:
        return [f"nats-{i}" for i in range(self.nats_servers)]

    @property
    def ingest_hosts(self) -> list[str]:
        return [f"ingest-{i}" for i in range(self.ingest_nodes)]


@dataclass
class NetMesh:
    """The processes of one run, each in its host's namespace; ``delay_relays``: ingest nodes
    reach NATS and etcd through tests/netdelay.py in their own namespace."""

    lab: Lab
    topology: Topology
    tmp: Path
    delay_relays: bool = False
    prefix: str = field(default_factory=lambda: f"/chaos-{uuid.uuid4().hex[:10]}")
    processes: list[ServerProcess] = field(default_factory=list)
    etcd: EtcdCluster | None = None
    nats: NatsCluster | None = None

    def start(self) -> None:
        """Hosts first, then etcd, NATS, the relays and the ingest nodes (in parallel)."""
        t = self.topology
        for name in [*t.etcd_hosts, *t.nats_hosts, *t.ingest_hosts]:
            self.lab.add_host(name)
        # Each member in its host's namespace (wrap), at its host's address, fixed ports;
        # kept in self.processes as soon as it runs, so stop() stops it whatever fails next.
        self.etcd = EtcdCluster.plan(
            self.tmp / "etcd",
            size=t.etcd_members,
            hosts=[self.lab.address(h) for h in t.etcd_hosts],
            client_ports=[ETCD_CLIENT_PORT] * t.etcd_members,
            peer_ports=[ETCD_PEER_PORT] * t.etcd_members,
            wrap=self._in,
        )
        self.nats = NatsCluster.plan(
            self.tmp / "nats",
            size=t.nats_servers,
            hosts=[self.lab.address(h) for h in t.nats_hosts],
            client_ports=[NATS_PORT] * t.nats_servers,
            cluster_ports=[NATS_ROUTE_PORT] * t.nats_servers,
            monitor_ports=[NATS_MONITOR_PORT] * t.nats_servers,
            wrap=self._in,
        )
        try:
            self.etcd.start_all()
        finally:
            self.processes += self._started(self.etcd.names, self.etcd.process)
        try:
            self.nats.start_all()
        finally:
            self.processes += self._started(self.nats.names, self.nats.process)
        if self.delay_relays:
            for name in t.ingest_hosts:
                for spec in self._relays(name):
                    self._start(spec)
        specs = [self._ingest(name) for name in t.ingest_hosts]
        started = [ServerProcess(s, self.tmp / f"{s.name}.log") for s in specs]
        self.processes += started
        for process in started:  # all at once: each takes seconds to import and connect
            process.launch()
        for process in started:
            process.wait_ready()

    def stop(self) -> None:
        for process in reversed(self.processes):
            process.stop()

    @staticmethod
    def _started(names: list[str], process: Callable[[str], ServerProcess]) -> list[ServerProcess]:
        found: list[ServerProcess] = []
        for name in names:
            with contextlib.suppress(KeyError):  # never launched
                found.append(process(name))
        return found

    # --- addresses ------------------------------------------------------------------

    def nats_urls(self) -> list[str]:
        """How the hub reaches NATS."""
        return [f"nats://{self.lab.address(h)}:{NATS_PORT}" for h in self.topology.nats_hosts]

    def etcd_endpoints(self) -> list[str]:
        """How the hub reaches etcd: every member."""
        return [f"{self.lab.address(h)}:{ETCD_CLIENT_PORT}" for h in self.topology.etcd_hosts]

    def etcd_leader(self) -> str:
        """The etcd member that leads now (the only one with one member)."""
        assert self.etcd is not None
        return self.etcd.leader() if self.topology.etcd_members > 1 else self.etcd.names[0]

    def nats_server_of(self, client: str) -> str:
        """The NATS server the client named ``client`` is connected to (the first server
        when none says so)."""
        assert self.nats is not None
        for name in self.nats.names:
            with contextlib.suppress(OSError):
                if client in self.nats.client_names(name):
                    return name
        return self.nats.names[0]

    def set_delay(self, host: str, delay_ms: int) -> None:
        """The delay the host's relays add (tests/netdelay.py reads it within ~50 ms)."""
        if not self.delay_relays:
            raise RuntimeError("delay needs the mesh started with delay_relays=True")
        (self.tmp / f"delay-{host}").write_text(str(delay_ms))

    def replica_log(self, host: str, partition: TopicName) -> dict[int, str]:
        """The message id at each offset of ``host``'s WAL of ``partition``, read from its
        segment files (stop the mesh first: a live tail may be cut mid-frame, which is
        left out, as are the zeros an open segment is allocated ahead with)."""
        directory = self.tmp / "wal" / host / partition.namespace / partition.topic
        log: dict[int, str] = {}
        for segment in sorted(directory.glob("*.wal")):
            for frame in segment_frames(segment):
                log[frame.offset] = decode_record(frame.payload).payload.decode()
        return log

    # --- specs ---------------------------------------------------------------------

    def _start(self, spec: ProcessSpec) -> None:
        process = ServerProcess(spec, self.tmp / f"{spec.name}.log")
        self.processes.append(process)
        process.start()

    def _in(self, host: str, spec: ProcessSpec) -> ProcessSpec:
        """``spec`` run in ``host``'s namespace, named after the host."""
        return dataclasses.replace(spec, name=host, argv=self.lab.hosts[host].command(spec.argv))

    def _relays(self, host: str) -> list[ProcessSpec]:
        relay = str(Path(__file__).resolve().parents[1] / "netdelay.py")
        control = str(self.tmp / f"delay-{host}")
        targets = [
            *(f"{self.lab.address(h)}:{NATS_PORT}" for h in self.topology.nats_hosts),
            *(f"{self.lab.address(h)}:{ETCD_CLIENT_PORT}" for h in self.topology.etcd_hosts),
        ]
        return [
            self._in(
                host,
                ProcessSpec(
                    f"relay-{host}-{i}",
                    [sys.executable, relay, f"127.0.0.1:{RELAY_BASE_PORT + i}", target, control],
                ),
            )
            for i, target in enumerate(targets)
        ]

    def _ingest(self, host: str) -> ProcessSpec:
        t = self.topology
        address = self.lab.address(host)
        if self.delay_relays:
            nats = [f"nats://127.0.0.1:{RELAY_BASE_PORT + i}" for i in range(t.nats_servers)]
            first = RELAY_BASE_PORT + t.nats_servers
            etcd = [f"127.0.0.1:{first + i}" for i in range(t.etcd_members)]
        else:
            nats, etcd = self.nats_urls(), self.etcd_endpoints()
        env = {
            **NODE_ENV,
            "DANUBE_NODE_ID": host,
            "DANUBE_BUS__SERVERS": json.dumps(nats),
            "DANUBE_WAL_CLOUD__METADATA__ETCD_ENDPOINTS": json.dumps(etcd),
            "DANUBE_WAL_CLOUD__METADATA__PREFIX": self.prefix,
            "DANUBE_WAL_CLOUD__WAL__DIR": str(self.tmp / "wal" / host),
            "DANUBE_INGEST__HOST": address,
            "DANUBE_INGEST__METRICS_PORT": str(INGEST_HEALTH_PORT),
            "DANUBE_INGEST__REPLICATION_FACTOR": str(t.factor),
            "DANUBE_INGEST__MIN_INSYNC_REPLICAS": str(t.min_insync),
        }
        argv = [sys.executable, "-m", "danube.ingest"]
        ready = f"http://{address}:{INGEST_HEALTH_PORT}/readyz"
        return self._in(host, ProcessSpec(host, argv, INGEST_HEALTH_PORT, env=env, ready_url=ready))


# --- one run -------------------------------------------------------------------------


@dataclass
class RunOutcome:
    """A run's result row, the checker's report and where its history was written."""

    result: RunResult
    report: Report
    history_path: Path
    read_back: dict[str, list[int]]
    served: dict[str, dict[int, str]]  # per partition, the message at each offset read back
    isr_whole: bool
    latency_p50_s: float  # the watched partition's, while the faults were on


async def run_schedule(
    mesh: NetMesh, schedule: Schedule, *, run: int = 1, watch: int = 0
) -> RunOutcome:
    """Load, faults (roles resolved against partition ``watch``'s leader when they start),
    heal, settle, stop the load, wait for whole ISRs, read everything back, judge."""
    t = mesh.topology
    partitions = [TopicName("default", f"chaos-part-{i}") for i in range(t.partitions)]
    # The producers' client notices a silent server within ~2 s (1 s pings, 2 outstanding)
    # and moves to another: what is measured is the mesh, not a client's 10-15 s default.
    config = BusConfig(servers=mesh.nats_urls(), ping_interval_s=HUB_PING_INTERVAL_S)
    bus = await Bus.connect(config, name="chaos-load")
    store = await MetaStore.connect(
        MetadataConfig(etcd_endpoints=mesh.etcd_endpoints(), prefix=mesh.prefix)
    )
    load = Load(IngestClient(bus), partitions, t.producers_per_partition)
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    leaders: list[str] = []
    try:
        async with (
            _background(load.run(stop)) as producing,
            _background(_watch_leader(store, partitions[watch], leaders)),
        ):
            await _wait_isr(store, partitions, t.factor, timeout_s=ISR_WAIT_S)
            await asyncio.sleep(WARMUP_S)
            leader = (await _owner(store, partitions[watch])).node_id
            started = loop.time()
            async with _background(_apply(mesh, schedule, leader, started)) as faults:
                await asyncio.sleep(max(0.0, started + schedule.duration_s - loop.time()))
                ended = loop.time()
                await faults
            stop.set()
            await producing
        isr_whole = await _wait_isr(store, partitions, t.factor, timeout_s=ISR_WAIT_S, strict=False)
        served = {str(p): await _read_all(IngestClient(bus), p, load.history) for p in partitions}
    finally:
        stop.set()
        await store.close()
        await bus.close()
    read_back = {p: list(messages) for p, messages in served.items()}
    report = load.history.check(expect_contiguous_from={str(p): 0 for p in partitions})
    unavailable = load.unavailable_s(started, ended)
    history_path = mesh.tmp / f"history-{schedule.name}-{run}.jsonl"
    load.history.dump(history_path)
    with (mesh.tmp / f"attempts-{schedule.name}-{run}.jsonl").open("w") as out:
        out.writelines(json.dumps(dataclasses.asdict(a)) + "\n" for a in load.attempts)
    acked = {p.msg_id for p in load.history.produces if p.acked}
    result = RunResult(
        schedule=schedule.name,
        run=run,
        acknowledged=len(acked),
        lost=len(report.lost),
        conflicting=len(report.conflicts),
        unavailable_s=round(max(unavailable.values()), 2),
        attempts=len(load.attempts),
        errors=sum(a.outcome == "error" for a in load.attempts),
        timeouts=sum(a.outcome == "timeout" for a in load.attempts),
        read_back=sum(len(o) for o in read_back.values()),
        leaders=leaders,
        notes=" ".join(f"{p}={s:.2f}s" for p, s in unavailable.items())
        + ("" if isr_whole else " ISR not whole after healing"),
    )
    faulted = schedule.steps[-1].at_s  # the last step heals
    latency = load.latency_p50_s(partitions[watch], started, started + faulted)
    result.notes += f" p50 while faulted {latency * 1000:.0f} ms"
    return RunOutcome(result, report, history_path, read_back, served, isr_whole, latency)


def resolve(mesh: NetMesh, role: str, leader: str) -> list[str]:
    """The hosts a schedule's role names in this run."""
    t = mesh.topology
    named = {
        "leader": [leader],
        "followers": [h for h in t.ingest_hosts if h != leader],
        "etcd": t.etcd_hosts,
        "nats": t.nats_hosts,
        # One member of a cluster: etcd's raft leader (an election follows), the NATS server
        # the watched leader is connected to (its clients must fail over).
        "etcd-one": [mesh.etcd_leader()] if role == "etcd-one" else [],
        "nats-one": [mesh.nats_server_of(leader)] if role == "nats-one" else [],
        "hub": [HUB],
    }
    return named[role]


async def _apply(mesh: NetMesh, schedule: Schedule, leader: str, started: float) -> None:
    """Apply the steps at their times (a command each, off the loop: the load goes on)."""
    loop = asyncio.get_running_loop()
    for step in schedule.steps:
        await asyncio.sleep(max(0.0, started + step.at_s - loop.time()))
        await asyncio.to_thread(_do, mesh, step, leader)
        log.info("chaos %s +%.1fs: %s", schedule.name, loop.time() - started, step)


def _do(mesh: NetMesh, step: Step, leader: str) -> None:
    peers = [h for role in step.peers for h in resolve(mesh, role, leader)]
    for host in resolve(mesh, step.host, leader):
        if step.op == "cut":
            mesh.lab.cut(host, peers)
        elif step.op == "loss":
            mesh.lab.loss(host, step.value, peers)
        elif step.op == "delay":
            mesh.set_delay(host, step.value)
        else:
            mesh.lab.heal(host)
            if mesh.delay_relays and host in mesh.topology.ingest_hosts:
                mesh.set_delay(host, 0)


@contextlib.asynccontextmanager
async def _background(coro: Coroutine[object, object, None]) -> AsyncIterator[asyncio.Task[None]]:
    """Run ``coro`` while the block runs; cancelled at its end unless done by then."""
    task = asyncio.create_task(coro)
    try:
        yield task
    finally:
        if not task.done():
            task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def _owner(store: MetaStore, partition: TopicName) -> Owner:
    async with asyncio.timeout(ISR_WAIT_S):
        while True:
            owner = await store.get_model(meta_keys.partition_owner_key(partition), Owner)
            if owner is not None:
                return owner
            await asyncio.sleep(0.05)


async def _watch_leader(store: MetaStore, partition: TopicName, leaders: list[str]) -> None:
    """Note every leader (node@epoch) of the watched partition, in order."""
    while True:
        try:
            owner = await store.get_model(meta_keys.partition_owner_key(partition), Owner)
        except Exception:  # etcd cut off: nothing to note
            owner = None
        if owner is not None:
            seen = f"{owner.node_id}@{owner.epoch}"
            if not leaders or leaders[-1] != seen:
                leaders.append(seen)
        await asyncio.sleep(0.2)


async def _wait_isr(
    store: MetaStore,
    partitions: list[TopicName],
    size: int,
    *,
    timeout_s: float,
    strict: bool = True,
) -> bool:
    """Wait until every partition has a leader and ``size`` in-sync replicas; ``strict``:
    raise when time runs out, else answer False."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        whole = True
        for p in partitions:
            with contextlib.suppress(Exception):
                state = await store.get_model(meta_keys.partition_state_key(p), PartitionState)
                owner = await store.get_model(meta_keys.partition_owner_key(p), Owner)
                if state is not None and owner is not None and len(state.isr) == size:
                    continue
            whole = False
        if whole:
            return True
        await asyncio.sleep(0.1)
    if strict:
        raise TimeoutError(f"ISR of {size} not reached in {timeout_s}s")
    return False


async def _read_all(client: IngestClient, partition: TopicName, history: History) -> dict[int, str]:
    """Every message of the partition from offset 0 to its high watermark, in order, each
    recorded as a delivery (a fetch is retried while no leader serves, up to READ_WAIT_S)."""
    messages: dict[int, str] = {}
    offset = 0
    while True:
        async with asyncio.timeout(READ_WAIT_S):
            while True:
                try:
                    reply = await client.fetch(partition, offset, max_count=5000)
                    break
                except (NoRespondersError, DanubeError, TimeoutError):
                    await asyncio.sleep(0.1)
        for frame in reply.frames:
            msg_id = decode_record(frame.payload).payload.decode()
            history.delivered(msg_id, partition=str(partition), offset=frame.offset)
            messages[frame.offset] = msg_id
        if reply.next_offset == offset:
            return messages
        offset = reply.next_offset

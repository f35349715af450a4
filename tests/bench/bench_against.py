"""This tree against an earlier commit, in one run: the commit checked out in a temporary
worktree, and each round a fresh bench mesh of each tree (one ingest and one discovery, plus
a dispatcher for ``e2e``), one at a time, the order swapped every round, ``danube bench`` of
that tree against it; medians of the rounds, and of each round's ratio (this tree ÷ the
commit). One mesh at a time: two side by side measured the one started first 10-30 % slower
with the same code (an A/A run: ``--commit HEAD``).

- ``produce`` (the default): one message at a time, ``danube bench produce --batch-size 1
  --linger-ms 0 --inflight 1 --sync -n COUNT`` (1 KiB, fsync before ack), with JetStream's
  sync publish (``sync_interval: always``) after each pair for the ratio issue 33 names;
- ``e2e``: ``danube bench e2e --rate RATE -d 8``;

each with every process's CPU per message. ``--tree-env KEY=VALUE`` sets a variable for this
tree's services only (a switch a prototype reads).

Run: ``.venv/bin/python tests/bench/bench_against.py --commit 8c4c50a [--kind e2e]
[--rounds 6] [--count 2000] [--rate 1000]``. Not collected by pytest.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import tempfile
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import bench_peers as peers
import nats
import uvloop

from mesh import bench_mesh

ROOT = Path(__file__).resolve().parents[2]
SOURCES = ("libs", "services", "spark_jobs")
ONE_AT_A_TIME = ["--batch-size", "1", "--linger-ms", "0", "--inflight", "1", "--sync"]
WARM_UP = 300


def python_path(tree: Path) -> str:
    """The tree's own packages first: ahead of the editable install's paths."""
    return ":".join(str(tree / source) for source in SOURCES)


async def bench(kind: str, url: str, tree: Path, args: list[str]) -> dict[str, Any]:
    """``danube bench <kind>`` of ``tree`` (its CLI and client) against ``url``."""
    env = {**os.environ, "PYTHONPATH": python_path(tree)}
    return await peers.danube_bench(kind, url, args, env=env)


Sides = dict[str, tuple[Path, dict[str, str]]]  # name: its tree, its services' extra env
Row = dict[str, tuple[float, float]]  # name: p50, p99 (ms)


async def measure_side(
    tree: Path, env: dict[str, str], tmp: Path, kind: str, args: list[str]
) -> tuple[float, float, dict[str, float]]:
    """A fresh mesh of ``tree``, warmed up, then one run of ``kind``: p50, p99 and the CPU
    per message of each process (the client's as ``client``). One mesh at a time: two side
    by side measured the one started first ~10-30 % slower with the same code."""
    services = ["ingest", "dispatcher", "discovery"] if kind == "e2e" else ["ingest", "discovery"]
    pids: dict[str, int] = {}
    mesh_env = {"PYTHONPATH": python_path(tree), **env}
    async with bench_mesh(tmp, services, mesh_env, pids=pids) as http:
        url = str(http.base_url)
        warm = (
            ["--rate", "1000", "-n", "500"]
            if kind == "e2e"
            else [*ONE_AT_A_TIME, "-n", str(WARM_UP)]
        )
        await bench(kind, url, tree, warm)
        before = {name: peers.cpu_s(pid) for name, pid in pids.items()}
        client_before = peers.children_cpu_s()
        result = await bench(kind, url, tree, args)
        messages = int(result["messages"])
        cpu = {
            name.removeprefix("bench-"): (peers.cpu_s(pid) - before[name]) / messages * 1e6
            for name, pid in pids.items()
        }
        cpu["client"] = (peers.children_cpu_s() - client_before) / messages * 1e6
        return float(result["latency_ms"]["p50"]), float(result["latency_ms"]["p99"]), cpu


async def rounds_of(sides: Sides, kind: str, rounds: int, args: list[str], tmp: Path) -> list[Row]:
    """``rounds`` rounds, each side once per round (the order swapped every round), and for
    ``produce`` JetStream's sync publish after each pair."""
    jetstream = peers.jetstream_server(tmp) if kind == "produce" else None
    async with AsyncExitStack() as stack:
        js = None
        if jetstream is not None:
            stack.enter_context(jetstream)
            client = await nats.connect(f"nats://127.0.0.1:{jetstream.spec.port}")
            stack.push_async_callback(client.close)
            js = client.jetstream()
            await peers.js_sync(js, WARM_UP)
        rows = []
        for index in range(rounds):
            row: Row = {}
            for name in sorted(sides, reverse=index % 2 == 1):
                tree, env = sides[name]
                p50, p99, cpu = await measure_side(tree, env, tmp / f"{name}-{index}", kind, args)
                row[name] = (p50, p99)
                shown = {key: round(value) for key, value in cpu.items()}
                print(f"  {name}: CPU µs per message {shown}, total {round(sum(cpu.values()))}")
            if js is not None:
                count = int(args[args.index("-n") + 1])
                peer = await peers.js_sync(js, count)
                row["jetstream"] = (peer["p50_ms"], peer["p99_ms"])
            print(_line(index, row), flush=True)
            rows.append(row)
        return rows


def _line(index: int, row: Row) -> str:
    cells = " | ".join(f"{name} p50 {p50:.3f} p99 {p99:.3f} ms" for name, (p50, p99) in row.items())
    return (
        f"round {index + 1}: {cells} | this / commit p50 x{row['tree'][0] / row['commit'][0]:.3f}"
    )


def report(rows: list[Row]) -> None:
    for name in rows[0]:
        p50 = statistics.median(row[name][0] for row in rows)
        p99 = statistics.median(row[name][1] for row in rows)
        print(f"median {name}: p50 {p50:.3f} ms, p99 {p99:.3f} ms")
    for i, q in enumerate(("p50", "p99")):
        ratio = statistics.median(row["tree"][i] / row["commit"][i] for row in rows)
        print(f"this tree / the commit, {q}: x{ratio:.3f} (median of the rounds' ratios)")
    if "jetstream" in rows[0]:
        for name in ("commit", "tree"):
            ratio = statistics.median(row[name][0] / row["jetstream"][0] for row in rows)
            print(f"{name} / JetStream sync publish, p50: {ratio:.2f}x")


def run(
    commit: str, kind: str, rounds: int, count: int, rate: int, tree_env: dict[str, str]
) -> None:
    """Check ``commit`` out in a temporary worktree, measure, report, remove it."""
    with tempfile.TemporaryDirectory(prefix="danube-against-") as name:
        tmp = Path(name)
        worktree = tmp / "commit"
        git = ["git", "-C", str(ROOT), "worktree"]
        subprocess.run([*git, "add", "--detach", str(worktree), commit], check=True)
        try:
            sides: Sides = {"commit": (worktree, {}), "tree": (ROOT, tree_env)}
            if kind == "e2e":
                args = ["--rate", str(rate), "-d", "8"]
            else:
                args = [*ONE_AT_A_TIME, "-n", str(count)]
            report(uvloop.run(rounds_of(sides, kind, rounds, args, tmp)))
        finally:
            subprocess.run([*git, "remove", "--force", str(worktree)], check=False)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--commit", required=True, help="the commit to measure this tree against")
    parser.add_argument("--kind", choices=("produce", "e2e"), default="produce")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--count", type=int, default=2000, help="messages per produce run")
    parser.add_argument("--rate", type=int, default=1000, help="msg/s of an e2e run")
    parser.add_argument(
        "--tree-env",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a variable for this tree's services only (a switch a prototype reads)",
    )
    options = parser.parse_args()
    tree_env = dict(item.split("=", 1) for item in options.tree_env)
    run(options.commit, options.kind, options.rounds, options.count, options.rate, tree_env)

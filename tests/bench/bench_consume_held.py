"""Ack-each consume of two code trees on meshes held up side by side: per run a fresh topic of
each mesh is filled with N messages of 1 KiB (untimed), then consumed from the earliest offset
acking each (what ``danube bench consume`` does), the trees alternating; the rate and every
process's CPU per message of the consume alone, medians printed. Run::

    .venv/bin/python tests/bench/bench_consume_held.py BASE_DIR THIS_DIR [--runs 3] [-n 50000]

Each tree (e.g. ``git archive <commit> libs services | tar -x -C DIR``) runs its own mesh
(ingest, dispatcher, discovery, nats, etcd: mesh.py) and its own client, with ``PYTHONPATH``
at its ``libs`` and ``services``. CPU: utime + stime of each mesh process from
``/proc/<pid>/stat`` around the consume; the client's own ``time.process_time()`` from attach
to the last ack answered (so without its start-up). ``--hold S`` keeps the meshes up for S
seconds after the runs (printing their URLs and pids) for a profiler.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from bench_peers import cpu_s

from mesh import bench_mesh

SERVICES = ("ingest", "dispatcher", "discovery")

# The consumer of bench_consume without its fill: attach earliest, ack each, flush the acks.
CONSUMER = """
import asyncio, json, sys, time
from danube.client import AsyncDanubeClient

async def main(url, topic, count):
    async with AsyncDanubeClient(url) as client:
        cpu = time.process_time()
        started = time.monotonic()
        async with client.consumer(topic, "bench", start="earliest") as consumer:
            seen = set()
            while len(seen) < count:
                message = await consumer.receive(30.0)
                message.ack()
                seen.add((message.partition, message.offset))
            elapsed = time.monotonic() - started
            await consumer.flush_acks()
            cpu = time.process_time() - cpu
    print(json.dumps({"msgs_per_s": count / elapsed, "client": cpu * 1e6 / count}))

asyncio.run(main(sys.argv[1], sys.argv[2], int(sys.argv[3])))
"""


def _env(tree: Path) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": f"{tree / 'libs'}:{tree / 'services'}"}


async def _run(command: list[str], env: dict[str, str]) -> str:
    out = await asyncio.to_thread(
        subprocess.run, command, capture_output=True, text=True, check=False, env=env
    )
    if out.returncode != 0:
        raise SystemExit(f"{command[:4]} failed: {out.stderr[-2000:]}")
    return out.stdout


async def one_run(
    tree: Path, url: str, pids: dict[str, int], topic: str, count: int
) -> dict[str, float]:
    """Fill ``topic`` (untimed), then consume it; msg/s and CPU µs per message."""
    env = _env(tree)
    main = "from danube.cli.main import main; main()"
    fill = ["bench", "produce", "-s", url, "-t", topic, "-n", str(count), "--size", "1024"]
    await _run([sys.executable, "-c", main, *fill, "--inflight", "4", "--json"], env)
    before = {name: cpu_s(pid) for name, pid in pids.items()}
    out = await _run([sys.executable, "-c", CONSUMER, url, topic, str(count)], env)
    after = {name: cpu_s(pid) for name, pid in pids.items()}
    result: dict[str, float] = json.loads(out)
    for name in pids:
        result[name] = (after[name] - before[name]) * 1e6 / count
    result["all"] = sum(v for k, v in result.items() if k != "msgs_per_s")
    return {k: round(v, 2) for k, v in result.items()}


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("base", type=Path)
    parser.add_argument("this", type=Path)
    parser.add_argument("-n", type=int, default=50_000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--hold", type=float, default=0.0)
    args = parser.parse_args()
    trees = {"base": args.base.resolve(), "this": args.this.resolve()}
    runs: dict[str, list[dict[str, float]]] = {name: [] for name in trees}
    meshes: dict[str, tuple[str, dict[str, int]]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        async with contextlib.AsyncExitStack() as stack:
            for name, tree in trees.items():
                pids: dict[str, int] = {}
                os.environ["PYTHONPATH"] = _env(tree)["PYTHONPATH"]
                http = await stack.enter_async_context(
                    bench_mesh(Path(tmp) / name, SERVICES, pids=pids)
                )
                meshes[name] = (str(http.base_url), pids)
                print(name, meshes[name], flush=True)
            for index in range(args.runs):
                order = list(trees) if index % 2 == 0 else list(trees)[::-1]
                for name in order:
                    url, pids = meshes[name]
                    topic = f"/default/held-{index}"
                    result = await one_run(trees[name], url, pids, topic, args.n)
                    runs[name].append(result)
                    print(name, json.dumps(result), flush=True)
            for name, results in runs.items():
                if results:
                    medians = {k: statistics.median(r[k] for r in results) for k in results[0]}
                    print("median", name, json.dumps(medians), flush=True)
            if args.hold:
                print("holding", json.dumps(meshes), flush=True)
                await asyncio.sleep(args.hold)


if __name__ == "__main__":
    asyncio.run(main())

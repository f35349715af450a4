"""The dispatcher's CPU per message of `danube bench consume -n N` (1 KiB, ack each, binary
stream; the fill included, which costs the dispatcher little: no subscription reads it yet),
of two code trees in one window, runs alternating, each on a fresh mesh, the medians printed.
Run::

    .venv/bin/python tests/bench/bench_dispatcher_cpu.py BASE_DIR THIS_DIR [--runs 3] [-n 50000]

Each tree runs with ``PYTHONPATH`` pointing at its ``libs`` and ``services`` (e.g. ``git
archive <commit> | tar -x -C DIR``). Every process of the mesh is reported (utime + stime from
``/proc/<pid>/stat`` around the whole command, µs per message), with the consume rate.
"""

from __future__ import annotations

import argparse
import asyncio
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


async def one_run(tree: Path, count: int) -> dict[str, float]:
    """µs of CPU per message of each mesh process, and msg/s, for one consume of ``tree``."""
    os.environ["PYTHONPATH"] = f"{tree / 'libs'}:{tree / 'services'}"
    pids: dict[str, int] = {}
    with tempfile.TemporaryDirectory() as tmp:
        async with bench_mesh(Path(tmp), SERVICES, pids=pids) as http:
            before = {name: cpu_s(pid) for name, pid in pids.items()}
            main = "from danube.cli.main import main; main()"
            command = [sys.executable, "-c", main, "bench", "consume", "-n", str(count)]
            args = ["-s", str(http.base_url), "--size", "1024", "--json"]
            out = await asyncio.to_thread(
                subprocess.run, [*command, *args], capture_output=True, text=True, check=False
            )
            if out.returncode != 0:
                raise SystemExit(f"bench failed: {out.stderr[-2000:]}")
            after = {name: cpu_s(pid) for name, pid in pids.items()}
    result = {name: round((after[name] - before[name]) * 1e6 / count, 2) for name in pids}
    return {"msgs_per_s": float(json.loads(out.stdout)["msgs_per_s"]), **result}


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("base", type=Path)
    parser.add_argument("this", type=Path)
    parser.add_argument("-n", type=int, default=50_000)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    trees = {"base": args.base, "this": args.this}
    runs: dict[str, list[dict[str, float]]] = {name: [] for name in trees}
    for index in range(args.runs):
        order = list(trees) if index % 2 == 0 else list(trees)[::-1]
        for name in order:
            result = await one_run(trees[name], args.n)
            runs[name].append(result)
            print(name, json.dumps(result), flush=True)
    for name, results in runs.items():
        medians = {key: statistics.median(r[key] for r in results) for key in results[0]}
        print("median", name, json.dumps(medians))


if __name__ == "__main__":
    asyncio.run(main())

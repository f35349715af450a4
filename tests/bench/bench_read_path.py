"""`danube bench consume` (1 KiB, ack each), or `danube bench e2e --rate R -d 5`, of two code
trees in one window: this checkout and ``--base`` (another tree of the project, e.g.
``git archive <commit> | tar -x -C DIR``), runs alternating, each on a fresh mesh (ingest,
dispatcher, discovery as processes), the medians printed. Run::

    .venv/bin/python tests/bench/bench_read_path.py --base DIR [-n 50000] [--runs 3]
        [--args "--transport json"]
    .venv/bin/python tests/bench/bench_read_path.py --base DIR --e2e 1000 [-d 5] [--runs 3]

An e2e run reports the produce→deliver p50 and p99 (ms), the produce (send→stored) p50
and p99, and those of the delivery path alone (the produce's answer→delivered) besides the rate.

The base tree (and ``--this DIR``, when given: a frozen copy of this one, so that edits made
while it runs do not leak into it) runs with ``PYTHONPATH`` pointing at its ``libs`` and
``services``, ahead of this checkout's (the ``danube`` namespace takes each module from the
first that has it).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from mesh import bench_mesh

SERVICES = ("ingest", "dispatcher", "discovery")


async def one_run(tree: Path | None, bench: list[str], extra: list[str]) -> dict[str, Any]:
    """The JSON result of one `danube bench <bench...>` against a fresh mesh of ``tree``
    (None: this one)."""
    saved = os.environ.get("PYTHONPATH")
    if tree is not None:
        os.environ["PYTHONPATH"] = f"{tree / 'libs'}:{tree / 'services'}"
    try:
        with tempfile.TemporaryDirectory() as tmp:
            async with bench_mesh(Path(tmp), SERVICES) as http:
                main = "from danube.cli.main import main; main()"
                command = [sys.executable, "-c", main, "bench", *bench]
                args = ["-s", str(http.base_url), "--size", "1024"]
                out = await asyncio.to_thread(
                    subprocess.run,
                    [*command, *args, *extra, "--json"],
                    capture_output=True,
                    text=True,
                    check=False,
                )
                if out.returncode != 0:
                    raise SystemExit(f"bench failed: {out.stderr[-2000:]}")
                result: dict[str, Any] = json.loads(out.stdout)
                return result
    finally:
        if saved is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = saved


def figures(result: dict[str, Any], e2e: bool) -> dict[str, float]:
    """The numbers compared: msgs/s, and for e2e the latencies (ms)."""
    out = {"msgs_per_s": float(result["msgs_per_s"])}
    if e2e:
        keys = (
            ("e2e", "latency_ms"),
            ("produce", "produce_latency_ms"),
            ("after_ack", "after_ack_ms"),
        )
        for name, key in keys:
            summary = result.get(key) or {}
            for q in ("p50", "p99"):
                out[f"{name}_{q}_ms"] = float(summary.get(q, float("nan")))
        out["missing"] = float(result.get("missing", 0))
    return out


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--base", type=Path, required=True)
    parser.add_argument(
        "--this", type=Path, default=None, help="the tree compared with the base (default: here)"
    )
    parser.add_argument("-n", type=int, default=50_000)
    parser.add_argument("--e2e", type=float, default=0.0, help="an e2e run at this rate")
    parser.add_argument("-d", type=float, default=5.0, help="an e2e run's duration (s)")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--args", default="", help="more options of this tree's run")
    parser.add_argument("--base-args", default="", help="more options of the base's run")
    options = parser.parse_args()
    e2e = options.e2e > 0
    if e2e:
        bench = ["e2e", "--rate", str(options.e2e), "-d", str(options.d)]
    else:
        bench = ["consume", "-n", str(options.n)]
    results: dict[str, list[dict[str, float]]] = {"base": [], "this": []}
    for _ in range(options.runs):
        for name, tree, extra in (
            ("base", options.base, options.base_args),
            ("this", options.this, options.args),
        ):
            got = figures(await one_run(tree, bench, shlex.split(extra)), e2e)
            results[name].append(got)
            print(name, json.dumps(got), flush=True)
    medians = {
        name: {key: statistics.median(run[key] for run in runs) for key in runs[0]}
        for name, runs in results.items()
    }
    print(json.dumps({"runs": results, "medians": medians}))


if __name__ == "__main__":
    asyncio.run(main())

"""`danube bench consume` (1 KiB, ack each) of two code trees in one window: this checkout
and ``--base`` (another tree of the project, e.g. ``git archive <commit> | tar -x -C DIR``),
runs alternating, each on a fresh mesh (ingest, dispatcher, discovery as processes), the
medians printed. Run::

    .venv/bin/python tests/bench/bench_read_path.py --base DIR [-n 50000] [--runs 3]
        [--args "--transport json"]

The base tree runs with ``PYTHONPATH`` pointing at its ``libs`` and ``services``, ahead of
this checkout's (the ``danube`` namespace takes each module from the first that has it).
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

from mesh import bench_mesh

SERVICES = ("ingest", "dispatcher", "discovery")


async def one_run(tree: Path | None, count: int, extra: list[str]) -> float:
    """msgs/s of one `danube bench consume` against a fresh mesh of ``tree`` (None: this one)."""
    saved = os.environ.get("PYTHONPATH")
    if tree is not None:
        os.environ["PYTHONPATH"] = f"{tree / 'libs'}:{tree / 'services'}"
    try:
        with tempfile.TemporaryDirectory() as tmp:
            async with bench_mesh(Path(tmp), SERVICES) as http:
                main = "from danube.cli.main import main; main()"
                command = [sys.executable, "-c", main, "bench", "consume"]
                args = ["-s", str(http.base_url), "-n", str(count), "--size", "1024"]
                out = await asyncio.to_thread(
                    subprocess.run,
                    [*command, *args, *extra, "--json"],
                    capture_output=True,
                    text=True,
                    check=False,
                )
                if out.returncode != 0:
                    raise SystemExit(f"bench failed: {out.stderr[-2000:]}")
                return float(json.loads(out.stdout)["msgs_per_s"])
    finally:
        if saved is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = saved


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--base", type=Path, required=True)
    parser.add_argument("-n", type=int, default=50_000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--args", default="", help="more options of this tree's run")
    parser.add_argument("--base-args", default="", help="more options of the base's run")
    options = parser.parse_args()
    results: dict[str, list[float]] = {"base": [], "this": []}
    for _ in range(options.runs):
        base = await one_run(options.base, options.n, shlex.split(options.base_args))
        results["base"].append(base)
        this = await one_run(None, options.n, shlex.split(options.args))
        results["this"].append(this)
        print(f"base {base:,.0f} msg/s   this {this:,.0f} msg/s", flush=True)
    medians = {name: statistics.median(values) for name, values in results.items()}
    print(json.dumps({"runs": results, "medians": medians}))


if __name__ == "__main__":
    asyncio.run(main())

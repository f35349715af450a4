"""Produce through a mesh with the JSON body and the binary body, and optionally through a
second mesh running an older checkout (its ``libs`` and ``services`` first on PYTHONPATH,
for the services and for the ``danube bench`` client that produces to them), alternating
runs in one window: the numbers of docs/performance.md ("The binary produce body", "The
lean produce path").

    .venv/bin/python tests/bench/bench_produce_transport.py [--base OLD_CHECKOUT] [--rounds 3]

Each row runs once to warm up, then ``--rounds`` times per configuration, A B C A B C ...;
medians are printed as JSON on stdout (one line per configuration and row), with the CPU
each server process (discovery, ingest) spent per message during the runs.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import tempfile
from contextlib import AsyncExitStack
from pathlib import Path

from mesh import bench_mesh, bench_produce

ROWS = {
    "batched": ["--batch-size", "1000", "--inflight", "4", "-n", "100000"],
    # send_many(): one future per batch_size messages (this checkout's client only).
    "batched_send_many": ["--batch-size", "1000", "--inflight", "4", "-n", "100000", "--send-many"],
    "single": ["--batch-size", "1", "--linger-ms", "0", "--inflight", "1", "-n", "500"],
    "paced": [
        *("--batch-size", "1", "--linger-ms", "0", "--inflight", "1"),
        *("--rate", "50", "-n", "250"),
    ],
}
_TICKS_S = os.sysconf("SC_CLK_TCK")


def _cpu_s(pid: int) -> float:
    """User and system CPU seconds of process ``pid`` so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _TICKS_S


def _scaled(args: list[str], scale: float) -> list[str]:
    at = args.index("-n") + 1
    return [*args[:at], str(max(1, int(int(args[at]) * scale))), *args[at + 1 :]]


async def main(
    base: Path | None, rounds: int, rows: list[str], scale: float, order: list[str] | None
) -> None:
    async with AsyncExitStack() as stack:
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="bench-transport-")))
        meshes: dict[str, str] = {}
        pids: dict[str, dict[str, int]] = {"new": {}, "old": {}}
        envs: dict[str, dict[str, str] | None] = {"new": None}
        http = await stack.enter_async_context(
            bench_mesh(tmp / "new", ["ingest", "discovery"], pids=pids["new"])
        )
        meshes["new"] = str(http.base_url)
        if base is not None:
            envs["old"] = {"PYTHONPATH": f"{base / 'libs'}:{base / 'services'}"}
            old = await stack.enter_async_context(
                bench_mesh(tmp / "old", ["ingest", "discovery"], envs["old"], pids=pids["old"])
            )
            meshes["old"] = str(old.base_url)
        configs = [("new", "json"), ("new", "binary")]
        if base is not None:
            configs.insert(0, ("old", "json"))
        if order:  # e.g. new:json,old:json — the runs' order within a round
            configs = [(c.split(":")[0], c.split(":")[1]) for c in order]
        for row in rows:
            results: dict[tuple[str, str], list[dict[str, object]]] = {c: [] for c in configs}
            for round_ in range(rounds + 1):
                for mesh, transport in configs:
                    args = [*_scaled(ROWS[row], scale), "--transport", transport]
                    servers = {k: v for k, v in pids[mesh].items() if k.startswith("bench-")}
                    before = {k: _cpu_s(pid) for k, pid in servers.items()}
                    result = await bench_produce(meshes[mesh].rstrip("/"), args, env=envs[mesh])
                    count = max(1, int(str(result["messages"])))
                    for k, pid in servers.items():
                        name = k.removeprefix("bench-")
                        used_s = _cpu_s(pid) - before[k]
                        result[f"{name}_cpu_us_per_msg"] = used_s * 1e6 / count
                    if round_:  # the first round warms up
                        results[(mesh, transport)].append(result)
            for (mesh, transport), runs in results.items():
                rates = [float(str(r["msgs_per_s"])) for r in runs]
                p50s = [float(r["latency_ms"]["p50"]) for r in runs]  # type: ignore[index]
                p99s = [float(r["latency_ms"]["p99"]) for r in runs]  # type: ignore[index]
                disc = [float(str(r.get("discovery_cpu_us_per_msg", 0))) for r in runs]
                ing = [float(str(r.get("ingest_cpu_us_per_msg", 0))) for r in runs]
                cpu = [float(str(r["client_cpu_us_per_msg"])) for r in runs]
                share = [float(str(r["client_cpu_per_wall"])) for r in runs]
                print(
                    json.dumps(
                        {
                            "row": row,
                            "mesh": mesh,
                            "transport": transport,
                            "msgs_per_s": statistics.median(rates),
                            "runs": rates,
                            "p50_ms": statistics.median(p50s),
                            "p99_ms": statistics.median(p99s),
                            "discovery_cpu_us_per_msg": round(statistics.median(disc), 2),
                            "ingest_cpu_us_per_msg": round(statistics.median(ing), 2),
                            "client_cpu_us_per_msg": statistics.median(cpu),
                            "client_cpu_per_wall": statistics.median(share),
                        }
                    ),
                    flush=True,
                )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--base", type=Path, default=None)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--rows", default="batched,single")
    parser.add_argument("--scale", type=float, default=1.0, help="Multiply every -n by this.")
    parser.add_argument("--order", default="", help="mesh:transport,... (default: all)")
    options = parser.parse_args()
    order = [c for c in options.order.split(",") if c]
    asyncio.run(main(options.base, options.rounds, options.rows.split(","), options.scale, order))

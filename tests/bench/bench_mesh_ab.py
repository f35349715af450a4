"""Two ways of producing through the whole mesh, A against B on one mesh (nats, etcd,
ingest, dispatcher, discovery as processes; fsync; factor 1), in alternating rounds (A B,
B A, ...) so both see the same machine (`danube bench produce`, a process per round):

- ``--compare idempotent``: what idempotent producers cost, ``--idempotent`` (the SDK's
  default) against ``--no-idempotent``;
- ``--compare direct``: the leaders' data doors (``--direct``, the default) against the
  proxy path through discovery (``--proxy``), both idempotent (DESIGN §10).

Run: .venv/bin/python tests/bench/bench_mesh_ab.py [--compare direct] [--rounds 10] [--row ROW]

Rows, 1 KiB messages: one at a time (``--sync``: each message stored before the next is
sent, 2000 of them: p50 and p99) and batched (1000 messages per request, 4 in flight,
200 000 messages: msg/s). Prints each run, then the medians and the ratio idempotent / not.
A round lasts seconds: rounds of 400 and 50 000 messages (under a second) moved by ±7 %
between invocations on this machine, as much as the difference they were to measure, and
the batched row's rate counted a producer's start (its epoch and the partition count
asked, its first batch sent alone) in a run of 0.8 s.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
from pathlib import Path

from mesh import bench_mesh, bench_produce

ROWS = {
    "one at a time": ["--sync", "--batch-size", "1", "--linger-ms", "0", "-n", "2000"],
    "batched": ["--batch-size", "1000", "--inflight", "4", "-n", "200000"],
}
COMPARES = {
    "idempotent": {"idempotent": "--idempotent", "plain": "--no-idempotent"},
    "direct": {"direct": "--direct", "proxy": "--proxy"},
}


async def main(
    tmp: Path, rounds: int, only: str | None = None, compare: str = "idempotent"
) -> None:
    modes = COMPARES[compare]
    (a, b) = modes
    async with bench_mesh(tmp, ["ingest", "dispatcher", "discovery"]) as http:
        url = str(http.base_url).rstrip("/")
        for row, args in ROWS.items():
            if only and row != only:
                continue
            results: dict[str, list[tuple[float, float, float]]] = {m: [] for m in modes}
            for index in range(rounds + 1):  # the first round warms up, uncounted
                order = list(modes) if index % 2 else list(reversed(modes))
                for mode in order:
                    result = await bench_produce(url, [*args, modes[mode]])
                    latency = result["latency_ms"]
                    assert isinstance(latency, dict)
                    assert result["errors"] == 0, result
                    measured = (
                        float(latency["p50"]),
                        float(latency["p99"]),
                        float(str(result["msgs_per_s"])),
                    )
                    print(
                        f"{row} round {index} {mode:10}: p50 {measured[0]:.3f} ms "
                        f"p99 {measured[1]:.3f} ms {measured[2]:,.0f} msg/s",
                        flush=True,
                    )
                    if index:
                        results[mode].append(measured)
            median = {
                mode: [statistics.median(r[i] for r in rows) for i in range(3)]
                for mode, rows in results.items()
            }
            on, off = median[a], median[b]
            print(
                f"== {row} ({rounds} rounds, medians): {a} p50 {on[0]:.3f} ms "
                f"p99 {on[1]:.3f} ms {on[2]:,.0f} msg/s; {b} p50 {off[0]:.3f} ms "
                f"p99 {off[1]:.3f} ms {off[2]:,.0f} msg/s; {a} / {b}: "
                f"p50 x{on[0] / off[0]:.3f}, p99 x{on[1] / off[1]:.3f}, "
                f"throughput x{on[2] / off[2]:.3f}",
                flush=True,
            )


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--row", choices=list(ROWS), help="only this row")
    parser.add_argument("--compare", choices=list(COMPARES), default="idempotent")
    arguments = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-ab-") as tmp:
        asyncio.run(main(Path(tmp), arguments.rounds, arguments.row, arguments.compare))

"""Produce throughput and latency at replication factor 1 against factor 3 (min in-sync 2):
two meshes of three ingest nodes and a discovery, side by side, `danube bench produce` with
1 KiB messages (fsync before ack) against each in turn, three rounds, medians.

Rows: batched (1000 per request, 4 in flight) and single (one per request, one in flight),
both flat out for a count of messages (throughput), and single at 50 msg/s, a pace both keep
up with, for each produce's own latency (a flat-out run's latency is its client queue's)."""

from __future__ import annotations

import asyncio
import statistics
import tempfile
from pathlib import Path

from mesh import bench_mesh, bench_produce

ROUNDS = 3
SHAPES = {
    "batched": ["--batch-size", "1000", "--inflight", "4", "-n", "50000"],
    "single": ["--batch-size", "1", "--linger-ms", "0", "--inflight", "1", "-n", "500"],
    "single-paced": ["--batch-size", "1", "--linger-ms", "0", "--rate", "50", "-n", "250"],
}
FACTORS = {1: 1, 3: 2}  # replication factor: min in-sync replicas


async def main() -> None:
    rates: dict[tuple[int, str], list[float]] = {}
    latency: dict[tuple[int, str, str], list[float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        services = ["ingest", "ingest", "ingest", "discovery"]

        def env(factor: int) -> dict[str, str]:
            return {
                "DANUBE_INGEST__REPLICATION_FACTOR": str(factor),
                "DANUBE_INGEST__MIN_INSYNC_REPLICAS": str(FACTORS[factor]),
            }

        async with (
            bench_mesh(Path(tmp) / "factor-1", services, env(1)) as one,
            bench_mesh(Path(tmp) / "factor-3", services, env(3)) as three,
        ):
            urls = {1: str(one.base_url).rstrip("/"), 3: str(three.base_url).rstrip("/")}
            for _ in range(ROUNDS):
                for shape, args in SHAPES.items():
                    for factor, url in urls.items():
                        result = await bench_produce(url, args)
                        rates.setdefault((factor, shape), []).append(float(result["msgs_per_s"]))  # type: ignore[arg-type]
                        ms = result.get("latency_ms") or {}
                        for q in ("p50", "p99"):
                            latency.setdefault((factor, shape, q), []).append(float(ms[q]))  # type: ignore[index]
    for shape in SHAPES:
        r1 = statistics.median(rates[(1, shape)])
        r3 = statistics.median(rates[(3, shape)])
        p = {
            (f, q): statistics.median(latency[(f, shape, q)])
            for f in FACTORS
            for q in ("p50", "p99")
        }
        print(
            f"{shape}: factor 1 {r1:.0f} msg/s (p50 {p[(1, 'p50')]:.2f} ms, p99 "
            f"{p[(1, 'p99')]:.2f} ms); factor 3 {r3:.0f} msg/s (p50 {p[(3, 'p50')]:.2f} ms, "
            f"p99 {p[(3, 'p99')]:.2f} ms); ratio {r3 / r1:.2f} (medians of {ROUNDS})"
        )


if __name__ == "__main__":
    asyncio.run(main())

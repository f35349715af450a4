"""Produce throughput and latency at replication factor 1 against factor 3 (min in-sync 2),
three ingest nodes each time, in one run: `danube bench produce` with 1 KiB messages,
batched (1000 per request) and single (one per request) flat out for throughput, and single
at 100 msg/s for each produce's own latency; fsync durability."""

from __future__ import annotations

import asyncio
import json
import tempfile
from pathlib import Path

from mesh import bench_mesh, bench_produce

DURATION_S = 8.0
SHAPES = {
    "batched": ["--batch-size", "1000", "--inflight", "4"],
    "single": ["--batch-size", "1", "--linger-ms", "0", "--inflight", "1"],
    # The two above run flat out, so their latency includes queueing in the client; at a
    # pace the mesh keeps up with, latency is one produce's own.
    "single-paced": ["--batch-size", "1", "--linger-ms", "0", "--rate", "100"],
}


async def main() -> None:
    results: dict[tuple[int, str], dict[str, object]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for factor, min_insync in ((1, 1), (3, 2)):
            env = {
                "DANUBE_INGEST__REPLICATION_FACTOR": str(factor),
                "DANUBE_INGEST__MIN_INSYNC_REPLICAS": str(min_insync),
            }
            services = ["ingest", "ingest", "ingest", "discovery"]
            async with bench_mesh(Path(tmp) / f"factor-{factor}", services, env) as http:
                url = str(http.base_url).rstrip("/")
                for shape, args in SHAPES.items():
                    results[(factor, shape)] = await bench_produce(url, args, duration_s=DURATION_S)
    for shape in SHAPES:
        one, three = results[(1, shape)], results[(3, shape)]
        rate1, rate3 = float(one["msgs_per_s"]), float(three["msgs_per_s"])  # type: ignore[arg-type]
        print(
            f"{shape}: factor 1 {rate1:.0f} msg/s, factor 3 {rate3:.0f} msg/s, "
            f"ratio {rate3 / rate1:.2f}"
        )
        print(f"  factor 1 latency {json.dumps(one.get('latency_ms'))}")
        print(f"  factor 3 latency {json.dumps(three.get('latency_ms'))}")


if __name__ == "__main__":
    asyncio.run(main())

"""`danube bench` against a mesh of real processes (nats-server, etcd, one ingest, one
dispatcher, one discovery, each `python -m danube.<service>`): the SDK's produce, consume and
end-to-end throughput and latency, as the command measures them.

Run: .venv/bin/python tests/bench/bench_client.py
Prints one JSON line per run (the `danube bench ... --json` document).
"""

from __future__ import annotations

import asyncio
import json
import tempfile
import uuid
from pathlib import Path

from danube.bench.run import BenchSpec, Meter, bench_consume, bench_e2e, bench_produce
from danube.client import AsyncDanubeClient

from mesh import bench_mesh

DURATION_S = 5.0


def _topic() -> str:
    return f"/default/bench-{uuid.uuid4().hex[:8]}"


async def main(tmp: Path) -> None:
    async with bench_mesh(tmp, ["ingest", "dispatcher", "discovery"]) as http:
        url = str(http.base_url).rstrip("/")
        runs = [
            (bench_produce, BenchSpec("produce", _topic(), duration_s=DURATION_S)),
            (bench_produce, BenchSpec("produce", _topic(), duration_s=DURATION_S, inflight=4)),
            (bench_consume, BenchSpec("consume", _topic(), count=50_000, duration_s=None)),
            (
                bench_consume,
                BenchSpec("consume", _topic(), count=50_000, duration_s=None, mode="poll"),
            ),
            (bench_e2e, BenchSpec("e2e", _topic(), duration_s=DURATION_S)),
            (bench_e2e, BenchSpec("e2e", _topic(), duration_s=DURATION_S, rate=2000)),
        ]
        async with AsyncDanubeClient(url) as client:
            for run, spec in runs:
                meter = Meter(total=spec.count, duration_s=spec.duration_s)
                print(json.dumps(await run(client, spec, meter)), flush=True)


if __name__ == "__main__":
    with tempfile.TemporaryDirectory() as tmp:
        asyncio.run(main(Path(tmp)))

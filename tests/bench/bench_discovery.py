"""Produce throughput over HTTP through one discovery process into one ingest process (real
nats-server and etcd; both services started as `python -m danube.<service>`).

Run: .venv/bin/python tests/bench/bench_discovery.py
100-byte payloads, fsync durability, one unpartitioned topic; C concurrent HTTP clients
(keep-alive) for a fixed time. Prints requests/s and msgs/s: single-message produce, and
100-message batches.
"""

from __future__ import annotations

import asyncio
import json
import tempfile
import time
from pathlib import Path

import httpx

from mesh import bench_mesh

DURATION_S = 3.0
SCENARIOS = [(1, 1), (32, 1), (1, 100), (8, 100)]  # (concurrent clients, messages per request)
PATH = "/v1/topics/default/bench/messages"


async def _scenario(http: httpx.AsyncClient, clients: int, batch: int) -> tuple[int, int, float]:
    body = json.dumps({"messages": [{"payload": "x" * 100}] * batch}).encode()
    headers = {"content-type": "application/json"}
    requests = 0
    deadline = time.perf_counter() + DURATION_S

    async def client() -> None:
        nonlocal requests
        while time.perf_counter() < deadline:
            answer = await http.post(PATH, content=body, headers=headers)
            answer.raise_for_status()
            requests += 1

    started = time.perf_counter()
    await asyncio.gather(*(client() for _ in range(clients)))
    return requests, requests * batch, time.perf_counter() - started


async def main(tmp: Path) -> None:
    async with bench_mesh(tmp, ["ingest", "discovery"]) as http:
        await http.post(PATH, json={"messages": [{"payload": "warm"}]})
        print(f"HTTP produce, 100 B payloads, fsync, {DURATION_S:.0f} s per scenario")
        print(f"{'clients':>7} {'batch':>6} {'requests/s':>11} {'msgs/s':>10}")
        for clients, batch in SCENARIOS:
            requests, messages, elapsed_s = await _scenario(http, clients, batch)
            print(
                f"{clients:>7} {batch:>6} {requests / elapsed_s:>11,.0f} "
                f"{messages / elapsed_s:>10,.0f}"
            )


if __name__ == "__main__":
    with tempfile.TemporaryDirectory() as tmp:
        asyncio.run(main(Path(tmp)))

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
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from danube.runtime import ServerProcess, etcd_spec, free_port, nats_spec

DURATION_S = 3.0
READY_TIMEOUT_S = 30.0
SCENARIOS = [(1, 1), (32, 1), (1, 100), (8, 100)]  # (concurrent clients, messages per request)
PATH = "/v1/topics/default/bench/messages"


def _start(service: str, env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    with log.open("wb") as out:
        return subprocess.Popen(
            [sys.executable, "-m", f"danube.{service}"], env=env, stdout=out, stderr=out
        )


async def _until_ready(http: httpx.AsyncClient) -> None:
    async with asyncio.timeout(READY_TIMEOUT_S):
        while True:
            try:
                if (await http.get("/readyz")).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            await asyncio.sleep(0.1)


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
    nats = ServerProcess(nats_spec(port=free_port(), monitor_port=free_port()), tmp / "nats.log")
    etcd = ServerProcess(
        etcd_spec(data_dir=tmp / "etcd", client_port=free_port(), peer_port=free_port()),
        tmp / "etcd.log",
    )
    with nats, etcd:
        port = free_port()
        env = {
            **os.environ,
            "DANUBE_BUS__SERVERS": json.dumps([f"nats://127.0.0.1:{nats.spec.port}"]),
            "DANUBE_WAL_CLOUD__METADATA__ETCD_ENDPOINT": f"127.0.0.1:{etcd.spec.port}",
            "DANUBE_WAL_CLOUD__WAL__DIR": str(tmp / "wal"),
            "DANUBE_DISCOVERY__PORT": str(port),
            "DANUBE_INGEST__METRICS_PORT": str(free_port()),
        }
        processes = [
            _start("ingest", {**env, "DANUBE_NODE_ID": "bench-ingest"}, tmp / "ingest.log"),
            _start("discovery", {**env, "DANUBE_NODE_ID": "bench-disc"}, tmp / "disc.log"),
        ]
        try:
            limits = httpx.Limits(max_connections=64, max_keepalive_connections=64)
            async with httpx.AsyncClient(
                base_url=f"http://127.0.0.1:{port}", timeout=30, limits=limits
            ) as http:
                await _until_ready(http)
                await http.post(PATH, json={"messages": [{"payload": "warm"}]})
                print(f"HTTP produce, 100 B payloads, fsync, {DURATION_S:.0f} s per scenario")
                print(f"{'clients':>7} {'batch':>6} {'requests/s':>11} {'msgs/s':>10}")
                for clients, batch in SCENARIOS:
                    requests, messages, elapsed_s = await _scenario(http, clients, batch)
                    print(
                        f"{clients:>7} {batch:>6} {requests / elapsed_s:>11,.0f} "
                        f"{messages / elapsed_s:>10,.0f}"
                    )
        finally:
            for process in processes:
                process.terminate()
            for process in processes:
                try:
                    process.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    process.kill()


if __name__ == "__main__":
    with tempfile.TemporaryDirectory() as tmp:
        asyncio.run(main(Path(tmp)))

"""Produce -> deliver latency end to end at a steady rate: one process each of ingest,
dispatcher and discovery (real nats-server and etcd), everything over the HTTP API.

Run: .venv/bin/python tests/bench/bench_dispatch_latency.py [rate msg/s] [seconds] [batch]
Defaults: 1000 msg/s for 10 s in produce requests of 10 messages (100 requests/s; open loop:
each request is sent on schedule, whatever the previous answer), fsync durability,
unpartitioned reliable topic, ~30 B payloads carrying their send time; one exclusive consumer
long-polling (max 1000, wait 1 s) and acking in the background. Latency of each message = when
the poll answer is parsed - when its produce request was sent.
"""

from __future__ import annotations

import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx

from mesh import bench_mesh

TOPIC = "/v1/topics/default/latency"


def _quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def _produce(http: httpx.AsyncClient, rate: float, seconds: float, batch: int) -> list[float]:
    """Send ``rate * seconds`` messages on schedule, ``batch`` per request; the produce
    latency (ms) of each request."""
    latencies: list[float] = []
    pending: set[asyncio.Task[None]] = set()

    async def send() -> None:
        sent = time.time_ns()
        answer = await http.post(
            f"{TOPIC}/messages", json={"messages": [{"payload": f"t={sent}"}] * batch}
        )
        answer.raise_for_status()
        latencies.append((time.time_ns() - sent) / 1e6)

    started = time.perf_counter()
    for number in range(int(rate * seconds) // batch):
        delay = started + number * batch / rate - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        task = asyncio.create_task(send())
        pending.add(task)
        task.add_done_callback(pending.discard)
    await asyncio.gather(*pending)
    return latencies


async def _consume(
    http: httpx.AsyncClient, consumer: str, expected: int, latencies: list[float]
) -> None:
    acks: set[asyncio.Task[httpx.Response]] = set()
    while len(latencies) < expected:
        answer = await http.get(
            f"/v1/consumers/{consumer}/messages", params={"max": 1000, "wait_ms": 1000}
        )
        answer.raise_for_status()
        now = time.time_ns()
        messages = answer.json()["messages"]
        for message in messages:
            latencies.append((now - int(message["payload"][2:])) / 1e6)
        if messages:
            refs = [{"partition": m["partition"], "offset": m["offset"]} for m in messages]
            ack = asyncio.create_task(
                http.post(f"/v1/consumers/{consumer}/ack", json={"messages": refs})
            )
            acks.add(ack)
            ack.add_done_callback(acks.discard)
    await asyncio.gather(*acks)


async def main(tmp: Path, rate: float, seconds: float, batch: int) -> None:
    async with bench_mesh(tmp, ["ingest", "dispatcher", "discovery"]) as http:
        await http.post(f"{TOPIC}/messages", json={"messages": [{"payload": "t=0"}]})
        attach = await http.post(
            f"{TOPIC}/subscriptions/bench/consumers",
            json={"name": "bench", "type": "exclusive", "start": "latest"},
        )
        attach.raise_for_status()
        consumer = attach.json()["consumer_id"]
        delivered: list[float] = []
        expected = int(rate * seconds) // batch * batch
        consuming = asyncio.create_task(_consume(http, consumer, expected, delivered))
        produced = await _produce(http, rate, seconds, batch)
        async with asyncio.timeout(60):
            await consuming
    print(f"{expected} messages at {rate:.0f} msg/s, {batch} per request, fsync, ~30 B payloads")
    for name, values in (("produce request", produced), ("produce->deliver", delivered)):
        print(
            f"{name:>17}: p50 {statistics.median(values):7.2f} ms  "
            f"p99 {_quantile(values, 0.99):7.2f} ms  p99.9 {_quantile(values, 0.999):7.2f} ms  "
            f"max {max(values):7.2f} ms"
        )


if __name__ == "__main__":
    rate = float(sys.argv[1]) if len(sys.argv) > 1 else 1000.0
    seconds = float(sys.argv[2]) if len(sys.argv) > 2 else 10.0
    batch = int(sys.argv[3]) if len(sys.argv) > 3 else 10
    with tempfile.TemporaryDirectory() as tmp:
        asyncio.run(main(Path(tmp), rate, seconds, batch))

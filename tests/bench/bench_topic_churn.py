"""Memory across topic churn: create N topics, produce to each and consume one message from
each through a subscription, delete them all; repeat. Prints the resident memory of the
ingest, dispatcher and discovery processes after each cycle: per-topic state that is never
released grows with every cycle, while the allocator's own high-water mark stays flat after
the first."""

from __future__ import annotations

import argparse
import asyncio
import os
import tempfile
from pathlib import Path

import httpx

from mesh import bench_mesh

SERVICES = ("ingest", "dispatcher", "discovery")


def _rss_mib(kind: str) -> float:
    """The resident memory of this process's child running ``-m danube.<kind>``."""
    me = os.getpid()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes().split(b"\0")
            status = (entry / "status").read_text()
        except OSError:
            continue
        parent = int(stat.rsplit(")", 1)[1].split()[1])
        if parent == me and f"danube.{kind}".encode() in cmdline:
            for line in status.splitlines():
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    raise RuntimeError(f"no {kind} process")


async def _cycle(http: httpx.AsyncClient, topics: int, cycle: int) -> None:
    gate = asyncio.Semaphore(16)

    async def one(i: int) -> None:
        name = f"churn-{cycle}-{i}"
        async with gate:
            (await http.put(f"/v1/topics/default/{name}")).raise_for_status()
            body = {"messages": [{"payload": f"m{i}"}]}
            (await http.post(f"/v1/topics/default/{name}/messages", json=body)).raise_for_status()
            attach = await http.post(
                f"/v1/topics/default/{name}/subscriptions/s/consumers",
                json={"name": "c", "type": "exclusive", "start": "earliest"},
            )
            attach.raise_for_status()
            consumer = attach.json()["consumer_id"]
            got = await http.get(f"/v1/consumers/{consumer}/messages", params={"wait_ms": 5000})
            got.raise_for_status()
            (await http.delete(f"/v1/consumers/{consumer}")).raise_for_status()

    await asyncio.gather(*(one(i) for i in range(topics)))
    for i in range(topics):
        async with gate:
            (await http.delete(f"/v1/topics/default/churn-{cycle}-{i}")).raise_for_status()


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--topics", type=int, default=500)
    parser.add_argument("--cycles", type=int, default=4)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        async with bench_mesh(Path(tmp), list(SERVICES)) as http:
            base = {kind: _rss_mib(kind) for kind in SERVICES}
            print("start: " + ", ".join(f"{k} {v:.0f} MiB" for k, v in base.items()))
            for cycle in range(args.cycles):
                await _cycle(http, args.topics, cycle)
                now = {kind: _rss_mib(kind) for kind in SERVICES}
                print(
                    f"after cycle {cycle + 1} ({args.topics} topics created, used, deleted): "
                    + ", ".join(f"{k} {v:.0f} MiB" for k, v in now.items())
                )


if __name__ == "__main__":
    asyncio.run(main())

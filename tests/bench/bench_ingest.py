"""Produce throughput through the bus into one ingest node (real nats-server and etcd).

Run: .venv/bin/python tests/bench/bench_ingest.py
1 KiB records, fsync durability, one partition; C concurrent producers each sending
requests of B records for a fixed time. Prints msgs/s and MB/s per scenario.
"""

from __future__ import annotations

import asyncio
import tempfile
import time
from pathlib import Path

from danube.bus import Bus, TopicName
from danube.config import BusConfig, DanubeSettings, MetadataConfig, WalCloudConfig, WalConfig
from danube.frame import Record, encode_record
from danube.ingest import app
from danube.up import ServerProcess, etcd_spec, free_port, nats_spec
from danube.wire.ingest.client import IngestClient

DURATION_S = 3.0
SCENARIOS = [(1, 1), (1, 100), (100, 1), (100, 10)]  # (producers, records per request)
PARTITION = TopicName("default", "bench")


async def _scenario(client: IngestClient, producers: int, batch: int) -> tuple[int, float]:
    record = encode_record(Record(payload=b"x" * 1024, publish_time_ms=1, producer="bench"))
    records = [record] * batch
    count = 0
    deadline = time.perf_counter() + DURATION_S

    async def produce() -> None:
        nonlocal count
        while time.perf_counter() < deadline:
            await client.produce(PARTITION, records, timeout_s=10)
            count += batch

    started = time.perf_counter()
    await asyncio.gather(*(produce() for _ in range(producers)))
    return count, time.perf_counter() - started


async def main(tmp: Path) -> None:
    nats = ServerProcess(nats_spec(port=free_port(), monitor_port=free_port()), tmp / "nats.log")
    etcd = ServerProcess(
        etcd_spec(data_dir=tmp / "etcd", client_port=free_port(), peer_port=free_port()),
        tmp / "etcd.log",
    )
    with nats, etcd:
        nats_url = f"nats://127.0.0.1:{nats.spec.port}"
        settings = DanubeSettings(
            bus=BusConfig(servers=[nats_url]),
            wal_cloud=WalCloudConfig(
                wal=WalConfig(dir=tmp / "wal"),
                metadata=MetadataConfig(etcd_endpoint=f"127.0.0.1:{etcd.spec.port}"),
            ),
        )
        stop = asyncio.Event()
        node = asyncio.create_task(app.serve(settings, "bench-node", stop))
        bus = await Bus.connect(settings.bus, name="bench")
        client = IngestClient(bus)
        await client.produce(
            PARTITION,
            [encode_record(Record(payload=b"warm", publish_time_ms=1, producer="bench"))],
            timeout_s=10,
        )
        print(f"produce over the bus, 1 KiB records, fsync, {DURATION_S:.0f} s per scenario")
        print(f"{'producers':>9} {'batch':>6} {'msgs/s':>10} {'MB/s':>8}")
        for producers, batch in SCENARIOS:
            count, elapsed_s = await _scenario(client, producers, batch)
            rate = count / elapsed_s
            print(f"{producers:>9} {batch:>6} {rate:>10,.0f} {rate * 1024 / 1e6:>8.1f}")
        await bus.close()
        stop.set()
        await node


if __name__ == "__main__":
    with tempfile.TemporaryDirectory() as tmp:
        asyncio.run(main(Path(tmp)))

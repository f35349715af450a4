"""What deduplication costs the ingest leader: sequenced records (an idempotent producer's)
against plain ones through the bus into one ingest node (real nats-server and etcd, fsync,
factor 1), in alternating rounds so both see the same machine; and the memory of 10 000 idle
producers' states.

Run: .venv/bin/python tests/bench/bench_idempotence.py [--rounds 6]

Rows: one at a time (1 producer, 1 record of 1 KiB per request, closed loop: p50 and p99
of the answer) and batched (4 producers, 100 records of 1 KiB per request: msg/s). Prints
the median of the rounds for each mode and the ratio sequenced / plain.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
import tracemalloc
from pathlib import Path

from danube.bus import Bus, TopicName
from danube.config import BusConfig, DanubeSettings, MetadataConfig, WalCloudConfig, WalConfig
from danube.frame import Record, encode_record
from danube.ingest import app
from danube.ingest.producers import ProducerStates
from danube.up import ServerProcess, etcd_spec, free_port, nats_spec
from danube.wire.ingest import protocol
from danube.wire.ingest.client import IngestClient

ONE_AT_A_TIME_SENDS = 1500
BATCHED_S = 3.0
BATCH = 100
PRODUCERS = 4
PARTITION = TopicName("default", "bench-idem")


class Source:
    """Request bodies of one producer: plain, or sequenced with its next sequences."""

    def __init__(self, name: str, sequenced: bool) -> None:
        self.name = name
        self.sequenced = sequenced
        self.sequence = 0

    def body(self, count: int) -> bytes:
        records = []
        for _ in range(count):
            sequence = self.sequence if self.sequenced else None
            self.sequence += 1
            records.append(
                encode_record(
                    Record(
                        payload=b"x" * 1024,
                        publish_time_ms=1,
                        producer=self.name,
                        sequence=sequence,
                    )
                )
            )
        return protocol.encode_produce_request(records)


async def one_at_a_time(client: IngestClient, source: Source) -> tuple[float, float]:
    bodies = [source.body(1) for _ in range(ONE_AT_A_TIME_SENDS)]
    waits: list[float] = []
    for body in bodies:
        started = time.perf_counter()
        await client.produce_answer(PARTITION, body, timeout_s=10)
        waits.append(time.perf_counter() - started)
    waits.sort()
    return waits[len(waits) // 2] * 1000, waits[int(len(waits) * 0.99)] * 1000


async def batched(client: IngestClient, sources: list[Source]) -> float:
    count = 0
    deadline = time.perf_counter() + BATCHED_S

    async def produce(source: Source) -> None:
        nonlocal count
        bodies = [source.body(BATCH) for _ in range(200)]
        for body in bodies:
            if time.perf_counter() >= deadline:
                return
            await client.produce_answer(PARTITION, body, timeout_s=10)
            count += BATCH

    started = time.perf_counter()
    await asyncio.gather(*(produce(source) for source in sources))
    return count / (time.perf_counter() - started)


def state_bytes(producers: int) -> int:
    """Memory of ``producers`` idle producers' states (one run each), by tracemalloc."""
    records = [
        encode_record(
            Record(payload=b"", publish_time_ms=1, producer=f"producer-{i:06d}", sequence=0)
        )
        for i in range(producers)
    ]
    tracemalloc.start()
    before = tracemalloc.take_snapshot()
    states = ProducerStates(producers_max=producers)
    for offset, record in enumerate(records):
        states.apply(offset, [record])
    after = tracemalloc.take_snapshot()
    tracemalloc.stop()
    assert len(states) == producers
    return sum(stat.size_diff for stat in after.compare_to(before, "filename"))


async def main(tmp: Path, rounds: int) -> None:
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
        bus = await Bus.connect(BusConfig(servers=[nats_url]), name="bench-idem")
        client = IngestClient(bus)
        try:
            await client.produce_answer(PARTITION, Source("warm", False).body(1), timeout_s=30)
            results: dict[bool, list[tuple[float, float, float]]] = {False: [], True: []}
            for index in range(rounds + 1):  # the first round warms up, uncounted
                order = (False, True) if index % 2 else (True, False)
                for sequenced in order:
                    tag = f"r{index}-{'seq' if sequenced else 'plain'}"
                    p50, p99 = await one_at_a_time(client, Source(tag, sequenced))
                    sources = [Source(f"{tag}-{i}", sequenced) for i in range(PRODUCERS)]
                    rate = await batched(client, sources)
                    if index:
                        results[sequenced].append((p50, p99, rate))
                    print(
                        f"round {index} {'sequenced' if sequenced else 'plain    '}: "
                        f"one at a time p50 {p50:.3f} ms p99 {p99:.3f} ms; "
                        f"batched {rate:,.0f} msg/s",
                        flush=True,
                    )
            medians = {
                mode: [statistics.median(r[i] for r in rows) for i in range(3)]
                for mode, rows in results.items()
            }
            plain, seq = medians[False], medians[True]
            for name, row in (("plain", plain), ("sequenced", seq)):
                print(
                    f"median {name:9}: p50 {row[0]:.3f} ms  p99 {row[1]:.3f} ms  "
                    f"{row[2]:,.0f} msg/s"
                )
            print(
                f"sequenced / plain: p50 x{seq[0] / plain[0]:.3f}, p99 x{seq[1] / plain[1]:.3f}, "
                f"throughput x{seq[2] / plain[2]:.3f}"
            )
        finally:
            await bus.close()
            stop.set()
            await node
    size = state_bytes(10_000)
    print(f"10 000 idle producers' states: {size / 1e6:.2f} MB ({size / 10_000:.0f} bytes each)")


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=6)
    arguments = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        asyncio.run(main(Path(tmp), arguments.rounds))

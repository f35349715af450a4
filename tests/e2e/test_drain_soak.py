"""Drain of an ingest node holding a lot of data (1 GiB by default; DANUBE_DRAIN_BYTES sets
it), real processes: `danube admin nodes drain` moves every replica off it while a probe
produces to every partition; nothing is unavailable for more than a second, the catch-up
throttle holds (bytes/s measured on the draining leader), and once it is empty the node
stops and every acknowledged message reads back from the nodes left. A soak: `make bench`
runs it (pytest -m soak); test_scale_out.py drains a small node in `make test`."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from danube.bus import TopicName
from danube.config import MetadataConfig
from danube.frame import Record, decode_record, encode_record
from danube.meta import MetaStore
from danube.meta import keys as meta_keys
from danube.meta.records import Assignment
from danube.up import ServerProcess
from danube.wire.ingest.client import IngestClient
from tests.history import History

from replication import connect

pytestmark = [pytest.mark.e2e, pytest.mark.soak, pytest.mark.timeout(1800)]

DRAIN_BYTES = int(os.environ.get("DANUBE_DRAIN_BYTES", str(1024**3)))
PARTITIONS = 6
RECORD_BYTES = 256 * 1024
CATCHUP_BYTES_S = 64 * 1024 * 1024
NODE = {
    "DANUBE_INGEST__CATCHUP_BYTES_S": str(CATCHUP_BYTES_S),
    "DANUBE_INGEST__LEASE_TTL_S": "3",
}


def _record(payload: bytes) -> bytes:
    return encode_record(Record(payload=payload, publish_time_ms=1, producer="t"))


def _metric(url: str, name: str) -> float:
    text = httpx.get(url, timeout=5).text
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith(name) and not line.startswith("#")
    )


async def _read_all(client: IngestClient, partition: TopicName, history: History) -> list[int]:
    """Every offset from 0 to the end, each delivery recorded under its id (the payload up
    to its padding)."""
    offsets: list[int] = []
    while True:
        reply = await client.fetch(partition, len(offsets), max_count=64)
        assert not reply.below_wal_start
        if not reply.frames:
            return offsets
        for frame in reply.frames:
            msg_id = decode_record(frame.payload).payload.split(b".", 1)[0].decode()
            history.delivered(msg_id, partition=str(partition), offset=frame.offset)
            offsets.append(frame.offset)


async def _names(store: MetaStore, node: str) -> int:
    count = 0
    for kv in await store.range(meta_keys.partitions_prefix("default")):
        is_assignment = kv.key.endswith("/assignment")
        if is_assignment and node in Assignment.model_validate_json(kv.value).replicas:
            count += 1
    return count


async def test_drain_a_node_holding_a_gibibyte(
    tmp_path: Path,
    services: Callable[..., ServerProcess],
    nats_url: str,
    etcd_endpoint: str,
    meta_prefix: str,
) -> None:
    source = services("ingest", "ingest-2", **NODE)
    discovery = services("discovery", "discovery-0", DANUBE_DISCOVERY__BALANCE_INTERVAL_S="2")
    store = await MetaStore.connect(MetadataConfig(etcd_endpoint=etcd_endpoint, prefix=meta_prefix))
    bus, client = await connect(nats_url, "drain-soak")
    history = History()
    base_url = f"http://127.0.0.1:{discovery.spec.port}"
    partitions = [TopicName("default", f"big-part-{i}") for i in range(PARTITIONS)]
    try:
        async with httpx.AsyncClient(base_url=base_url, timeout=30) as http:
            made = await http.put("/v1/topics/default/big", json={"partitions": PARTITIONS})
            assert made.status_code in (200, 201), made.text
            filled = 0
            number = 0
            started = time.monotonic()
            while filled < DRAIN_BYTES:
                partition = partitions[number % PARTITIONS]
                ids = [f"f{number}-{i}" for i in range(3)]
                records = [_record(i.encode() + b"." * RECORD_BYTES) for i in ids]
                first = await client.produce(partition, records, timeout_s=30)
                for k, msg_id in enumerate(ids):
                    history.produced(msg_id, partition=str(partition), offset=first + k, acked=True)
                filled += sum(map(len, records))
                number += 1
            print(f"filled {filled / 2**20:.0f} MiB in {time.monotonic() - started:.1f}s")
            drained = await asyncio.to_thread(
                subprocess.run,
                [
                    str(Path(sys.executable).parent / "danube"),
                    "admin",
                    "nodes",
                    "drain",
                    "ingest-2",
                ],
                env={**os.environ, "DANUBE_SERVICE_ADDR": base_url},
                capture_output=True,
                text=True,
                timeout=60,
            )
            assert drained.returncode == 0, drained.stderr
            metrics_url = f"http://127.0.0.1:{source.spec.port}/metrics"
            sent_before = _metric(metrics_url, "danube_ingest_catchup_bytes_total")
            services("ingest", "ingest-0", **NODE)
            services("ingest", "ingest-1", **NODE)
            moved_at = time.monotonic()
            longest = 0.0
            probe = 0
            while await _names(store, "ingest-2"):
                for partition in partitions:
                    msg_id = f"p{probe}"
                    probe += 1
                    record = _record(msg_id.encode())
                    sent = time.monotonic()
                    offset = await client.produce(partition, [record], timeout_s=30)
                    longest = max(longest, time.monotonic() - sent)
                    history.produced(msg_id, partition=str(partition), offset=offset, acked=True)
                await asyncio.sleep(0.05)
                assert time.monotonic() - moved_at < 600, "the drain did not finish in 600 s"
            took_s = time.monotonic() - moved_at
            sent_bytes = _metric(metrics_url, "danube_ingest_catchup_bytes_total") - sent_before
            rate = sent_bytes / took_s
            print(
                f"drain of {filled / 2**20:.0f} MiB off ingest-2: {took_s:.1f}s, catch-up "
                f"{rate / 2**20:.1f} MiB/s (limit {CATCHUP_BYTES_S / 2**20:.0f} MiB/s), longest "
                f"produce {longest * 1000:.0f} ms over {probe} probes"
            )
            assert longest < 1.0
            assert rate <= CATCHUP_BYTES_S * 1.1
            status = await http.get("/v1/nodes/ingest-2/drain")
            assert status.status_code == 200, status.text
        source.stop()
        for partition in partitions:
            offsets = await _read_all(client, partition, history)
            assert offsets == list(range(len(offsets)))
        report = history.check(expect_contiguous_from={str(p): 0 for p in partitions})
        assert report.ok, report.summary()
    finally:
        await bus.close()
        await store.close()

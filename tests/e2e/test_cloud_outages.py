"""Outages of the cloud tier's dependencies while producing (ingest and uploader processes on
their own S3 server and etcd):

- the S3 server frozen (SIGSTOP) for 10 s: every produce still succeeds quickly; uploads stall
  and catch up after it returns;
- etcd frozen for 5 s (past two of the services' 2 s etcd request deadlines): producing is
  unaffected; uploads pause and resume.

Retention runs all along with a 1 MB WAL limit. Afterwards the cloud tier holds every offset
exactly once (verify_partition): had retention dropped a segment before it was uploaded, the
uploader could not have read it and the tier would have a hole."""

from __future__ import annotations

import asyncio
import os
import signal
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import boto3
import pytest

from danube.bus import Bus, TopicName
from danube.config import BusConfig, MetadataConfig
from danube.frame import Record, encode_record
from danube.meta import MetaStore
from danube.meta import keys as meta_keys
from danube.meta.records import TopicConfig, UploaderCheckpoint
from danube.storage import ObjectStore
from danube.up import ProcessSpec, ServerProcess, etcd_spec, free_port, moto_cloud, s3_spec
from danube.up.servers import MOTO_ACCESS_KEY, MOTO_REGION
from danube.uploader.verify import verify_partition
from danube.wire.ingest.client import IngestClient

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

TOPIC = TopicName("default", "outage")
S3_OUTAGE_S = 10.0  # 1-4 MB produced meanwhile: past the WAL limit, none of it uploaded
ETCD_OUTAGE_S = 5.0  # past two etcd request deadlines (ETCD_REQUEST_TIMEOUT_S)
ETCD_REQUEST_TIMEOUT_S = 2.0
WAL_LIMIT_BYTES = 1024 * 1024  # DANUBE_WAL_CLOUD__WAL__RETENTION__SIZE_MB below
# Each record's payload is padded to this size: at the floor of 10 produces of 50 records a
# second (asserted below) the S3 outage outgrows the WAL limit; at the usual 40, four times.
PAYLOAD_BYTES = 200
PRODUCE_BOUND_S = 2.0  # no produce may take longer than this, outage or not


class Producer:
    """Produces 50 records every 20 ms; keeps each produce's latency and the last offset."""

    def __init__(self, client: IngestClient) -> None:
        self.client = client
        self.latencies: list[tuple[float, float]] = []  # (started, seconds)
        self.errors: list[BaseException] = []
        self.last = -1
        self.stop = asyncio.Event()

    async def run(self) -> None:
        number = 0
        while not self.stop.is_set():
            records = [
                encode_record(
                    Record(
                        payload=(b"%d:" % (number + i)).ljust(PAYLOAD_BYTES, b"o"),
                        publish_time_ms=1,
                        producer="o",
                    )
                )
                for i in range(50)
            ]
            started = time.monotonic()
            try:
                first = await self.client.produce(TOPIC, records, timeout_s=10)
            except Exception as exc:
                self.errors.append(exc)
                continue
            self.latencies.append((started, time.monotonic() - started))
            self.last = first + len(records) - 1
            number += len(records)
            await asyncio.sleep(0.02)

    def during(self, start: float, end: float) -> list[float]:
        return [seconds for at, seconds in self.latencies if start <= at < end]


async def _uploaded_through(store: MetaStore) -> int:
    found = await store.get_model(meta_keys.uploader_checkpoint_key(TOPIC), UploaderCheckpoint)
    return -1 if found is None else found.uploaded_through


async def _catch_up(store: MetaStore, target: int, timeout_s: float = 90) -> float:
    started = time.monotonic()
    async with asyncio.timeout(timeout_s):
        while True:
            if await _uploaded_through(store) >= target:
                break
            await asyncio.sleep(0.2)
    return time.monotonic() - started


async def test_s3_and_etcd_outages_do_not_touch_producing_and_uploads_catch_up(
    tmp_path: Path, nats_url: str, spec_for: Callable[..., ProcessSpec]
) -> None:
    s3 = ServerProcess(s3_spec(port=free_port()), tmp_path / "s3.log")
    etcd = ServerProcess(
        etcd_spec(data_dir=tmp_path / "etcd", client_port=free_port(), peer_port=free_port()),
        tmp_path / "etcd.log",
    )
    processes: list[ServerProcess] = []
    with s3, etcd:
        endpoint = f"http://127.0.0.1:{s3.spec.port}"
        boto3.client(
            "s3",
            endpoint_url=endpoint,
            region_name=MOTO_REGION,
            aws_access_key_id=MOTO_ACCESS_KEY,
            aws_secret_access_key=MOTO_ACCESS_KEY,
        ).create_bucket(Bucket="outage")
        etcd_endpoint = f"127.0.0.1:{etcd.spec.port}"
        env = {
            "DANUBE_WAL_CLOUD__METADATA__ETCD_ENDPOINT": etcd_endpoint,  # this test's own etcd
            "DANUBE_WAL_CLOUD__METADATA__PREFIX": "/outage",
            "DANUBE_WAL_CLOUD__METADATA__REQUEST_TIMEOUT_S": str(ETCD_REQUEST_TIMEOUT_S),
            "DANUBE_WAL_CLOUD__CLOUD__BACKEND": "s3",
            "DANUBE_WAL_CLOUD__CLOUD__ROOT": "s3://outage/danube",
            "DANUBE_WAL_CLOUD__CLOUD__ENDPOINT": endpoint,
            "DANUBE_WAL_CLOUD__CLOUD__REGION": MOTO_REGION,
            "DANUBE_WAL_CLOUD__CLOUD__ACCESS_KEY": MOTO_ACCESS_KEY,
            "DANUBE_WAL_CLOUD__CLOUD__SECRET_KEY": MOTO_ACCESS_KEY,
            "DANUBE_WAL_CLOUD__UPLOADER__INTERVAL_SECONDS": "1",
            # Leases outlive the etcd outage (a frozen etcd cannot renew them).
            "DANUBE_INGEST__LEASE_TTL_S": "30",
            "DANUBE_UPLOADER__LEASE_TTL_S": "30",
            "DANUBE_RETENTION__LEASE_TTL_S": "30",
            # Small segments and a 1 MB WAL limit: retention drops uploaded segments all along.
            "DANUBE_WAL_CLOUD__WAL__ROTATION__MAX_BYTES": "65536",
            "DANUBE_WAL_CLOUD__WAL__RETENTION__SIZE_MB": "1",
            "DANUBE_RETENTION__CHECK_INTERVAL_S": "1",
        }
        for kind in ("ingest", "uploader", "retention"):
            spec = spec_for(kind, f"{kind}-o", **env)
            processes.append(ServerProcess(spec, tmp_path / f"{kind}.log"))
        store = await MetaStore.connect(
            MetadataConfig(etcd_endpoint=etcd_endpoint, prefix="/outage")
        )
        bus = await Bus.connect(BusConfig(servers=[nats_url]), name="outage-test")
        producer = Producer(IngestClient(bus))
        try:
            await store.put_model(meta_keys.topic_key(TOPIC), TopicConfig(created_ms=1))
            for process in processes:
                await asyncio.to_thread(process.start)
            task = asyncio.create_task(producer.run())
            await _catch_up(store, 0)  # uploads flow before the outages: a first one,
            await _catch_up(store, producer.last)  # then all produced so far

            assert s3.pid is not None
            s3_down = time.monotonic()
            os.kill(s3.pid, signal.SIGSTOP)
            await asyncio.sleep(S3_OUTAGE_S)
            stalled_at = await _uploaded_through(store)
            behind = producer.last
            os.kill(s3.pid, signal.SIGCONT)
            s3_up = time.monotonic()
            s3_catch_up_s = await _catch_up(store, behind)

            assert etcd.pid is not None
            etcd_down = time.monotonic()
            os.kill(etcd.pid, signal.SIGSTOP)
            await asyncio.sleep(ETCD_OUTAGE_S)
            os.kill(etcd.pid, signal.SIGCONT)
            etcd_up = time.monotonic()
            producer.stop.set()
            await task
            etcd_catch_up_s = await _catch_up(store, producer.last)
            wal_start = (await IngestClient(bus).wal_offsets(TOPIC)).start_offset
            cloud = moto_cloud(endpoint, "outage")
            report = await verify_partition(store, ObjectStore.from_config(cloud), TOPIC)
        finally:
            producer.stop.set()
            for process in processes:
                process.stop()
            await bus.close()
            await store.close()

    assert producer.errors == []
    during_s3 = producer.during(s3_down, s3_up)
    during_etcd = producer.during(etcd_down, etcd_up)
    before = producer.during(0, s3_down)
    assert len(during_s3) > S3_OUTAGE_S * 10  # kept producing all along (about 40/s)
    assert len(during_s3) * 50 * PAYLOAD_BYTES > WAL_LIMIT_BYTES  # more than the WAL may hold
    assert len(during_etcd) > ETCD_OUTAGE_S * 10
    assert max(during_s3 + during_etcd) < PRODUCE_BOUND_S
    assert stalled_at < behind  # uploads really stopped while S3 was away
    assert wal_start > 0  # retention dropped segments; only uploaded ones (no gap below)
    assert report.ok, report.problems
    assert report.offsets == list(range(producer.last + 1))
    print(
        f"produce p50 before {statistics.median(before) * 1000:.1f} ms, during S3 outage "
        f"{statistics.median(during_s3) * 1000:.1f} ms, during etcd outage "
        f"{statistics.median(during_etcd) * 1000:.1f} ms; catch-up after S3 {s3_catch_up_s:.1f} s, "
        f"after etcd {etcd_catch_up_s:.1f} s"
    )

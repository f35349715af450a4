"""A million messages (a tenth in `make test`), on fs and on the S3 server, through the real
services in-process (ingest, uploader, cloud_reader, dispatcher): once the uploader has put them
in at least 20 objects (3 for a tenth) and the early WAL segments are dropped, Spark's count and
content (partition, offset, key, payload hash) equal exactly what a subscription from earliest
receives (from objects through the cloud_reader, then from the WAL); an offset range is exact at
both ends; the Parquet backfill writes the same rows. Prints both rates (the fair comparison,
with the services in processes of their own and the HTTP consume API, is
tests/bench/bench_spark.py)."""

from __future__ import annotations

import asyncio
import hashlib
import time
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from danube.bus import Bus, TopicName
from danube.cloud_reader import app as cloud_reader_app
from danube.config import (
    BusConfig,
    CloudConfig,
    CloudReaderConfig,
    DanubeSettings,
    DispatcherConfig,
    IngestConfig,
    MetadataConfig,
    RotationConfig,
    UploaderConfig,
    UploaderServiceConfig,
    WalCloudConfig,
    WalConfig,
)
from danube.dispatcher import app as dispatcher_app
from danube.frame import Record, decode_record, encode_record
from danube.ingest import app as ingest_app
from danube.meta import MetaStore
from danube.meta import keys as meta_keys
from danube.meta.records import TopicConfig, UploaderCheckpoint
from danube.runtime.service import run_in_process
from danube.spark.parquet import backfill_to_parquet
from danube.up import free_port
from danube.uploader import app as uploader_app
from danube.wire.dispatcher.client import DispatcherClient
from danube.wire.ingest import protocol as ingest_protocol
from danube.wire.ingest.client import IngestClient

# A few minutes per backend: e2e.
pytestmark = [pytest.mark.e2e, pytest.mark.spark, pytest.mark.timeout(900)]

TOPIC = TopicName("default", "million")
PARTITIONS = 2
MILLION = 1_000_000
PRODUCE_BATCH = 8000  # about 700 KB: one NATS message
OBJECTS_PER_MILLION_MIN = 20

Row = tuple[int, int, str | None, str]  # partition, offset, key, sha256(payload) hex


def _message(partition: int, offset: int) -> tuple[str | None, bytes]:
    """The key and payload of a message: some without a key, payloads of 20..70 bytes."""
    key = None if offset % 3 == 0 else f"user-{offset % 1000}"
    return key, b"%d/%08d:" % (partition, offset) + bytes([65 + offset % 26]) * (offset % 51)


def _settings(
    nats_url: str, etcd: str, prefix: str, wal_dir: Path, cloud: CloudConfig, messages_total: int
) -> DanubeSettings:
    # Segments of 4 MiB for a million (a tenth: 410 KiB), so that several can be dropped.
    segment_bytes = max(256 << 10, (4 << 20) * messages_total // MILLION)
    return DanubeSettings(
        bus=BusConfig(servers=[nats_url]),
        wal_cloud=WalCloudConfig(
            wal=WalConfig(dir=wal_dir, rotation=RotationConfig(max_bytes=segment_bytes)),
            metadata=MetadataConfig(etcd_endpoint=etcd, prefix=prefix),
            uploader=UploaderConfig(interval_seconds=1, max_object_mb=2),
            cloud=cloud,
        ),
        ingest=IngestConfig(lease_ttl_s=3, metrics_port=free_port()),
        uploader=UploaderServiceConfig(lease_ttl_s=3, metrics_port=free_port()),
        cloud_reader=CloudReaderConfig(lease_ttl_s=3, metrics_port=free_port()),
        dispatcher=DispatcherConfig(lease_ttl_s=3, metrics_port=free_port()),
    )


async def _produce(bus: Bus, messages_total: int) -> list[Row]:
    """Produce every message straight to ingest, partitions side by side; what was stored."""
    client = IngestClient(bus)
    per_partition = messages_total // PARTITIONS

    async def one(index: int) -> list[Row]:
        rows: list[Row] = []
        for first in range(0, per_partition, PRODUCE_BATCH):
            last = min(first + PRODUCE_BATCH, per_partition)
            messages = [_message(index, o) for o in range(first, last)]
            records = [
                encode_record(
                    Record(payload=p, publish_time_ms=int(time.time() * 1000), producer="t", key=k)
                )
                for k, p in messages
            ]
            offset = await client.produce(TOPIC.partition_name(index), records, timeout_s=30)
            assert offset == first  # offsets are assigned in order from 0
            rows += [
                (index, first + i, k, hashlib.sha256(p).hexdigest())
                for i, (k, p) in enumerate(messages)
            ]
        return rows

    results = await asyncio.gather(*(one(i) for i in range(PARTITIONS)))
    return [row for rows in results for row in rows]


async def _uploaded(store: MetaStore, messages_total: int) -> int:
    """Wait until every partition is uploaded to its last offset; the number of objects."""
    last = messages_total // PARTITIONS - 1
    async with asyncio.timeout(300):
        for partition in TOPIC.partitions(PARTITIONS):
            key = meta_keys.uploader_checkpoint_key(partition)
            while True:
                checkpoint = await store.get_model(key, UploaderCheckpoint)
                if checkpoint is not None and checkpoint.uploaded_through >= last:
                    break
                await asyncio.sleep(0.5)
    objects = 0
    for partition in TOPIC.partitions(PARTITIONS):
        objects += len(await store.range(meta_keys.object_descriptors_prefix(partition)))
    return objects


async def _drop_wal_below(bus: Bus, offset: int) -> None:
    """Ask ingest to drop the WAL segments below ``offset`` in every partition."""
    for partition in TOPIC.partitions(PARTITIONS):
        reply = await bus.request(
            bus.subjects.wal_drop_below(partition),
            ingest_protocol.encode_offset(offset),
            timeout_s=10,
        )
        _, start = ingest_protocol.decode_drop_reply(reply.body)
        assert 0 < start <= offset  # early segments gone: those offsets come from objects
        assert (await IngestClient(bus).fetch(partition, 0)).below_wal_start


async def _consume(bus: Bus, messages_total: int) -> tuple[list[Row], float]:
    """Every message, through a subscription from earliest, acked as received; and the
    messages/s of the reading."""
    client = DispatcherClient(bus)
    consumer = await client.attach(TOPIC, "check", "c", type="exclusive", start="earliest")
    rows: list[Row] = []
    started = time.perf_counter()
    async with asyncio.timeout(600):
        while len(rows) < messages_total:
            got = await client.poll(TOPIC, "check", consumer, max=5000, wait_ms=1000)
            for message in got:
                record = decode_record(message.record)
                index = TopicName(TOPIC.namespace, message.partition).partition
                assert index is not None
                digest = hashlib.sha256(record.payload).hexdigest()
                rows.append((index, message.offset, record.key, digest))
            if got:
                await client.ack(TOPIC, "check", consumer, [(m.partition, m.offset) for m in got])
    seconds = time.perf_counter() - started
    assert await client.poll(TOPIC, "check", consumer, wait_ms=300) == []
    return rows, messages_total / seconds


def _spark_rows(spark: SparkSession, options: dict[str, str], **more: Any) -> list[Row]:
    df = spark.read.format("danube").options(**options, **{k: str(v) for k, v in more.items()})
    table = (
        df.load()
        .select("partition", "offset", "key", F.sha2("payload", 256).alias("hash"))
        .toArrow()
    )
    columns = [table.column(name).to_pylist() for name in ("partition", "offset", "key", "hash")]
    return sorted(zip(*columns, strict=True))


# A million on the S3 server and on the local filesystem in `make bench` (a soak: 3 minutes
# each); a tenth of that on the S3 server in `make test`.
@pytest.mark.parametrize(
    ("cloud_config", "messages_total"),
    [
        pytest.param("fs", MILLION, marks=pytest.mark.soak),
        pytest.param("s3", MILLION, marks=pytest.mark.soak),
        pytest.param("s3", MILLION // 10),
    ],
    indirect=["cloud_config"],
)
async def test_a_million_messages_read_by_spark_equal_what_a_consumer_receives(
    spark: SparkSession,
    bus: Bus,
    store: MetaStore,
    nats_url: str,
    etcd_endpoint: str,
    meta_prefix: str,
    tmp_path: Path,
    cloud_config: CloudConfig,
    config_file: Path,
    messages_total: int,
) -> None:
    settings = _settings(
        nats_url, etcd_endpoint, meta_prefix, tmp_path / "wal", cloud_config, messages_total
    )
    await store.put_model(
        meta_keys.topic_key(TOPIC), TopicConfig(partitions=PARTITIONS, created_ms=1)
    )
    options = {"topic": str(TOPIC), "config": str(config_file)}
    async with (
        run_in_process(ingest_app.serve, settings, "ingest-m"),
        run_in_process(uploader_app.serve, settings, "uploader-m"),
        run_in_process(cloud_reader_app.serve, settings, "cloud-m"),
        run_in_process(dispatcher_app.serve, settings, "disp-m"),
    ):
        started = time.perf_counter()
        produced = await _produce(bus, messages_total)
        produce_s = time.perf_counter() - started
        objects = await _uploaded(store, messages_total)
        upload_s = time.perf_counter() - started - produce_s
        assert objects >= max(3, OBJECTS_PER_MILLION_MIN * messages_total // MILLION)
        await _drop_wal_below(bus, messages_total // PARTITIONS // 2)
        consumed, consume_rate = await _consume(bus, messages_total)

    assert sorted(consumed) == produced  # the consumer got each message once
    started = time.perf_counter()
    count = await asyncio.to_thread(
        lambda: spark.read.format("danube").options(**options).load().count()
    )
    assert count == messages_total
    read = await asyncio.to_thread(_spark_rows, spark, options)
    assert read == sorted(consumed)

    per_partition = messages_total // PARTITIONS
    start, end = per_partition // 4 - 1543, per_partition * 4 // 5 + 1  # 123 457, 400 001
    ranged = await asyncio.to_thread(
        _spark_rows, spark, options, start_offset=start, end_offset=end
    )
    assert ranged == [row for row in produced if start <= row[1] < end]

    output = str(tmp_path / "parquet")
    backfill = await asyncio.to_thread(backfill_to_parquet, spark, options, output)
    assert backfill.messages == messages_total

    def parquet_rows() -> list[Row]:
        table = (
            spark.read.parquet(output)
            .select("partition", "offset", "key", F.sha2("payload", 256).alias("hash"))
            .toArrow()
        )
        names = ("partition", "offset", "key", "hash")
        return sorted(zip(*[table.column(n).to_pylist() for n in names], strict=True))

    assert await asyncio.to_thread(parquet_rows) == produced
    spark_s = time.perf_counter() - started
    ratio = backfill.messages_per_s / consume_rate
    print(
        f"\n[{cloud_config.backend}] {messages_total} messages in {objects} objects "
        f"(produce {produce_s:.1f} s, upload {upload_s:.1f} s, Spark checks {spark_s:.1f} s): "
        f"Parquet backfill "
        f"{backfill.messages_per_s:,.0f} msg/s ({backfill.seconds:.1f} s), a subscription "
        f"in-process {consume_rate:,.0f} msg/s: {ratio:.1f}x"
    )

"""A compressed topic through the whole mesh of processes: the SDK's zstd and lz4 producers
write one topic, the uploader moves its records to objects as they are (compressed), Spark
reads every payload as it was sent, and an SDK consumer does too."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import TYPE_CHECKING

import orjson
import pytest

from danube.client import AsyncDanubeClient
from danube.config import MetadataConfig
from danube.config.wal_cloud import FsCloud
from danube.frame import decode_frames, decode_record_fields
from danube.meta import MetaStore, TopicName
from danube.meta import keys as meta_keys
from danube.meta.records import UploaderCheckpoint
from danube.storage import ObjectDescriptor, ObjectStore
from danube.up import ServerProcess
from tests.conftest import write_config

if TYPE_CHECKING:
    from collections.abc import Callable

    from pyspark.sql import SparkSession

pytestmark = [pytest.mark.e2e, pytest.mark.spark, pytest.mark.timeout(300)]

TOPIC = TopicName("default", "logs-compressed")
PER_CODEC = 300


def log_line(index: int) -> bytes:
    return orjson.dumps(
        {
            "ts": 1_764_392_400_000 + index,
            "level": "INFO",
            "service": "checkout",
            "trace_id": f"{index * 2654435761:032x}",
            "message": " ".join(f"step={s} sku={index}-{s} ok" for s in range(35)),
        }
    )


async def test_a_compressed_topic_is_uploaded_compressed_and_read_back_by_spark_and_the_sdk(
    tmp_path: Path,
    etcd_endpoint: str,
    meta_prefix: str,
    services: Callable[..., ServerProcess],
    spark: SparkSession,
) -> None:
    cloud = FsCloud(backend="fs", root=str(tmp_path / "objects"))
    env = {
        "DANUBE_WAL_CLOUD__CLOUD__BACKEND": "fs",
        "DANUBE_WAL_CLOUD__CLOUD__ROOT": cloud.root,
        "DANUBE_WAL_CLOUD__UPLOADER__INTERVAL_SECONDS": "1",
    }
    services("ingest", "ingest-0", **env)
    services("uploader", "uploader-0", **env)
    services("dispatcher", "dispatcher-0", **env)
    discovery = services("discovery", "discovery-0", **env)
    url = f"http://127.0.0.1:{discovery.spec.port}"
    lines = [log_line(i) for i in range(2 * PER_CODEC)]
    async with AsyncDanubeClient(url) as client:
        for codec, part in (("zstd", lines[:PER_CODEC]), ("lz4", lines[PER_CODEC:])):
            async with client.producer(str(TOPIC), compression=codec, name=codec) as producer:
                done = await producer.send_many(part)
                await done

    store = await MetaStore.connect(MetadataConfig(etcd_endpoint=etcd_endpoint, prefix=meta_prefix))
    try:
        async with asyncio.timeout(60):
            while True:
                checkpoint = await store.get_model(
                    meta_keys.uploader_checkpoint_key(TOPIC), UploaderCheckpoint
                )
                if checkpoint is not None and checkpoint.uploaded_through >= len(lines) - 1:
                    break
                await asyncio.sleep(0.2)
        descriptors = await store.range(meta_keys.object_descriptors_prefix(TOPIC))
    finally:
        await store.close()

    # The objects hold the records as produced: compressed, each with its codec.
    objects = ObjectStore.from_config(cloud)
    stored = []
    for kv in descriptors:
        frames, _ = decode_frames(await objects.read(ObjectDescriptor.from_bytes(kv.value).key))
        stored += [decode_record_fields(f.payload, decompress=False) for f in frames]
    assert [r.compression for r in stored] == ["zstd"] * PER_CODEC + ["lz4"] * PER_CODEC
    assert sum(len(r.payload) for r in stored) < sum(map(len, lines)) / 2

    config = write_config(tmp_path / "spark.yaml", etcd_endpoint, meta_prefix, cloud)
    df = spark.read.format("danube").option("config", str(config)).option("topic", str(TOPIC))
    rows = await asyncio.to_thread(lambda: df.load().select("offset", "payload").collect())
    assert sorted((row["offset"], bytes(row["payload"])) for row in rows) == list(enumerate(lines))

    async with (
        AsyncDanubeClient(url) as client,
        client.consumer(str(TOPIC), "e2e", start="earliest") as consumer,
    ):
        got = [await consumer.receive(15) for _ in lines]
    assert [m.payload for m in got] == lines

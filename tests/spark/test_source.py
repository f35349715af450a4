"""spark.read.format("danube") on Spark local[2], with real etcd and objects on fs and on the
S3 server: every field of every message read exactly once (objects cut into sub-ranges,
several partitions, one partition alone); offset and time ranges exact at both ends; one
task per partition in offset order; a flipped byte fails the job naming the object and the
offset; bad options and unknown topics fail with what is wrong; a topic with nothing uploaded
reads empty."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

import pytest
from pyspark.sql import DataFrame, SparkSession

from danube.config import CloudConfig
from danube.frame import decode_frames, decode_record_fields
from danube.frame.compression import Compression
from danube.meta import MetaStore
from danube.meta import keys as meta_keys
from danube.meta.records import TopicConfig
from danube.names import TopicName
from danube.storage import ObjectDescriptor, ObjectStore

from tiers import FIRST_TIME_MS, Message, upload, write_tier

pytestmark = [pytest.mark.integration, pytest.mark.spark, pytest.mark.timeout(300)]

TOPIC = TopicName("default", "history")
COUNTS = [3000, 2500, 1]  # three partitions, one with a single message
PER_OBJECT = 700
_T = TypeVar("_T")


async def _in_thread(work: Callable[[], _T]) -> _T:
    """Spark blocks: run it off the event loop (etcd and the services stay served)."""
    return await asyncio.to_thread(work)


def _read(spark: SparkSession, config: Path, **options: Any) -> DataFrame:
    reader = spark.read.format("danube").option("config", str(config))
    for name, value in {"topic": str(TOPIC), **options}.items():
        reader = reader.option(name, str(value))
    return reader.load()


def _rows(df: DataFrame) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = df.toArrow().to_pylist()
    return [
        {
            "partition": row["partition"],
            "offset": row["offset"],
            "publish_time_ms": int(row["publish_time"].timestamp() * 1000),
            "producer": row["producer"],
            "key": row["key"],
            "attributes": dict(row["attributes"]),
            "payload": row["payload"],
            "topic": row["topic"],
        }
        for row in rows
    ]


def _expected(messages: list[Message]) -> list[dict[str, Any]]:
    return [
        {
            "partition": m.partition,
            "offset": m.offset,
            "publish_time_ms": m.publish_time_ms,
            "producer": m.producer,
            "key": m.key,
            "attributes": m.attributes,
            "payload": m.payload,
            "topic": str(TOPIC),
        }
        for m in messages
    ]


def _sorted(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return sorted(rows, key=lambda row: (row["partition"], row["offset"]))


@pytest.fixture
async def tier(store: MetaStore, cloud_config: CloudConfig) -> list[Message]:
    """The test topic: three partitions uploaded in objects of 700 messages."""
    objects = ObjectStore.from_config(cloud_config)
    return await write_tier(store, objects, TOPIC, COUNTS, per_object=PER_OBJECT)


async def test_every_message_is_read_exactly_with_objects_cut_into_sub_ranges(
    spark: SparkSession, config_file: Path, tier: list[Message], store: MetaStore
) -> None:
    objects = 0
    for partition in TOPIC.partitions(len(COUNTS)):
        objects += len(await store.range(meta_keys.object_descriptors_prefix(partition)))
    assert objects == 5 + 4 + 1
    df = _read(spark, config_file, max_partition_bytes=64 * 1024, chunk_bytes=4096)
    assert df.schema.simpleString() == (
        "struct<topic:string,partition:int,offset:bigint,publish_time:timestamp,"
        "producer:string,key:string,attributes:map<string,string>,payload:binary,"
        "schema_id:bigint,schema_version:int>"
    )
    tasks = await _in_thread(lambda: df.rdd.getNumPartitions())
    assert tasks > objects  # objects of ~100 KB were cut at index entries
    rows = await _in_thread(lambda: _rows(df))
    assert len(rows) == sum(COUNTS)
    assert _sorted(rows) == _expected(tier)


async def test_offset_ranges_are_exact_at_both_ends(
    spark: SparkSession, config_file: Path, tier: list[Message]
) -> None:
    cases = [(0, 1), (699, 701), (700, 1400), (1234, 2999), (2999, 10**6), (2500, 2500)]
    for start, end in cases:
        df = _read(spark, config_file, start_offset=start, end_offset=end)
        rows = await _in_thread(lambda df=df: _rows(df))  # type: ignore[misc]
        wanted = [m for m in tier if start <= m.offset < end]
        assert _sorted(rows) == _expected(wanted), (start, end)
    # No end: to the last uploaded offset; one partition alone.
    df = _read(spark, config_file, topic=f"{TOPIC}-part-1", start_offset=2400)
    rows = await _in_thread(lambda: _rows(df))
    assert _sorted(rows) == _expected([m for m in tier if m.partition == 1 and m.offset >= 2400])


async def test_time_ranges_are_exact_at_both_ends(
    spark: SparkSession, config_file: Path, tier: list[Message]
) -> None:
    start_ms, end_ms = tier[100].publish_time_ms, tier[2000].publish_time_ms
    iso = datetime.fromtimestamp(start_ms / 1000, UTC).isoformat()
    df = _read(spark, config_file, start_time=iso, end_time=end_ms)
    rows = await _in_thread(lambda: _rows(df))
    wanted = [m for m in tier if start_ms <= m.publish_time_ms < end_ms]
    assert len(wanted) == 2 * 1900  # offsets 100..1999 of partitions 0 and 1
    assert _sorted(rows) == _expected(wanted)


async def test_split_by_partition_reads_each_partition_in_one_task_in_offset_order(
    spark: SparkSession, config_file: Path, tier: list[Message]
) -> None:
    df = _read(spark, config_file, split="partition", start_offset=10)

    def by_task() -> list[list[tuple[int, int]]]:
        return df.rdd.mapPartitions(
            lambda rows: [[(row["partition"], row["offset"]) for row in rows]]
        ).collect()

    tasks = await _in_thread(by_task)
    assert tasks == [
        [(p, offset) for offset in range(10, count)] for p, count in enumerate(COUNTS) if count > 10
    ]


async def test_a_flipped_byte_fails_the_job_naming_the_object_and_the_offset(
    spark: SparkSession,
    config_file: Path,
    tier: list[Message],
    store: MetaStore,
    cloud_config: CloudConfig,
) -> None:
    partition = TOPIC.partition_name(1)
    kvs = await store.range(meta_keys.object_descriptors_prefix(partition))
    descriptor = ObjectDescriptor.from_bytes(kvs[2].value)
    objects = ObjectStore.from_config(cloud_config)
    body = bytearray(await objects.read(descriptor.key))
    frames, _ = decode_frames(bytes(body))
    position = sum(frame.size_bytes for frame in frames[:300])
    hit = frames[300].offset
    body[position + 16 + 3] ^= 0x40  # a byte of the record inside the frame
    await objects.write(descriptor.key, bytes(body))

    df = _read(spark, config_file)
    with pytest.raises(Exception) as failed:  # noqa: PT011 - Spark's error wraps ours
        await _in_thread(df.count)
    text = str(failed.value)
    assert "CorruptObjectError" in text
    assert f"object {descriptor.key}: bad frame at byte {position} (offset {hit})" in text
    # What comes before the flipped frame is still readable, and exact.
    df = _read(spark, config_file, topic=str(partition), end_offset=hit)
    rows = await _in_thread(lambda: _rows(df))
    assert _sorted(rows) == _expected([m for m in tier if m.partition == 1 and m.offset < hit])


async def test_unknown_topics_and_bad_options_fail_saying_what_is_wrong(
    spark: SparkSession, config_file: Path, store: MetaStore
) -> None:
    cases: list[tuple[dict[str, Any], str]] = [
        ({"topic": "/default/nothing"}, "TopicNotReadableError: topic /default/nothing: no such"),
        ({"start_offst": 1}, "InvalidOptionError: option 'start_offst': unknown option"),
        ({"end_offset": "soon"}, "option 'end_offset': 'soon' is not an integer"),
    ]
    await store.put_model(
        meta_keys.topic_key(TopicName("default", "live")),
        TopicConfig(dispatch="non_reliable", created_ms=1),
    )
    cases.append(({"topic": "/default/live"}, "non-reliable: nothing is in object storage"))
    for options, message in cases:
        with pytest.raises(Exception) as failed:  # noqa: PT011 - Spark's error wraps ours
            await _in_thread(_read(spark, config_file, **options).count)
        assert message in str(failed.value), options
    # A reliable topic with nothing uploaded yet is empty, not an error.
    await store.put_model(
        meta_keys.topic_key(TopicName("default", "new")), TopicConfig(created_ms=1)
    )
    assert await _in_thread(_read(spark, config_file, topic="/default/new").count) == 0


@pytest.mark.parametrize("cloud_config", ["fs"], indirect=True)
async def test_a_compressed_topic_reads_as_the_messages_sent(
    spark: SparkSession, config_file: Path, store: MetaStore, cloud_config: CloudConfig
) -> None:
    """Objects holding zstd, lz4 and plain records (as a compressing producer's topic
    does): Spark reads every payload decompressed; the object holds them compressed."""
    topic = TopicName("default", "compressed")
    codecs: list[Compression | None] = ["zstd", "lz4", None]
    messages = [
        Message(
            0,
            offset,
            FIRST_TIME_MS + offset,
            "t",
            None,
            {},
            b'{"level": "INFO", "n": %d, "message": "%s"}' % (offset, b"x=1 y=2 " * 120),
            compression=codecs[offset % 3],
        )
        for offset in range(300)
    ]
    objects = ObjectStore.from_config(cloud_config)
    await upload(store, objects, topic, messages)
    (kv,) = await store.range(meta_keys.object_descriptors_prefix(topic))
    descriptor = ObjectDescriptor.from_bytes(kv.value)
    frames, _ = decode_frames(await objects.read(descriptor.key))
    stored = [decode_record_fields(f.payload, decompress=False) for f in frames]
    assert [r.compression for r in stored] == [m.compression for m in messages]
    assert sum(len(r.payload) for r in stored) < sum(len(m.payload) for m in messages) / 2
    df = _read(spark, config_file, topic=str(topic))
    rows = await _in_thread(lambda: _rows(df))
    assert sorted((r["offset"], r["payload"]) for r in rows) == [
        (m.offset, m.payload) for m in messages
    ]

"""The backfill jobs on Spark local[2], with real etcd and objects on fs and on the S3 server.
To Parquet: every message once, every column, in partition=<n>/date=<UTC day> directories;
an offset range exact; an existing output refused, overwritten or appended as asked; a run
that failed leaves nothing in the way of its re-run; given only etcd, the objects are found
where the cluster recorded them (an error names that place). Into a
topic through the HTTP API (discovery and ingest in-process): every message once with its
key, routed by key, in source order per partition, its origin in two attributes; a re-run
sends nothing; a checkpoint lost for the last batch re-sends exactly that batch; another
selection under the same name is refused; an unreachable server fails the job having
recorded nothing."""

from __future__ import annotations

import asyncio
import collections
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pyarrow.dataset as pads
import pytest
from pydantic import SecretStr
from pyspark.sql import SparkSession

from danube.bus import Bus
from danube.config import (
    BusConfig,
    CloudConfig,
    DanubeSettings,
    DiscoveryConfig,
    IngestConfig,
    MetadataConfig,
    WalCloudConfig,
    WalConfig,
)
from danube.config.wal_cloud import FsCloud
from danube.discovery import app as discovery_app
from danube.frame import decode_record
from danube.ingest import app as ingest_app
from danube.meta import MetaStore
from danube.meta import keys as meta_keys
from danube.meta.records import TopicConfig
from danube.names import TopicName
from danube.routing import partition_for_key
from danube.runtime.service import run_in_process
from danube.spark import BackfillStateError
from danube.spark.parquet import backfill_to_parquet
from danube.spark.to_topic import (
    ORIGIN_OFFSET,
    ORIGIN_SOURCE,
    Checkpoint,
    TopicBackfill,
    TopicBackfillJob,
    backfill_to_topic,
)
from danube.storage import ObjectStore, object_key
from danube.storage.location import describe
from danube.up import free_port
from danube.uploader.record import record_object_store
from danube.wire.ingest.client import IngestClient

from tiers import ROOT_PREFIX, Message, write_tier

pytestmark = [pytest.mark.integration, pytest.mark.spark, pytest.mark.timeout(300)]

SOURCE = TopicName("default", "orders")
TARGET = TopicName("default", "replay")
TARGET_PARTITIONS = 3
MINUTE_MS = 60_000


def _row(m: Message) -> dict[str, Any]:
    return {
        "partition": m.partition,
        "offset": m.offset,
        "publish_time_ms": m.publish_time_ms,
        "producer": m.producer,
        "key": m.key,
        "attributes": m.attributes,
        "payload": m.payload,
        "schema": (m.schema_id, m.schema_version),
        "date": datetime.fromtimestamp(m.publish_time_ms / 1000, UTC).date().isoformat(),
    }


def _parquet_rows(output: Path) -> list[dict[str, Any]]:
    dataset = pads.dataset(output, format="parquet", partitioning="hive")
    rows = [
        {
            "partition": int(row["partition"]),
            "offset": row["offset"],
            "publish_time_ms": int(row["publish_time"].timestamp() * 1000),
            "producer": row["producer"],
            "key": row["key"],
            "attributes": dict(row["attributes"]),
            "payload": row["payload"],
            "schema": (row["schema_id"], row["schema_version"]),
            "date": str(row["date"]),
        }
        for row in dataset.to_table().to_pylist()
    ]
    assert {row["topic"] for row in dataset.to_table().to_pylist()} == {str(SOURCE)}
    return sorted(rows, key=lambda row: (row["partition"], row["offset"]))


async def test_parquet_backfill_writes_every_message_by_partition_and_date(
    spark: SparkSession,
    store: MetaStore,
    cloud_config: CloudConfig,
    config_file: Path,
    tmp_path: Path,
) -> None:
    objects = ObjectStore.from_config(cloud_config)
    # One message a minute from 22:13 UTC: partition 0 spans four dates, partition 1 two.
    tier = await write_tier(
        store, objects, SOURCE, [3000, 1500], per_object=800, time_step_ms=MINUTE_MS
    )
    options = {"topic": str(SOURCE), "config": str(config_file)}
    output = tmp_path / "out"
    result = await asyncio.to_thread(backfill_to_parquet, spark, options, str(output))
    assert result.messages == len(tier)
    assert result.seconds > 0
    directories = {str(p.relative_to(output)) for p in output.glob("partition=*/date=*")}
    assert (
        directories
        == {f"partition={m.partition}/date={_row(m)['date']}" for m in tier}
        == {
            "partition=0/date=2023-11-14",
            "partition=0/date=2023-11-15",
            "partition=0/date=2023-11-16",
            "partition=0/date=2023-11-17",
            "partition=1/date=2023-11-14",
            "partition=1/date=2023-11-15",
        }
    )
    assert _parquet_rows(output) == [_row(m) for m in tier]

    with pytest.raises(Exception, match="already exists"):  # the default mode: refuse
        await asyncio.to_thread(backfill_to_parquet, spark, options, str(output))
    ranged = {**options, "start_offset": "799", "end_offset": "1601"}
    again = await asyncio.to_thread(
        backfill_to_parquet, spark, ranged, str(output), mode="overwrite"
    )
    wanted = [m for m in tier if 799 <= m.offset < 1601]
    assert again.messages == len(wanted)
    assert _parquet_rows(output) == [_row(m) for m in wanted]
    more = await asyncio.to_thread(backfill_to_parquet, spark, ranged, str(output), mode="append")
    assert more.messages == len(wanted)  # appended: each row of the range is there twice now
    assert _parquet_rows(output) == sorted(
        [_row(m) for m in wanted] * 2, key=lambda row: (row["partition"], row["offset"])
    )


def _entries(directory: Path) -> list[str]:
    return sorted(path.name for path in directory.iterdir())


async def test_a_failed_parquet_backfill_leaves_nothing_and_reruns_given_only_etcd(
    spark: SparkSession,
    store: MetaStore,
    cloud_config: CloudConfig,
    etcd_endpoint: str,
    meta_prefix: str,
    tmp_path: Path,
) -> None:
    objects = ObjectStore.from_config(cloud_config)
    tier = await write_tier(store, objects, SOURCE, [300, 200], per_object=100)
    await record_object_store(store, cloud_config, "uploader-t")  # as every uploader start
    # Only etcd: the object store is the one recorded there; credentials are the reader's.
    options = {"topic": str(SOURCE), "etcd_endpoint": etcd_endpoint, "prefix": meta_prefix}
    for name in ("access_key", "secret_key"):
        secret = getattr(cloud_config, name, None)
        if secret is not None:
            value = secret.get_secret_value() if isinstance(secret, SecretStr) else secret
            options[f"wal_cloud.cloud.{name}"] = value
    output = tmp_path / "out"
    # One object gone (say, a retention race): the job fails in a task, naming where it read.
    lost = object_key(ROOT_PREFIX, SOURCE.namespace, f"{SOURCE.topic}-part-0", 200, 299)
    body = await objects.read(lost)
    await objects.delete(lost)
    with pytest.raises(Exception, match=r"object_not_found|ObjectNotFoundError") as failed:
        await asyncio.to_thread(backfill_to_parquet, spark, options, str(output))
    assert f"{lost}' in {describe(cloud_config)} (recorded in etcd by uploader-t)" in str(
        failed.value
    )
    # Neither the output nor its aside copy (.out.danube-<id>.tmp) is left.
    assert _entries(tmp_path) == (["objects"] if isinstance(cloud_config, FsCloud) else [])
    await objects.write(lost, body)
    result = await asyncio.to_thread(backfill_to_parquet, spark, options, str(output))
    assert result.messages == len(tier)
    assert _parquet_rows(output) == [_row(m) for m in tier]
    assert _entries(tmp_path) == (
        ["objects", "out"] if isinstance(cloud_config, FsCloud) else ["out"]
    )


def _mesh_settings(nats_url: str, etcd: str, prefix: str, wal_dir: Path) -> DanubeSettings:
    return DanubeSettings(
        bus=BusConfig(servers=[nats_url]),
        wal_cloud=WalCloudConfig(
            wal=WalConfig(dir=wal_dir),
            metadata=MetadataConfig(etcd_endpoint=etcd, prefix=prefix),
        ),
        ingest=IngestConfig(lease_ttl_s=3, metrics_port=free_port()),
        discovery=DiscoveryConfig(
            port=free_port(), grpc_port=0, lease_ttl_s=3, topic_cache_ttl_s=0.0
        ),
    )


async def _target(bus: Bus) -> list[tuple[int, int, Any]]:
    """Every message stored in the target: (target partition, offset, record)."""
    client = IngestClient(bus)
    found = []
    for index, partition in enumerate(TARGET.partitions(TARGET_PARTITIONS)):
        offset = 0
        while True:
            reply = await client.fetch(partition, offset, max_count=5000)
            found += [(index, f.offset, decode_record(f.payload)) for f in reply.frames]
            if reply.next_offset == offset:
                break
            offset = reply.next_offset
    return found


def _origins(stored: list[tuple[int, int, Any]]) -> collections.Counter[tuple[str, int]]:
    return collections.Counter(
        (r.attributes[ORIGIN_SOURCE], int(r.attributes[ORIGIN_OFFSET])) for _, _, r in stored
    )


async def test_topic_backfill_sends_each_message_once_and_resumes_from_checkpoints(
    spark: SparkSession,
    bus: Bus,
    store: MetaStore,
    nats_url: str,
    etcd_endpoint: str,
    meta_prefix: str,
    cloud_config: CloudConfig,
    config_file: Path,
    tmp_path: Path,
) -> None:
    objects = ObjectStore.from_config(cloud_config)
    tier = await write_tier(store, objects, SOURCE, [1200, 900], per_object=500)
    await store.put_model(
        meta_keys.topic_key(TARGET), TopicConfig(partitions=TARGET_PARTITIONS, created_ms=1)
    )
    settings = _mesh_settings(nats_url, etcd_endpoint, meta_prefix, tmp_path / "wal")
    url = f"http://127.0.0.1:{settings.discovery.port}"
    source_options = {"topic": str(SOURCE), "config": str(config_file)}
    job = TopicBackfillJob(
        source_options=source_options, target=TARGET, url=url, name="replay", batch_messages=250
    )

    async def run(job: TopicBackfillJob = job) -> TopicBackfill:
        return await asyncio.to_thread(backfill_to_topic, spark, job)

    down = TopicBackfillJob(
        source_options=source_options,
        target=TARGET,
        url=f"http://127.0.0.1:{free_port()}",
        name="replay",
        send_timeout_s=1.0,
    )
    with pytest.raises(Exception, match="TransportError"):  # nothing listens there
        await run(down)
    prefix = f"{ROOT_PREFIX.strip('/')}/backfills/replay"
    assert await objects.list(prefix) == []  # nothing was sent, nothing recorded

    async with (
        run_in_process(ingest_app.serve, settings, "ingest-b"),
        run_in_process(discovery_app.serve, settings, "disc-b"),
    ):
        first = await run()
        assert (first.sent, first.skipped, first.partitions) == (2100, 0, 2)
        stored = await _target(bus)
        source = {(f"{SOURCE}-part-{m.partition}", m.offset): m for m in tier}
        assert _origins(stored) == dict.fromkeys(source, 1)
        last_seen: dict[tuple[int, str], int] = {}
        for target_partition, _, record in stored:
            origin = record.attributes[ORIGIN_SOURCE]
            m = source[(origin, int(record.attributes[ORIGIN_OFFSET]))]
            attributes = {
                k: v
                for k, v in record.attributes.items()
                if k not in (ORIGIN_SOURCE, ORIGIN_OFFSET)
            }
            assert (record.payload, record.key, attributes) == (m.payload, m.key, m.attributes)
            assert record.producer == "backfill"
            if m.key is not None:  # routed by key, as any producer's message with that key
                assert target_partition == partition_for_key(m.key, TARGET_PARTITIONS)
            # Per target partition, a source partition's messages keep their order.
            previous = last_seen.get((target_partition, origin), -1)
            assert m.offset > previous
            last_seen[(target_partition, origin)] = m.offset

        again = await run()
        assert (again.sent, again.skipped) == (0, 2100)
        assert len(await _target(bus)) == 2100

        # The task died after the server stored partition 0's last batch (offsets
        # 1000..1199) but before its checkpoint said so: the re-run sends that batch again.
        key = f"{prefix}/default/{SOURCE.topic}-part-0.json"
        checkpoint = Checkpoint.model_validate_json(await objects.read(key))
        assert (checkpoint.sent_through, checkpoint.sent) == (1199, 1200)
        rewound = checkpoint.model_copy(update={"sent_through": 999, "sent": 1000})
        await objects.write(key, rewound.model_dump_json().encode())
        resumed = await run()
        assert (resumed.sent, resumed.skipped) == (200, 1900)
        twice = {origin for origin, n in _origins(await _target(bus)).items() if n == 2}
        assert twice == {(f"{SOURCE}-part-0", offset) for offset in range(1000, 1200)}

        other = TopicBackfillJob(
            source_options={**source_options, "start_offset": "5"},
            target=TARGET,
            url=url,
            name="replay",
        )
        with pytest.raises(BackfillStateError, match="another name, or restart"):
            await run(other)
        restarted = await run(
            TopicBackfillJob(
                source_options=source_options,
                target=TARGET,
                url=url,
                name="replay",
                batch_messages=1000,
                restart=True,
            )
        )
        assert (restarted.sent, restarted.skipped) == (2100, 0)

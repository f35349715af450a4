"""A topic kept as an Iceberg table (Spark local[2] writes, pyiceberg commits to a sqlite SQL
catalog), read back with pyiceberg: the first run holds every uploaded message once with
typed columns; after a producer, the next run adds exactly the new offsets in one snapshot
whose properties say which; a run with nothing new commits nothing; a run that fails adds no
snapshot and leaves no files, and its re-run adds the range once; of two runs at once, the
one whose commit comes second fails and adds nothing; with decode=schema the
table has the registered schema's typed columns."""

from __future__ import annotations

import asyncio
import hashlib
import io
import json
from pathlib import Path
from typing import Any

import fastavro
import orjson
import pyarrow as pa
import pytest
from pyiceberg.exceptions import CommitFailedException
from pyiceberg.table import Table
from pyiceberg.types import StructType
from pyspark.sql import SparkSession

from danube.config import CloudConfig
from danube.config.wal_cloud import FsCloud
from danube.discovery.schemas.registry import SchemaRegistry
from danube.meta import MetaStore
from danube.names import TopicName
from danube.spark import iceberg as iceberg_job
from danube.spark.iceberg import (
    NEXT_OFFSETS,
    RANGES,
    IcebergSync,
    catalog,
    committed_offsets,
    sql_catalog_properties,
    sync_to_iceberg,
)
from danube.storage import ObjectStore, object_key

from tiers import FIRST_TIME_MS, ROOT_PREFIX, Message, append_tier, upload, write_tier

pytestmark = [pytest.mark.integration, pytest.mark.spark, pytest.mark.timeout(300)]

SOURCE = TopicName("default", "tabled")
TABLE = "danube.tabled"


@pytest.fixture
def cloud_config(tmp_path: Path) -> CloudConfig:
    """Files only: the object backends are the source's tests' business."""
    return FsCloud(backend="fs", root=str(tmp_path / "objects"))


def _rows(table: pa.Table) -> list[tuple[int, int, str | None, str]]:
    found = zip(
        table.column("partition").to_pylist(),
        table.column("offset").to_pylist(),
        table.column("key").to_pylist(),
        (hashlib.sha256(p).hexdigest() for p in table.column("payload").to_pylist()),
        strict=True,
    )
    return sorted(found)


def _expected(messages: list[Message]) -> list[tuple[int, int, str | None, str]]:
    return sorted(m.row() for m in messages)


def _staged_dirs(warehouse: Path) -> list[str]:
    """Every directory a run wrote its files to."""
    return sorted(p.name for p in warehouse.rglob("danube-*") if p.is_dir())


def _data_dirs(table: Table) -> list[str]:
    """The directories of the files the table holds."""
    paths = table.inspect.files().column("file_path").to_pylist()
    return sorted({Path(path.removeprefix("file:")).parent.name for path in paths})


async def test_a_topic_kept_as_an_iceberg_table_adds_each_offset_once(
    spark: SparkSession,
    store: MetaStore,
    cloud_config: CloudConfig,
    config_file: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    objects = ObjectStore.from_config(cloud_config)
    tier = await write_tier(store, objects, SOURCE, [300, 200], per_object=100)
    warehouse = tmp_path / "warehouse"
    warehouse.mkdir()
    iceberg = catalog("t", sql_catalog_properties(str(warehouse)))
    options = {"topic": str(SOURCE), "config": str(config_file)}

    async def sync() -> IcebergSync:
        return await asyncio.to_thread(sync_to_iceberg, spark, options, TABLE, iceberg)

    first = await sync()
    assert (first.rows, first.ranges) == (500, {0: (0, 300), 1: (0, 200)})
    table = iceberg.load_table(TABLE)
    read = table.scan().to_arrow()
    assert _rows(read) == _expected(tier)
    # Typed columns, as the source gives them.
    assert read.schema.field("offset").type == pa.int64()
    assert read.schema.field("partition").type == pa.int32()
    assert read.schema.field("publish_time").type == pa.timestamp("us", tz="UTC")
    attributes = read.schema.field("attributes").type
    assert isinstance(attributes, pa.MapType)
    assert (attributes.key_type, attributes.item_type) == (pa.string(), pa.string())
    assert read.schema.field("payload").type == pa.binary()
    by_offset = {(r["partition"], r["offset"]): r for r in read.to_pylist()}
    m = tier[5]
    assert by_offset[(0, 5)]["publish_time"].timestamp() * 1000 == m.publish_time_ms
    assert dict(by_offset[(0, 5)]["attributes"]) == m.attributes
    assert committed_offsets(table) == {0: 300, 1: 200}

    # A producer between the runs: 150 more in partition 0, none in partition 1.
    partition_0 = SOURCE.partitions(2)[0]
    more = await append_tier(store, objects, partition_0, 0, range(300, 450), per_object=100)
    second = await sync()
    assert (second.rows, second.ranges) == (150, {0: (300, 450)})
    table.refresh()
    assert _rows(table.scan().to_arrow()) == _expected(tier + more)
    snapshots = table.snapshots()
    assert len(snapshots) == 2
    assert snapshots[-1].summary is not None
    properties = snapshots[-1].summary.additional_properties
    assert json.loads(properties[NEXT_OFFSETS]) == {"0": 450, "1": 200}
    assert json.loads(properties[RANGES]) == {"0": [300, 450]}

    # Nothing new: nothing committed.
    third = await sync()
    assert third.rows == 0
    table.refresh()
    assert len(table.snapshots()) == 2

    # A run that fails (an object gone from under it) commits nothing and leaves no files;
    # once the object is back, its re-run adds the range once.
    even_more = await append_tier(store, objects, partition_0, 0, range(450, 600), per_object=100)
    lost = object_key(ROOT_PREFIX, SOURCE.namespace, partition_0.topic, 550, 599)
    body = await objects.read(lost)
    await objects.delete(lost)
    with pytest.raises(Exception, match=r"ObjectNotFoundError|object_not_found"):
        await sync()
    table.refresh()
    assert len(table.snapshots()) == 2
    assert _staged_dirs(warehouse) == _data_dirs(table)  # the failed run's files are gone
    await objects.write(lost, body)
    fourth = await sync()
    assert fourth.ranges == {0: (450, 600)}
    table.refresh()
    assert _rows(table.scan().to_arrow()) == _expected(tier + more + even_more)

    # Two runs at once: the other one commits while this one writes; this one's commit is
    # refused (the table's head moved) and its files go: the new range is in the table once.
    last = await append_tier(store, objects, partition_0, 0, range(600, 650), per_object=100)
    racing: list[IcebergSync] = []

    def write_while_another_run_commits(*args: Any) -> tuple[int, list[str]]:
        written = real_write(*args)
        if not racing:
            racing.append(IcebergSync(TABLE, -1))  # the other run must not race in turn
            racing.append(sync_to_iceberg(spark, options, TABLE, iceberg))
        return written

    real_write = iceberg_job._write
    monkeypatch.setattr(iceberg_job, "_write", write_while_another_run_commits)
    with pytest.raises(CommitFailedException):
        await sync()
    assert racing[-1].ranges == {0: (600, 650)}
    table.refresh()
    assert len(table.snapshots()) == 4
    assert _rows(table.scan().to_arrow()) == _expected(tier + more + even_more + last)
    assert _staged_dirs(warehouse) == _data_dirs(table)


ORDER = {
    "type": "record",
    "name": "Order",
    "fields": [
        {"name": "id", "type": "long"},
        {"name": "item", "type": "string"},
        {"name": "note", "type": ["null", "string"], "default": None},
    ],
}


async def test_with_decode_the_table_has_the_registered_schemas_typed_columns(
    spark: SparkSession,
    store: MetaStore,
    cloud_config: CloudConfig,
    config_file: Path,
    tmp_path: Path,
) -> None:
    registry = SchemaRegistry(store)
    registered = await registry.register("typed-value", "avro", orjson.dumps(ORDER))
    typed = TopicName("default", "typed")
    await registry.bind_topic(
        typed, "typed-value", validation_policy="none", payload_validation=False
    )
    data = [{"id": n, "item": f"i{n}", "note": None if n % 2 else f"n{n}"} for n in range(5)]
    parsed = fastavro.parse_schema(ORDER)
    messages = []
    for offset, datum in enumerate(data):
        out = io.BytesIO()
        fastavro.schemaless_writer(out, parsed, datum)
        messages.append(
            Message(
                0, offset, FIRST_TIME_MS, "t", None, {}, out.getvalue(), registered.schema_id, 1
            )
        )
    await upload(store, ObjectStore.from_config(cloud_config), typed, messages)
    iceberg = catalog("t", sql_catalog_properties(str(tmp_path / "warehouse")))
    options = {"topic": str(typed), "config": str(config_file), "decode": "schema"}
    done = await asyncio.to_thread(sync_to_iceberg, spark, options, "danube.typed", iceberg)
    assert done.rows == 5
    table = iceberg.load_table("danube.typed")
    value = table.schema().find_field("value").field_type
    assert isinstance(value, StructType)
    assert [(f.name, str(f.field_type)) for f in value.fields] == [
        ("id", "long"),
        ("item", "string"),
        ("note", "string"),
    ]
    read = sorted(table.scan().to_arrow().to_pylist(), key=lambda row: row["offset"])
    assert [row["value"] for row in read] == data
    assert [row["decode_error"] for row in read] == [None] * 5

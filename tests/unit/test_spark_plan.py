"""The Spark source without Spark: option parsing (ranges, times, settings overrides, typos
refused), planning (one task per object, sub-ranges at index entries, offset and time
pruning, one task per partition), overlapping descriptors refused, the Arrow schema
PySpark expects for the source's Spark schema, and the one line the CLI makes of an error."""

from __future__ import annotations

from pathlib import Path

import pytest
from pyspark.sql.pandas.types import to_arrow_schema

from danube.frame import Record, decode_frames, encode_frame, encode_record
from danube.names import TopicName
from danube.spark import SCHEMA, InvalidOptionError, parse_options
from danube.spark.arrow import ARROW_SCHEMA, BatchBuilder
from danube.spark.errors import InconsistentTierError
from danube.spark.options import load_source_settings, parse_time_ms
from danube.spark.plan import PartitionObjects, plan_tasks, split_object
from danube.storage import CorruptObjectError, ObjectDescriptor, SparseIndexBuilder, object_key

pytestmark = pytest.mark.unit

TOPIC = TopicName("ns", "t")


def _descriptor(
    name: TopicName, first: int, last: int, *, frame_bytes: int = 100, created_ms: int = 1000
) -> ObjectDescriptor:
    builder = SparseIndexBuilder(1000)
    for i, offset in enumerate(range(first, last + 1)):
        builder.add(offset, i * frame_bytes, frame_bytes)
    key = object_key("root", name.namespace, name.topic, first, last)
    return ObjectDescriptor.from_builder(key, builder, created_ms=created_ms)


def _partition(index: int, ranges: list[tuple[int, int]], **kw: int) -> PartitionObjects:
    name = TOPIC.partition_name(index)
    return PartitionObjects(name, index, tuple(_descriptor(name, a, b, **kw) for a, b in ranges))


def test_options_parse_ranges_times_and_settings_overrides() -> None:
    options = parse_options(
        {
            "TOPIC": "/ns/t",
            "start_offset": "10",
            "end_offset": "20",
            "start_time": "2024-05-01T00:00:00Z",
            "end_time": "1714608000000",
            "etcd_endpoint": "etcd:2379",
            "prefix": "/east",
            "wal_cloud.cloud.root": "/data",
            "config": "/etc/danube.yml",
        }
    )
    assert (options.topic, options.start_offset, options.end_offset) == (TOPIC, 10, 20)
    assert (options.start_time_ms, options.end_time_ms) == (1714521600000, 1714608000000)
    assert options.config_path == "/etc/danube.yml"
    assert options.overrides == {
        "DANUBE_WAL_CLOUD__METADATA__ETCD_ENDPOINT": "etcd:2379",
        "DANUBE_WAL_CLOUD__METADATA__PREFIX": "/east",
        "DANUBE_WAL_CLOUD__CLOUD__ROOT": "/data",
    }
    assert options.wants(10)
    assert options.wants(19)
    assert not options.wants(9)
    assert not options.wants(20)


def test_settings_are_the_file_then_the_environment_then_the_options(tmp_path: Path) -> None:
    config = tmp_path / "danube.yml"
    config.write_text(
        "wal_cloud:\n  metadata: {etcd_endpoint: 'file:1', prefix: /file}\n"
        "  cloud: {backend: fs, root: /objects}\n"
    )
    options = parse_options({"topic": "/ns/t", "config": str(config), "prefix": "/option"})
    settings = load_source_settings(
        options, environ={"DANUBE_WAL_CLOUD__METADATA__ETCD_ENDPOINT": "env:2"}
    )
    assert settings.wal_cloud.metadata.etcd_endpoint == "env:2"
    assert settings.wal_cloud.metadata.prefix == "/option"
    assert settings.wal_cloud.cloud.root == "/objects"


@pytest.mark.parametrize(
    ("options", "bad"),
    [
        ({}, "topic"),
        ({"topic": "orders"}, "topic"),
        ({"topic": "/ns/t", "start_ofset": "1"}, "start_ofset"),
        ({"topic": "/ns/t", "start_offset": "-1"}, "start_offset"),
        ({"topic": "/ns/t", "start_offset": "x"}, "start_offset"),
        ({"topic": "/ns/t", "start_offset": "5", "end_offset": "4"}, "end_offset"),
        ({"topic": "/ns/t", "start_time": "yesterday"}, "start_time"),
        ({"topic": "/ns/t", "split": "rows"}, "split"),
        ({"topic": "/ns/t", "wal_cloud.cloud.bad key": "1"}, "wal_cloud.cloud.bad key"),
        ({"topic": "/ns/t", "path": "/somewhere"}, "path"),
    ],
)
def test_bad_options_are_refused_by_name(options: dict[str, str], bad: str) -> None:
    with pytest.raises(InvalidOptionError) as refused:
        parse_options(options)
    assert refused.value.option == bad


def test_times_are_milliseconds_or_iso_8601_in_utc_by_default() -> None:
    assert parse_time_ms("1700000000000") == 1_700_000_000_000
    assert parse_time_ms("1970-01-01T00:00:01") == 1000
    assert parse_time_ms("1970-01-01T01:00:00+01:00") == 0


def test_one_task_per_object_in_partition_then_offset_order() -> None:
    parts = [_partition(0, [(0, 9), (10, 19)]), _partition(1, [(0, 4)])]
    tasks = plan_tasks(parts, parse_options({"topic": "/ns/t", "split": "object"}))
    assert [(s.partition, s.from_offset, s.to_offset) for (s,) in tasks] == [
        (0, 0, 9),
        (0, 10, 19),
        (1, 0, 4),
    ]
    assert {s.topic for (s,) in tasks} == {"/ns/t"}


def test_an_offset_range_keeps_only_the_objects_it_touches_cut_at_its_ends() -> None:
    parts = [_partition(0, [(0, 9), (10, 19), (20, 29)])]
    by_object = {"topic": "/ns/t", "split": "object"}
    tasks = plan_tasks(
        parts, parse_options({**by_object, "start_offset": "12", "end_offset": "21"})
    )
    assert [(s.from_offset, s.to_offset) for (s,) in tasks] == [(12, 19), (20, 20)]
    edge = plan_tasks(parts, parse_options({**by_object, "start_offset": "10", "end_offset": "20"}))
    assert [(s.from_offset, s.to_offset) for (s,) in edge] == [(10, 19)]
    assert plan_tasks(parts, parse_options({"topic": "/ns/t", "start_offset": "30"})) == []


def test_a_large_object_is_cut_at_index_entries() -> None:
    # 1000 frames of 100 bytes, an index entry every 10 frames (1000 bytes).
    descriptor = _descriptor(TOPIC, 0, 999)
    ranges = split_object(descriptor, 0, 999, 25_000)
    assert ranges == [(0, 249), (250, 499), (500, 749), (750, 999)]
    index_offsets = {entry.offset for entry in descriptor.index}
    assert all(start in index_offsets for start, _ in ranges)
    assert split_object(descriptor, 5, 33, 1000) == [(5, 9), (10, 19), (20, 29), (30, 33)]
    assert split_object(descriptor, 5, 33, 10**9) == [(5, 33)]


def test_small_objects_are_packed_per_partition_up_to_the_target_size() -> None:
    # Objects of 300 frames of 100 bytes (30 000 bytes): two fit 64 KiB, three do not.
    parts = [
        _partition(0, [(i * 300, i * 300 + 299) for i in range(5)]),
        _partition(1, [(0, 299)]),
    ]
    options = parse_options({"topic": "/ns/t", "max_partition_bytes": str(64 * 1024)})
    tasks = plan_tasks(parts, options)
    assert [[(s.partition, s.from_offset) for s in task] for task in tasks] == [
        [(0, 0), (0, 300)],
        [(0, 600), (0, 900)],
        [(0, 1200)],
        [(1, 0)],
    ]
    # A range cuts the first and last objects; the cut ones count only what they read.
    ranged = plan_tasks(parts, parse_options({"topic": "/ns/t", "start_offset": "250"}))
    assert [[(s.from_offset, s.to_offset) for s in task] for task in ranged] == [
        [(250, 299), (300, 599), (600, 899), (900, 1199), (1200, 1499)],
        [(250, 299)],
    ]
    assert ranged[0][0].size_bytes == 5000


def test_min_partitions_makes_more_smaller_tasks_but_not_below_4_mib() -> None:
    # Two objects of 100 000 frames of 100 bytes: 10 MB each, 20 MB in all.
    parts = [_partition(0, [(0, 99_999)]), _partition(1, [(0, 99_999)])]
    four = plan_tasks(parts, parse_options({"topic": "/ns/t", "min_partitions": "4"}))
    assert [(s.partition, s.from_offset, s.to_offset) for (s,) in four] == [
        (0, 0, 49_999),
        (0, 50_000, 99_999),
        (1, 0, 49_999),
        (1, 50_000, 99_999),
    ]
    many = plan_tasks(parts, parse_options({"topic": "/ns/t", "min_partitions": "100"}))
    assert len(many) == 6  # 4 MiB each at least: 10 MB is three tasks
    assert len(plan_tasks(parts, parse_options({"topic": "/ns/t"}))) == 2


def test_split_by_partition_makes_one_task_of_each_partitions_slices() -> None:
    parts = [_partition(0, [(0, 9), (10, 19)]), _partition(1, []), _partition(2, [(0, 4)])]
    tasks = plan_tasks(parts, parse_options({"topic": "/ns/t", "split": "partition"}))
    assert [[(s.partition, s.from_offset) for s in task] for task in tasks] == [
        [(0, 0), (0, 10)],
        [(2, 0)],
    ]


def test_a_time_range_skips_objects_uploaded_before_it_less_the_clock_skew() -> None:
    name = TOPIC.partition_name(0)
    old = _descriptor(name, 0, 9, created_ms=10_000)
    new = _descriptor(name, 10, 19, created_ms=100_000)
    parts = [PartitionObjects(name, 0, (old, new))]
    options = {
        "topic": "/ns/t",
        "split": "object",
        "start_time": "70001",
        "clock_skew_ms": "60000",
    }
    assert [s.from_offset for (s,) in plan_tasks(parts, parse_options(options))] == [10]
    options["start_time"] = "70000"
    assert [s.from_offset for (s,) in plan_tasks(parts, parse_options(options))] == [0, 10]


def test_overlapping_objects_are_refused() -> None:
    with pytest.raises(InconsistentTierError, match="overlap"):
        _partition(0, [(0, 9), (9, 19)])


def test_the_arrow_schema_is_the_one_pyspark_expects() -> None:
    assert ARROW_SCHEMA.equals(to_arrow_schema(SCHEMA, timezone="UTC"))


def _frame(offset: int, record: Record) -> bytes:
    return encode_frame(offset, encode_record(record))


def test_batches_hold_every_field_and_filter_on_publish_time() -> None:

    records = [
        Record(payload=b"a", publish_time_ms=1000, producer="p", key=None),
        Record(payload=b"", publish_time_ms=2000, producer="q", key="", attributes={"x": "1"}),
        Record(
            payload=b"\x00\xff",
            publish_time_ms=3000,
            producer="r",
            key="k",
            schema_id=2**32 - 1,
            schema_version=3,
        ),
    ]
    frames, _ = decode_frames(b"".join(_frame(5 + i, r) for i, r in enumerate(records)))
    builder = BatchBuilder("/ns/t", 2, "key", start_time_ms=2000, end_time_ms=3001)
    for frame in frames:
        builder.add(frame)
    batch = builder.take()
    assert batch.schema.equals(ARROW_SCHEMA)
    assert batch.to_pylist() == [
        {
            "topic": "/ns/t",
            "partition": 2,
            "offset": offset,
            "publish_time": batch.column("publish_time")[i].as_py(),
            "producer": producer,
            "key": key,
            "attributes": attributes,
            "payload": payload,
            "schema_id": schema_id,
            "schema_version": version,
        }
        for i, (offset, producer, key, attributes, payload, schema_id, version) in enumerate(
            [
                (6, "q", "", [("x", "1")], b"", None, None),
                (7, "r", "k", [], b"\x00\xff", 2**32 - 1, 3),
            ]
        )
    ]
    times = [t.timestamp() for t in batch.column("publish_time").to_pylist()]
    assert times == [2.0, 3.0]
    assert len(builder) == 0
    assert builder.take().num_rows == 0


def test_a_bad_record_names_the_object_and_offset() -> None:

    frames, _ = decode_frames(encode_frame(42, b"\x01garbage"))
    with pytest.raises(CorruptObjectError) as failed:
        BatchBuilder("/ns/t", 0, "the/object.dnb").add(frames[0])
    assert (failed.value.key, failed.value.offset) == ("the/object.dnb", 42)
    assert "bad record" in failed.value.reason


def test_the_cli_turns_a_spark_error_into_the_code_and_message_of_ours() -> None:
    from danube.cli.backfill import explain

    wrapped = Exception(
        "[PYTHON_DATA_SOURCE_ERROR] Failed: Traceback (most recent call last):\n"
        '  File "x.py", line 1, in partitions\n'
        "danube.spark.errors.TopicNotReadableError: topic /a/b: no such topic\n SQLSTATE: 38000"
    )
    assert explain(wrapped) == "topic_not_readable: topic /a/b: no such topic"
    corrupt = Exception("danube.storage.errors.CorruptObjectError: object k: bad frame: crc")
    assert explain(corrupt) == "object_corrupt: object k: bad frame: crc"
    assert explain(RuntimeError("Spark said no\nmore")) == "RuntimeError: Spark said no"

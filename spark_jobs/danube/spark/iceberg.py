"""A topic kept as an Apache Iceberg table: each run adds the offsets uploaded since the last.

Spark writes the Parquet files (the ``danube`` source's columns, every one typed: with
``decode=schema`` the ``value`` struct of the topic's registered schema too); ``pyiceberg``
commits them to the table (:func:`catalog`: a SQL catalog in a sqlite file by default, any
catalog ``pyiceberg`` loads by setting, e.g. a REST one). Exactly once per offset:

- every snapshot this job commits records, in its summary, the next offset of every topic
  partition (``danube.next_offsets``, JSON ``{"<partition>": <offset>}``: everything below it
  is in the table) and the ranges it added (``danube.ranges``, ``{"<partition>":
  [from, to]}``, ``to`` exclusive);
- a run reads each partition from its next offset to the end of what is uploaded (the
  descriptors in etcd at the run's start), writes the files beside the table's data, and
  commits them with the new next offsets in **one** snapshot, on the condition that the
  table's head is still the snapshot it read them from (pyiceberg asserts the ref; its own
  retry, which would re-append the files onto the new head, is off for the table): a run
  that fails before its commit added nothing (its files are deleted, or unreferenced if the
  driver died), one that lost a race to another commit fails and adds nothing, and the next
  run starts where the last commit ended. A run with nothing new commits nothing.

Reading the table in Spark itself needs Iceberg's Spark runtime jar (docs/spark.md); this job
does not: Spark only writes Parquet.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import reduce
from typing import Any

from pyiceberg.catalog import Catalog, load_catalog
from pyiceberg.exceptions import NamespaceAlreadyExistsError, NoSuchTableError
from pyiceberg.table import Table, TableProperties
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.pandas.types import to_arrow_schema

from danube.spark.catalog import read_partitions, source_settings
from danube.spark.errors import InvalidOptionError, TopicNotReadableError
from danube.spark.options import parse_options
from danube.spark.outputs import Output
from danube.spark.plan import PartitionObjects
from danube.spark.source import FORMAT

log = logging.getLogger(__name__)

NEXT_OFFSETS = "danube.next_offsets"  # snapshot summary: {"<partition>": next offset}
RANGES = "danube.ranges"  # snapshot summary: {"<partition>": [from, to)} this commit added
SOURCE_TOPIC = "danube.topic"  # snapshot summary and table property: the topic it follows
DEFAULT_CATALOG = "danube"
# pyiceberg retries a commit that lost a race by appending the same files onto the new head:
# here that would add a range the other run added too. Never: the run fails, the next starts
# from the new head.
_NO_RETRY = {TableProperties.COMMIT_NUM_RETRIES: "0"}
# Spark writes TIMESTAMP as INT96 by default, which Iceberg does not read: micros, UTC.
_TIMESTAMP_CONF = "spark.sql.parquet.outputTimestampType"


@dataclass(frozen=True, slots=True)
class IcebergSync:
    """What one run committed: rows and ranges added (none: no snapshot), the snapshot."""

    table: str
    rows: int
    ranges: dict[int, tuple[int, int]] = field(default_factory=dict)
    snapshot_id: int | None = None
    seconds: float = 0.0


def catalog(name: str = DEFAULT_CATALOG, properties: Mapping[str, str] | None = None) -> Catalog:
    """The catalog named ``name`` with ``properties`` (pyiceberg's: ``type``, ``uri``,
    ``warehouse``...; with none given, pyiceberg's own configuration, ``~/.pyiceberg.yaml``
    or ``PYICEBERG_CATALOG__<NAME>__*`` variables). :func:`sql_catalog_properties` makes
    the default one, a SQL catalog in a sqlite file."""
    return load_catalog(name, **dict(properties or {}))


def sql_catalog_properties(warehouse: str) -> dict[str, str]:
    """A SQL catalog whose database is ``<warehouse>/catalog.db`` (sqlite) and whose
    tables live under ``warehouse`` (a local directory, made if missing)."""
    root = os.path.abspath(warehouse.removeprefix("file://"))
    os.makedirs(root, exist_ok=True)
    return {"type": "sql", "uri": f"sqlite:///{root}/catalog.db", "warehouse": f"file://{root}"}


def sync_to_iceberg(
    spark: SparkSession,
    source_options: Mapping[str, str],
    table_name: str,
    iceberg: Catalog,
) -> IcebergSync:
    """Add to ``table_name`` (``<namespace>.<table>``, created on the first run) the offsets
    of the topic of ``source_options`` uploaded since the table's last commit by this job."""
    options = parse_options(source_options)
    if options.start_offset or options.end_offset is not None or options.start_time_ms:
        raise InvalidOptionError("start_offset", "an Iceberg table follows the whole topic")
    if options.end_time_ms is not None:
        raise InvalidOptionError("end_time", "an Iceberg table follows the whole topic")
    topic = str(options.topic)
    settings = source_settings(options).settings
    found = asyncio.run(read_partitions(settings.wal_cloud.metadata, options.topic))
    names = {p.index: str(p.name) for p in found}
    table = _table(iceberg, table_name, topic, _empty(spark, source_options))
    next_offsets = _next_offsets(_summary(table), topic)
    ranges = _ranges_to_add(found, next_offsets, table_name)
    if not ranges:
        log.info("%s: nothing new for %s", topic, table_name)
        return IcebergSync(table_name, 0)
    started = time.perf_counter()
    reads = [
        spark.read.format(FORMAT)
        .options(**{**source_options, "topic": names[index]})
        .option("start_offset", str(start))
        .option("end_offset", str(end))
        .load()
        for index, (start, end) in ranges.items()
    ]
    rows = reduce(DataFrame.unionByName, reads)
    # Beside the table's own data: the files stay where they are written once committed.
    staging = Output(spark, f"{table.location().rstrip('/')}/data/danube-{uuid.uuid4().hex}")
    try:
        written, files = _write(spark, rows, staging.path)
        expected = sum(end - start for start, end in ranges.values())
        if written != expected:  # a gap in the tier, or a read gone wrong: not committed
            raise InvalidOptionError(
                "topic", f"{topic}: {written} rows read for {expected} offsets {ranges}"
            )
        after = {**next_offsets, **{index: end for index, (_, end) in ranges.items()}}
        properties = {
            NEXT_OFFSETS: json.dumps({str(i): o for i, o in sorted(after.items())}),
            RANGES: json.dumps({str(i): list(r) for i, r in ranges.items()}),
            SOURCE_TOPIC: topic,
        }
        # One snapshot, committed only if the head is still the one the offsets came from.
        table.add_files(files, snapshot_properties=properties)
    except BaseException:
        staging.remove()  # nothing of this run is in the table: its files go too
        raise
    seconds = time.perf_counter() - started
    snapshot = table.current_snapshot()
    log.info("%s: %d rows committed to %s %s", topic, written, table_name, ranges)
    return IcebergSync(
        table_name, written, ranges, None if snapshot is None else snapshot.snapshot_id, seconds
    )


def _ranges_to_add(
    found: list[PartitionObjects], next_offsets: Mapping[int, int], table_name: str
) -> dict[int, tuple[int, int]]:
    """The offsets ``[start, end)`` of each partition that the table lacks and object storage
    holds (a partition with nothing new: none)."""
    ranges = {}
    for partition in found:
        if not partition.descriptors:
            continue
        first = partition.descriptors[0].first_offset
        end = partition.descriptors[-1].last_offset + 1
        # A partition new to the table starts at its oldest object (retention may have
        # expired the ones before); one the table has must go on where it ends.
        start = next_offsets.get(partition.index, first)
        if start < first:
            raise TopicNotReadableError(
                str(partition.name),
                f"offsets {start}..{first - 1} left object storage before {table_name} got them",
            )
        if end > start:
            ranges[partition.index] = (start, end)
    return ranges


def _write(spark: SparkSession, rows: DataFrame, path: str) -> tuple[int, list[str]]:
    """Write ``rows`` as Parquet to ``path``; the rows written and the files."""
    previous = spark.conf.get(_TIMESTAMP_CONF, None)
    spark.conf.set(_TIMESTAMP_CONF, "TIMESTAMP_MICROS")
    try:
        rows.write.mode("errorifexists").parquet(path)
    finally:
        if previous is None:
            spark.conf.unset(_TIMESTAMP_CONF)
        else:
            spark.conf.set(_TIMESTAMP_CONF, previous)
    staged = spark.read.parquet(path)
    return staged.count(), sorted(staged.inputFiles())


def committed_offsets(table: Table) -> dict[int, int]:
    """The next offset of each partition the table holds everything below (no commit yet:
    none)."""
    return _next_offsets(_summary(table), table.properties.get(SOURCE_TOPIC, ""))


def _summary(table: Table) -> Mapping[str, str]:
    """The properties of the table's head snapshot (none yet: empty)."""
    head = table.current_snapshot()
    if head is None or head.summary is None:
        return {}
    return head.summary.additional_properties


def _next_offsets(summary: Mapping[str, Any], topic: str) -> dict[int, int]:
    text = summary.get(NEXT_OFFSETS)
    if text is None:
        return {}
    if summary.get(SOURCE_TOPIC, topic) != topic:
        raise InvalidOptionError("table", f"follows {summary.get(SOURCE_TOPIC)}, not {topic}")
    return {int(index): int(offset) for index, offset in json.loads(text).items()}


def _empty(spark: SparkSession, source_options: Mapping[str, str]) -> Any:
    """The Arrow schema of the source's rows (no data read): the table's columns."""
    schema = spark.read.format(FORMAT).options(**source_options).load().schema
    return to_arrow_schema(schema, timezone="UTC")


def _table(iceberg: Catalog, name: str, topic: str, schema: Any) -> Table:
    try:
        table = iceberg.load_table(name)
    except NoSuchTableError:
        namespace = name.rsplit(".", 1)[0] if "." in name else ""
        if not namespace:
            raise InvalidOptionError("table", f"{name!r}: <namespace>.<table>") from None
        with contextlib.suppress(NamespaceAlreadyExistsError):
            iceberg.create_namespace(namespace)
        return iceberg.create_table(
            name, schema=schema, properties={SOURCE_TOPIC: topic, **_NO_RETRY}
        )
    if table.properties.get(SOURCE_TOPIC) != topic:
        raise InvalidOptionError(
            "table", f"{name} follows {table.properties.get(SOURCE_TOPIC)}, not {topic}"
        )
    if any(table.properties.get(key) != value for key, value in _NO_RETRY.items()):
        with table.transaction() as change:
            change.set_properties(_NO_RETRY)
    return table

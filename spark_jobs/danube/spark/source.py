"""``spark.read.format("danube")``: a PySpark Python Data Source (Spark 4 API) over the
objects of a topic's cloud tier.

Where each step runs:

- ``DanubeDataSource.reader`` and ``DanubeReader.partitions`` run once per query on the
  driver's machine (in a Python worker Spark starts there): the options are checked, the
  settings loaded (with the object store recorded in etcd when the config names none), etcd
  read once (:mod:`danube.spark.catalog`) and the read planned (:mod:`danube.spark.plan`);
- ``DanubeReader.read`` runs in the executors, once per input partition, with the
  descriptors of its objects and the ``wal_cloud.cloud`` section pickled into it: it reads
  object storage only (:mod:`danube.spark.read`).

With ``decode=schema`` the schema depends on the topic's registered schema: ``schema()``
looks it up in etcd (:func:`danube.spark.catalog.read_topic_schema`) and keeps it on the
data source, which Spark pickles after ``schema()`` and before ``reader()``; the reader
ships it to the executors (:mod:`danube.spark.decode`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator, Sequence

import pyarrow as pa
from pyspark.sql import SparkSession
from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition
from pyspark.sql.pandas.types import from_arrow_type
from pyspark.sql.types import (
    BinaryType,
    IntegerType,
    LongType,
    MapType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from danube.config import CloudConfig, MetadataConfig
from danube.spark.catalog import read_partitions, read_topic_schema, source_settings
from danube.spark.decode import TopicSchema
from danube.spark.errors import InvalidOptionError
from danube.spark.options import ReadOptions, load_source_settings, parse_options
from danube.spark.plan import Task, plan_tasks
from danube.spark.read import read_task

log = logging.getLogger(__name__)

FORMAT = "danube"

SCHEMA = StructType(
    [
        StructField("topic", StringType(), nullable=False),
        StructField("partition", IntegerType(), nullable=False),
        StructField("offset", LongType(), nullable=False),
        StructField("publish_time", TimestampType(), nullable=False),
        StructField("producer", StringType(), nullable=False),
        StructField("key", StringType(), nullable=True),
        StructField(
            "attributes", MapType(StringType(), StringType(), valueContainsNull=False), False
        ),
        StructField("payload", BinaryType(), nullable=False),
        StructField("schema_id", LongType(), nullable=True),
        StructField("schema_version", IntegerType(), nullable=True),
    ]
)


def spark_schema(value_type: pa.DataType | None = None) -> StructType:
    """:data:`SCHEMA`, and with ``decode=schema`` the ``value`` column (of the Spark type
    of ``value_type``, see :mod:`danube.spark.schema_types`) and ``decode_error``."""
    if value_type is None:
        return SCHEMA
    value = from_arrow_type(value_type, prefer_timestamp_ntz=True)
    return StructType(
        [
            *SCHEMA.fields,
            StructField("value", value, nullable=True),
            StructField("decode_error", StringType(), nullable=True),
        ]
    )


class ReadTask(InputPartition):
    """One Spark input partition: object slices read in order (picklable)."""

    def __init__(self, slices: Task) -> None:
        super().__init__(slices)
        self.slices = slices

    def __repr__(self) -> str:
        if not self.slices:
            return "ReadTask()"
        first, last = self.slices[0], self.slices[-1]
        return (
            f"ReadTask({first.topic} partition {first.partition}, offsets "
            f"{first.from_offset}..{last.to_offset}, {len(self.slices)} slices)"
        )


class DanubeDataSource(DataSource):
    """The ``danube`` format; the options are in docs/spark.md."""

    @classmethod
    def name(cls) -> str:
        """The format name: ``spark.read.format("danube")``."""
        return FORMAT

    def schema(self) -> StructType:
        """The columns (see :mod:`danube.spark.arrow`); with ``decode=schema``, those of the
        topic's registered schema too (etcd is read here, once)."""
        given = {name.lower(): str(value) for name, value in dict(self.options).items()}
        if given.get("decode", "none").strip().lower() in ("", "none"):
            return SCHEMA  # the options are checked by reader(), as before decode existed
        options = parse_options(given)
        return spark_schema(self._topic_schema(options, None).value_type())

    def _topic_schema(self, options: ReadOptions, metadata: MetadataConfig | None) -> TopicSchema:
        found: TopicSchema | None = getattr(self, "_decoding", None)
        if found is None:
            if metadata is None:
                metadata = load_source_settings(options).wal_cloud.metadata
            found = asyncio.run(read_topic_schema(metadata, options.topic))
            self._decoding = found  # pickled with the data source, for reader()
        return found

    def reader(self, schema: StructType) -> DanubeReader:
        """Check the options and load the settings; nothing is read yet."""
        options = parse_options(dict(self.options))
        found = source_settings(options)
        settings = found.settings
        decoding = None
        if options.decode == "schema":
            decoding = self._topic_schema(options, settings.wal_cloud.metadata)
        if schema != spark_schema(None if decoding is None else decoding.value_type()):
            raise InvalidOptionError("schema", "the danube format has the schema it gives")
        return DanubeReader(
            options, settings.wal_cloud.metadata, settings.wal_cloud.cloud, decoding, found.location
        )


class DanubeReader(DataSourceReader):
    """Plans from etcd on the driver; reads objects in the executors."""

    def __init__(
        self,
        options: ReadOptions,
        metadata: MetadataConfig,
        cloud: CloudConfig,
        decoding: TopicSchema | None = None,
        location: str | None = None,
    ):
        self.options = options
        self.metadata = metadata
        self.cloud = cloud
        self.decoding = decoding  # the registered schema, with decode=schema
        self.location = location  # where the objects are, and why there: named by errors

    def partitions(self) -> Sequence[InputPartition]:
        """The input partitions :func:`danube.spark.plan.plan_tasks` makes (see ``split``)."""
        found = asyncio.run(read_partitions(self.metadata, self.options.topic))
        tasks = plan_tasks(found, self.options)
        log.info("%s: %d input partitions", self.options.topic, len(tasks))
        # Spark turns an empty list into one InputPartition(None); say "nothing" ourselves.
        return [ReadTask(task) for task in tasks] or [ReadTask(())]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        """The rows of one input partition, as Arrow record batches."""
        if not isinstance(partition, ReadTask):
            raise TypeError(f"not a danube input partition: {partition!r}")
        return read_task(
            self.cloud, partition.slices, self.options, self.decoding, location=self.location
        )


def register(spark: SparkSession) -> None:
    """Make ``spark.read.format("danube")`` available in this session."""
    spark.dataSource.register(DanubeDataSource)

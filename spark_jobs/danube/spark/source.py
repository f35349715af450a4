"""``spark.read.format("danube")``: a PySpark Python Data Source (Spark 4 API) over the
objects of a topic's cloud tier.

Where each step runs:

- ``DanubeDataSource.reader`` and ``DanubeReader.partitions`` run once per query on the
  driver's machine (in a Python worker Spark starts there): the options are checked, the
  settings loaded, etcd read once (:mod:`danube.spark.catalog`) and the read planned
  (:mod:`danube.spark.plan`);
- ``DanubeReader.read`` runs in the executors, once per input partition, with the
  descriptors of its objects and the ``wal_cloud.cloud`` section pickled into it: it reads
  object storage only (:mod:`danube.spark.read`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator, Sequence

import pyarrow as pa
from pyspark.sql import SparkSession
from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition
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
from danube.spark.catalog import read_partitions
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
        """Always the same columns (see :mod:`danube.spark.arrow`)."""
        return SCHEMA

    def reader(self, schema: StructType) -> DanubeReader:
        """Check the options and load the settings; nothing is read yet."""
        if schema != SCHEMA:
            raise InvalidOptionError("schema", "the danube format has a fixed schema")
        options = parse_options(dict(self.options))
        settings = load_source_settings(options)
        return DanubeReader(options, settings.wal_cloud.metadata, settings.wal_cloud.cloud)


class DanubeReader(DataSourceReader):
    """Plans from etcd on the driver; reads objects in the executors."""

    def __init__(self, options: ReadOptions, metadata: MetadataConfig, cloud: CloudConfig):
        self.options = options
        self.metadata = metadata
        self.cloud = cloud

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
        return read_task(self.cloud, partition.slices, self.options)


def register(spark: SparkSession) -> None:
    """Make ``spark.read.format("danube")`` available in this session."""
    spark.dataSource.register(DanubeDataSource)

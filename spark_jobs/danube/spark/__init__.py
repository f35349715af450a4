"""Spark on the cloud tier: ``spark.read.format("danube")`` and the backfill jobs.

::

    from danube.spark import register, spark_session

    spark = spark_session("history")              # local[*] unless spark-submit says otherwise
    register(spark)                               # (spark_session already did)
    df = (spark.read.format("danube")
          .option("config", "danube.yml")         # or etcd_endpoint, prefix, wal_cloud.<key>
          .option("topic", "/default/orders")
          .option("start_offset", 1000).option("end_offset", 2000)
          .option("decode", "schema")             # + value/decode_error, typed by the registry
          .load())

Install with the ``spark`` extra (``pip install 'danube-mesh[spark]'``). docs/spark.md has the
options, the schema, the backfills and how to run on a cluster.
"""

from danube.spark.errors import (
    BackfillStateError,
    InconsistentTierError,
    InvalidOptionError,
    SparkJobError,
    TopicNotReadableError,
    UnsupportedSchemaError,
)
from danube.spark.options import ReadOptions, parse_options
from danube.spark.session import spark_session
from danube.spark.source import FORMAT, SCHEMA, DanubeDataSource, register

__all__ = [
    "FORMAT",
    "SCHEMA",
    "BackfillStateError",
    "DanubeDataSource",
    "InconsistentTierError",
    "InvalidOptionError",
    "ReadOptions",
    "SparkJobError",
    "TopicNotReadableError",
    "UnsupportedSchemaError",
    "parse_options",
    "register",
    "spark_session",
]

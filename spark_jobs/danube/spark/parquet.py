"""Backfill to Parquet: a topic's history (or a range of it) from the cloud tier into a
Parquet dataset partitioned by topic partition and UTC date of publication::

    <output>/partition=0/date=2024-05-01/part-....parquet

Every column of the source but ``partition`` (it is the directory) goes into the files; the
rows of one file are in offset order. ``mode``: ``error`` (the default; refuse an output that
exists), ``overwrite`` (replace the whole output: a re-run of the same range gives the same
dataset) or ``append`` (add files; a re-run of the same range then duplicates it).

The output appears whole or not at all: Spark writes the dataset aside, beside the output
(``.<name>.danube-<id>.tmp``, on the same filesystem), and only a finished write is renamed
into place (:mod:`danube.spark.outputs`). A failed run leaves nothing at the output, so its
re-run needs no ``overwrite``; the aside copy is deleted, unless the driver itself died.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from danube.spark.errors import InvalidOptionError
from danube.spark.outputs import Output
from danube.spark.source import FORMAT

Mode = Literal["error", "overwrite", "append"]
MODES: tuple[Mode, ...] = ("error", "overwrite", "append")
PARTITION_COLUMNS = ("partition", "date")

_US_PER_DAY = 86_400 * 1_000_000


@dataclass(frozen=True, slots=True)
class ParquetBackfill:
    """What a Parquet backfill did: rows written, the time the write took, where."""

    messages: int
    seconds: float
    output: str

    @property
    def messages_per_s(self) -> float:
        """Rows written per second of the write."""
        return self.messages / self.seconds if self.seconds > 0 else 0.0


def with_date(df: DataFrame) -> DataFrame:
    """Add ``date``, the UTC date of ``publish_time`` (whatever the session's time zone)."""
    days = F.floor(F.unix_micros("publish_time") / F.lit(_US_PER_DAY)).cast("int")
    return df.withColumn("date", F.date_from_unix_date(days))


def backfill_to_parquet(
    spark: SparkSession, source_options: Mapping[str, str], output: str, *, mode: Mode = "error"
) -> ParquetBackfill:
    """Read the topic with ``source_options`` (those of ``spark.read.format("danube")``)
    and write it to ``output`` (any path Spark writes Parquet to), whole or not at all.

    Raises :class:`InvalidOptionError` (``output``) in mode ``error`` for an output that
    exists, before anything is read."""
    if mode not in MODES:
        raise InvalidOptionError("mode", f"one of {', '.join(MODES)}, not {mode!r}")
    target = Output(spark, output)
    if mode == "error":
        target.check_absent()
    options = {name.lower(): value for name, value in source_options.items()}
    # As many tasks as cores at least, when the data allows (the source packs small objects).
    options.setdefault("min_partitions", str(spark.sparkContext.defaultParallelism))
    rows = with_date(spark.read.format(FORMAT).options(**options).load())
    with target.aside() as aside:
        started = time.perf_counter()
        rows.write.mode("errorifexists").partitionBy(*PARTITION_COLUMNS).parquet(aside)
        seconds = time.perf_counter() - started  # the write, as before outputs went aside
        # Only the files' footers are read: cheap, and exactly what this run wrote.
        messages = _count(spark, rows, aside)
        target.publish(mode)
    return ParquetBackfill(messages, seconds, output)


def _count(spark: SparkSession, rows: DataFrame, output: str) -> int:
    try:
        return spark.read.schema(rows.schema).parquet(output).count()
    except Exception as exc:
        if "PATH_NOT_FOUND" in str(exc):
            return 0
        raise

"""Errors of the Spark source and the backfill jobs (``danube.spark``)::

    DanubeError
    └── SparkJobError                "spark_job_error"
        ├── InvalidOptionError       "invalid_option": option, reason   a bad source or job option
        ├── TopicNotReadableError    "topic_not_readable": topic         unknown, or non-reliable
        ├── InconsistentTierError    "inconsistent_tier": partition      descriptors that overlap
        ├── UnsupportedSchemaError   "unsupported_schema": path, reason  a registered schema with
        │                                                                no Spark type (decode)
        └── BackfillStateError       "backfill_state": key               a checkpoint that does
                                                                         not fit this run

A corrupt object fails a read with :class:`danube.storage.CorruptObjectError` (naming the
object, the byte position and the offset); storage and etcd failures keep their own errors.
None is retriable as is: Spark retries a failed task by itself where that can help.
"""

from __future__ import annotations

from danube.errors import DanubeError


class SparkJobError(DanubeError):
    """Root of the errors of ``danube.spark``."""

    code = "spark_job_error"


class InvalidOptionError(SparkJobError):
    """An option of the data source, or of a job, that is missing, unknown or malformed."""

    code = "invalid_option"

    def __init__(self, option: str, reason: str) -> None:
        super().__init__(f"option {option!r}: {reason}")
        self.option = option
        self.reason = reason


class TopicNotReadableError(SparkJobError):
    """The topic does not exist, or keeps nothing in object storage (non-reliable)."""

    code = "topic_not_readable"

    def __init__(self, topic: str, reason: str) -> None:
        super().__init__(f"topic {topic}: {reason}")
        self.topic = topic


class InconsistentTierError(SparkJobError):
    """A partition's descriptors contradict each other (e.g. two objects share offsets)."""

    code = "inconsistent_tier"

    def __init__(self, partition: str, reason: str) -> None:
        super().__init__(f"partition {partition}: {reason}")
        self.partition = partition


class BackfillStateError(SparkJobError):
    """A backfill checkpoint that belongs to another run (another selection or target)."""

    code = "backfill_state"

    def __init__(self, key: str, reason: str) -> None:
        super().__init__(f"backfill checkpoint {key}: {reason}")
        self.key = key


class UnsupportedSchemaError(SparkJobError):
    """A registered schema that has no Spark type here (where in it, and why)."""

    code = "unsupported_schema"

    def __init__(self, path: str, reason: str) -> None:
        super().__init__(f"{path}: {reason}")
        self.path = path
        self.reason = reason

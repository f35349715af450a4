"""Prometheus metrics of the uploader (process-wide; lag is the worst partition's)."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

PARTITIONS = Gauge("danube_uploader_partitions", "Partitions this uploader is assigned")
OBJECTS = Counter("danube_uploader_objects", "Objects written and committed")
BYTES = Counter("danube_uploader_bytes", "Object bytes written and committed")
MESSAGES = Counter("danube_uploader_messages", "Messages uploaded")
LOST_OFFSETS = Counter(
    "danube_uploader_lost_offsets", "Offsets gone from the WAL before they could be uploaded"
)
ERRORS = Counter("danube_uploader_errors", "Upload cycles that failed (retried)", ["kind"])
LAG_OFFSETS = Gauge(
    "danube_uploader_lag_offsets", "Durable offsets not uploaded yet (the largest partition)"
)
LAG_SECONDS = Gauge(
    "danube_uploader_lag_seconds",
    "Time since the partition furthest behind was last fully uploaded",
)
CYCLE_SECONDS = Histogram(
    "danube_uploader_cycle_seconds",
    "One upload cycle of one partition",
    buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300),
)
DAMAGED_RANGES = Counter(
    "danube_uploader_damaged_ranges",
    "WAL ranges found damaged before upload (uploads of the partition stop there)",
)
DAMAGED_OFFSETS = Gauge(
    "danube_uploader_damaged_offsets",
    "Offsets of the damaged WAL range a partition's uploads are stopped at (0: none)",
    ["partition"],
)

# Per partition, the topic label capped by metrics.topics_max (danube.runtime.topic_metrics).
PARTITION_LAG_OFFSETS = Gauge(
    "danube_partition_upload_lag_messages",
    "Durable messages of the partition not uploaded yet",
    ["topic", "partition"],
)
PARTITION_LAG_SECONDS = Gauge(
    "danube_partition_upload_lag_seconds",
    "Time since the partition was last fully uploaded",
    ["topic", "partition"],
)

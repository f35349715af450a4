"""Prometheus metrics of the retention service (process-wide; only the leader's move)."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

RUNS = Counter("danube_retention_runs", "Retention passes over every reliable partition")
RUN_ERRORS = Counter(
    "danube_retention_errors", "Failed steps of a pass (the pass goes on)", ["stage"]
)
RUN_SECONDS = Histogram(
    "danube_retention_run_seconds",
    "Duration of one retention pass",
    buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0),
)
SEGMENTS_DROPPED = Counter("danube_retention_wal_segments_dropped", "WAL segments dropped")
BYTES_DROPPED = Counter("danube_retention_wal_bytes_dropped", "Bytes of WAL segments dropped")
OBJECTS_DELETED = Counter("danube_retention_objects_deleted", "Objects deleted from storage")
OBJECT_BYTES_DELETED = Counter(
    "danube_retention_object_bytes_deleted", "Bytes of objects deleted from storage"
)
LEADER = Gauge("danube_retention_leader", "1 while this node leads retention, else 0")

# Per topic, as of the leader's last pass; the label capped by metrics.topics_max
# (danube.runtime.topic_metrics).
TOPIC_CLOUD_BYTES = Gauge(
    "danube_topic_cloud_bytes", "Bytes of the topic's objects in object storage", ["topic"]
)
TOPIC_CLOUD_OBJECTS = Gauge(
    "danube_topic_cloud_objects", "The topic's objects in object storage", ["topic"]
)

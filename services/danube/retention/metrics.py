"""Prometheus metrics of the retention service (process-wide; only the leader's move)."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

from danube.names import TopicName
from danube.runtime.topic_metrics import topic_label

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
TOPIC_WAL_BYTES = Gauge(
    "danube_topic_wal_bytes",
    "Bytes of the topic's WAL on its partitions' leaders (uploaded partitions only)",
    ["topic"],
)
TOPIC_CLOUD_OBJECTS = Gauge(
    "danube_topic_cloud_objects", "The topic's objects in object storage", ["topic"]
)
# What left each tier of a topic, by reason: "acked" (queue retention: every subscription had
# acknowledged it) or "limits" (the time and size limits; some subscription may not have).
TOPIC_DROPPED_MESSAGES = Counter(
    "danube_topic_retention_dropped_messages",
    "Messages retention removed from a tier of the topic",
    ["topic", "tier", "reason"],
)
TOPIC_DROPPED_BYTES = Counter(
    "danube_topic_retention_dropped_bytes",
    "Bytes retention removed from a tier of the topic",
    ["topic", "tier", "reason"],
)


def count_dropped(
    partition: TopicName,
    tier: str,
    messages: int,
    size_bytes: int,
    acked_messages: int,
    acked_bytes: int,
) -> None:
    """Count what left ``tier`` ("wal" or "cloud") of ``partition``'s topic, of it
    ``acked_*`` for the queue reason, the rest for the limits."""
    topic = topic_label(partition)
    for reason, count, size in (
        ("acked", acked_messages, acked_bytes),
        ("limits", messages - acked_messages, size_bytes - acked_bytes),
    ):
        if count or size:
            TOPIC_DROPPED_MESSAGES.labels(topic, tier, reason).inc(count)
            TOPIC_DROPPED_BYTES.labels(topic, tier, reason).inc(size)

"""Prometheus metrics of the cloud reader."""

from __future__ import annotations

from prometheus_client import Counter, Histogram

READS = Counter("danube_cloud_reader_reads", "Fetch requests answered", ["status"])
MESSAGES = Counter("danube_cloud_reader_messages", "Messages served from objects")
# Per topic (danube.runtime.topic_metrics: the topic's own name, OTHER past the cap).
TOPIC_MESSAGES_READ = Counter(
    "danube_cloud_reader_topic_messages_read",
    "Messages of a topic served from objects (historical reads)",
    ["topic"],
)
BYTES = Counter("danube_cloud_reader_bytes", "Object bytes read")
CORRUPT = Counter("danube_cloud_reader_corrupt", "Reads refused: a frame failed its check")
READ_SECONDS = Histogram(
    "danube_cloud_reader_read_seconds",
    "One fetch request, from the request to the reply",
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 10),
)

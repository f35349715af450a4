"""Prometheus metrics of the discovery service (process-wide; routes by their template, so
the label set stays bounded whatever names clients send)."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

from danube.admission.counters import AdmissionCounters

HTTP_REQUESTS = Counter(
    "danube_discovery_http_requests", "HTTP requests answered", ["method", "route", "status"]
)
PRODUCE_SECONDS = Histogram(
    "danube_discovery_produce_seconds",
    "Latency of a successful produce request, check to last durable answer",
    buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0),
)
# Per hop of a produce (docs/operations.md, "Where a produce spends its time"): this whole
# request, the bus request to ingest inside it, and danube_event_loop_lag_seconds for the
# time ready work waits for this process's event loop.
BUS_PRODUCE_SECONDS = Histogram(
    "danube_discovery_bus_produce_seconds",
    "One produce request over the bus to a partition's ingest leader, sent to answered "
    "(failures too: a timeout counts its wait)",
    buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0),
)
MESSAGES_PRODUCED = Counter(
    "danube_discovery_messages_produced", "Messages acknowledged to HTTP producers"
)
# Per topic (danube.runtime.topic_metrics: the topic's own name, OTHER past the cap).
TOPIC_MESSAGES_PRODUCED = Counter(
    "danube_discovery_topic_messages_produced",
    "Messages of a topic acknowledged to producers through this instance",
    ["topic"],
)
STREAMS_OPEN = Gauge("danube_discovery_streams_open", "Consumer streams (WebSocket) open")
# Topics the many-topics streams of this instance read (a dispatcher consumer each).
STREAM_TOPICS_JOINED = Gauge(
    "danube_discovery_stream_topics_joined",
    "Topics joined by many-topics consumer streams (WebSocket), a consumer each",
)
STREAM_MESSAGES = Counter(
    "danube_discovery_stream_messages", "Messages pushed to consumer streams (WebSocket)"
)
# What admission refuses (danube.admission, shared by every produce door): the set of
# counters its pieces are given, registered here under discovery's names. The names stay
# these (docs/operations.md): danube_discovery_{policy_refusals,schema_violations,
# authz_denied,authn_failed}_total.
ADMISSION = AdmissionCounters.register("danube_discovery")
# Discovery's own refusals by policy count there too (too_many_producers, rate_limited...).
POLICY_REFUSALS = ADMISSION.policy_refusals
# The controller's balancer (docs/controller.md, "Balancing"); only the leader sets them.
BALANCE_IMBALANCE = Gauge(
    "danube_discovery_balance_imbalance_replicas",
    "Most minus fewest replicas held by a live undrained ingest node (as targets)",
)
REASSIGNMENTS_UNDER_WAY = Gauge(
    "danube_discovery_reassignments_under_way",
    "Partitions whose replica set is being reassigned, as the controller last counted",
)
REASSIGNMENTS_STARTED = Counter(
    "danube_discovery_reassignments_started",
    "Reassignments written, by reason: drain, spread, leader (the balancer's), operator, cancel",
    ["reason"],
)
# Lookups answered with the last answer given, etcd not answering (danube.admission.last_good).
LOOKUPS_FROM_LAST_GOOD = Counter(
    "danube_discovery_lookups_from_last_good",
    "Lookups answered with the last answer given, etcd not answering",
    ["door"],
)

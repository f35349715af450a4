"""Prometheus metrics of the dispatcher service (process-wide, no per-subscription labels:
their number is unbounded)."""

from __future__ import annotations

import time
from collections.abc import Sequence

from prometheus_client import Counter, Gauge, Histogram

from danube.frame import FRAME_HEADER_BYTES, CorruptRecordError, record_publish_time_ms

SUBSCRIPTIONS = Gauge(
    "danube_dispatcher_subscriptions", "Subscriptions this dispatcher serves", ["dispatch"]
)
CONSUMERS = Gauge("danube_dispatcher_consumers", "Consumers attached to this dispatcher")
DELIVERED = Counter(
    "danube_dispatcher_delivered_messages", "Messages handed to consumers (redeliveries included)"
)
REDELIVERED = Counter(
    "danube_dispatcher_redelivered_messages", "Deliveries with a redelivery count above 0"
)
ACKED = Counter("danube_dispatcher_acked_messages", "Message acks received")
NACKED = Counter("danube_dispatcher_nacked_messages", "Message nacks received")
DEAD_LETTERED = Counter(
    "danube_dispatcher_dead_lettered_messages", "Messages moved to a dead-letter topic"
)
POISON_DROPPED = Counter(
    "danube_dispatcher_poison_dropped_messages",
    "Poison messages acked without delivery by a failure policy's poison_policy drop",
)
DROPPED = Counter(
    "danube_dispatcher_dropped_messages",
    "Non-reliable messages not delivered: a consumer's buffer was full (slow_consumer), "
    "no consumer was attached (no_consumer), or its consumer left (detached)",
    ["reason"],
)
SLOW_DETACHED = Counter(
    "danube_dispatcher_slow_consumers_detached",
    "Consumers detached because their messages timed out unacknowledged "
    "dispatcher.slow_consumer_detach_timeouts times in a row (consumer_detached)",
)
CURSOR_WRITES = Counter("danube_dispatcher_cursor_writes", "Cursor transactions stored in etcd")
CURSOR_WRITE_ERRORS = Counter(
    "danube_dispatcher_cursor_write_errors", "Cursor transactions that failed (retried)"
)
ACK_SECONDS = Histogram(
    "danube_dispatcher_ack_seconds",
    "From an ack request to its cursor being stored",
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 5.0),
)
# A message's way through the dispatcher (docs/operations.md, "Where a produce spends its
# time"): each read for a subscription, and the age of what is handed to consumers.
FETCH_SECONDS = Histogram(
    "danube_dispatcher_fetch_seconds",
    "One read for a subscription: from the partition's ingest leader (tier wal) or from "
    "the cloud reader (tier cloud)",
    ["tier"],
    buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 5.0),
)
DELIVERY_AGE_SECONDS = Histogram(
    "danube_dispatcher_delivery_age_seconds",
    "Age of the oldest first delivery of each batch handed to a consumer, since its publish "
    "time (stamped by discovery: another host's clock)",
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 5.0, 30.0),
)
TIER_MESSAGES = Counter(
    "danube_dispatcher_read_messages",
    "Messages read for subscriptions, by the tier they came from (wal, cloud)",
    ["tier"],
)
LIVE_CARRIED = Counter(
    "danube_dispatcher_live_carried_messages",
    "Messages of the wal tier taken from a live wake-up that carried them (no fetch)",
)
DAMAGED_RANGES = Counter(
    "danube_dispatcher_damaged_ranges",
    "Offset ranges found damaged in every copy (counted once per range and subscription)",
)
DAMAGED_PARTITIONS = Gauge(
    "danube_dispatcher_damaged_partitions",
    "Partitions of served subscriptions stopped at a range damaged in every copy",
)
SKIPPED_OFFSETS = Counter(
    "danube_dispatcher_skipped_offsets", "Offsets an operator skipped (subscriptions skip)"
)

# Per subscription, the labels capped by metrics.topics_max and metrics.subscriptions_max
# (danube.runtime.topic_metrics). The gauges are sampled every metrics.sample_interval_s.
SUB_MESSAGES_OUT = Counter(
    "danube_subscription_messages_out",
    "Messages handed to the subscription's consumers (redeliveries included)",
    ["topic", "subscription"],
)
SUB_BYTES_OUT = Counter(
    "danube_subscription_bytes_out",
    "Record bytes handed to the subscription's consumers",
    ["topic", "subscription"],
)
SUB_REDELIVERED = Counter(
    "danube_subscription_redelivered_messages",
    "Deliveries with a redelivery count above 0",
    ["topic", "subscription"],
)
SUB_DEAD_LETTERED = Counter(
    "danube_subscription_dead_lettered_messages",
    "Messages moved to a dead-letter topic",
    ["topic", "subscription"],
)
SUB_EXPIRED = Counter(
    "danube_subscription_expired_messages",
    "Messages past their TTL, acknowledged for the subscription instead of delivered",
    ["topic", "subscription"],
)
SUB_BACKLOG = Gauge(
    "danube_subscription_backlog_messages",
    "Messages not acknowledged yet, between the cursor and the partitions' committed end",
    ["topic", "subscription"],
)
SUB_DELAYED = Gauge(
    "danube_subscription_delayed_messages",
    "Delayed messages held for a shared or key-shared subscription, not delivered and acked yet",
    ["topic", "subscription"],
)
DELAYED_SPILLED = Counter(
    "danube_dispatcher_delayed_spilled_bytes",
    "Bytes of delayed messages moved from memory to the spill files (memory bound reached)",
)
DELAYED_SNAPSHOTS = Counter(
    "danube_dispatcher_delayed_snapshots",
    "Delay snapshots by event: written, deleted (garbage), write_failed (a hole: the log), "
    "read_failed (its range read from the log instead)",
    ["event"],
)
DELAYED_SNAPSHOT_BYTES = Counter(
    "danube_dispatcher_delayed_snapshot_bytes", "Bytes of delay snapshots written"
)
DELAYED_SNAPSHOT_LOADED = Counter(
    "danube_dispatcher_delayed_snapshot_loaded_messages",
    "Delayed messages taken from snapshots after a resume",
)
DELAYED_REREAD = Counter(
    "danube_dispatcher_delayed_reread_frames",
    "Frames read from the log again after a resume to find the delayed messages not acked "
    "(the ranges no snapshot holds)",
)
SUB_UNACKED = Gauge(
    "danube_subscription_unacked_messages",
    "Messages delivered to consumers and not acknowledged yet",
    ["topic", "subscription"],
)
SUB_CONSUMERS = Gauge(
    "danube_subscription_consumers", "Consumers attached", ["topic", "subscription"]
)
POLICY_REFUSALS = Counter(
    "danube_dispatcher_policy_refusals",
    "Attaches refused by a topic's policies (docs/policies.md), by reason",
    ["reason"],
)
BACKLOG_EVICTED = Counter(
    "danube_dispatcher_backlog_evicted_messages",
    "Messages a subscription's cursor was moved past by a backlog quota of policy evict_oldest",
)


def observe_delivery_age(
    redelivery_counts: Sequence[int], frames: Sequence[bytes | memoryview]
) -> None:
    """Observe the age of the batch's first message delivered for the first time (message
    ``i`` is ``frames[i]``, redelivered ``redelivery_counts[i]`` times; in one partition's
    offset order: its oldest; a redelivery's age is its redelivery delay, not a hop). One
    record header read per batch, never per message, and no CRC: the frame is checked by
    whoever decodes it, and a metric never fails a delivery."""
    for count, frame in zip(redelivery_counts, frames, strict=True):
        if count == 0:
            try:
                published_ms = record_publish_time_ms(memoryview(frame)[FRAME_HEADER_BYTES:])
            except CorruptRecordError:
                return
            DELIVERY_AGE_SECONDS.observe(max(0.0, time.time() - published_ms / 1000))
            return


# Balancing (danube.dispatcher.balance): subscriptions handed over, and claims refused.
HANDED_OVER = Counter(
    "danube_dispatcher_handed_over_subscriptions",
    "Subscriptions handed over while serving: beyond the fair share (balance) or drained (drain)",
    ["reason"],
)
DEAD_OWNERS_ENDED = Counter(
    "danube_dispatcher_dead_owner_leases_ended",
    "Leases of killed dispatchers ended by a claim here (their door refused connections)",
)
CLAIMS_REFUSED = Counter(
    "danube_dispatcher_refused_claims",
    "Claims refused (claim_refused, retriable): drained, at its fair share, or held off",
)

# Through an etcd outage (docs/dispatcher.md, "Through an etcd outage").
LEASELESS_SECONDS = Gauge(
    "danube_dispatcher_leaseless_seconds",
    "How long this dispatcher has served without its node lease (0: it has its lease)",
)
LEASELESS_ACKS = Counter(
    "danube_dispatcher_leaseless_acks",
    "Acks answered without their cursor write (held in memory: no node lease)",
)
RECLAIMS = Counter(
    "danube_dispatcher_reclaims",
    "Subscriptions served through a lost lease, by what the reclaim found: reclaimed (the "
    "owner key written again) or lost (changed meanwhile: no longer served here)",
    ["outcome"],
)
FENCED_BY_CLAIM = Counter(
    "danube_dispatcher_fenced_by_claim",
    "Subscriptions served without the lease that stopped on hearing another dispatcher's claim",
)
LEASELESS_EXPIRED = Counter(
    "danube_dispatcher_leaseless_expired",
    "Subscriptions stopped because the dispatcher was without its lease past leaseless_serve_max_s",
)

# The consume door (danube.dispatcher.door; docs/http-api.md, "Direct consume").
DOOR_REQUESTS = Counter(
    "danube_dispatcher_door_requests",
    "Requests answered by the consume door, by operation (poll, ack, nack, detach, stream)",
    ["op"],
)
DOOR_MESSAGES = Counter(
    "danube_dispatcher_door_messages", "Messages delivered through the consume door"
)
DOOR_STREAMS_OPEN = Gauge(
    "danube_dispatcher_door_streams_open", "Consumer streams (WebSocket) open on the consume door"
)
DOOR_REFUSALS = Counter(
    "danube_dispatcher_door_refusals",
    "Consume door requests refused, by error code (not_leader: the subscription is elsewhere)",
    ["code"],
)
# Who the consume door refused, as every door counts them (danube.security.gate).
AUTHN_FAILED = Counter(
    "danube_dispatcher_authn_failed",
    "Consume door requests refused for missing or invalid credentials (HTTP 401)",
    ["code"],
)
AUTHZ_DENIED = Counter(
    "danube_dispatcher_authz_denied",
    "Consume door requests refused for a missing permission (HTTP 403)",
    ["permission"],
)

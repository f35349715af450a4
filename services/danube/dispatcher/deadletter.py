"""Poison messages let go (failure policy ``dead_letter`` or ``drop``): a message refused
more than ``max_redeliveries`` times goes, as it was stored, to its dead-letter topic — the
policy's ``dead_letter_topic``, by default the unpartitioned ``/ns/<topic><suffix>`` — a
topic like any other (created with the source topic's durability and replication on the
first letter); or it is only counted as dropped."""

from __future__ import annotations

import logging

from danube.dispatcher import metrics
from danube.dispatcher.store import SubscriptionStore
from danube.meta import TopicName
from danube.runtime.topic_metrics import subscription_labels
from danube.wire.ingest.client import IngestClient

log = logging.getLogger(__name__)

DEAD_LETTER_TIMEOUT_S = 10.0


def dead_letter_topic(partition: TopicName, suffix: str, named: str | None = None) -> TopicName:
    """``named`` (``/ns/t``) when the failure policy names one, else ``/ns/t-part-k`` (or
    ``/ns/t``) dead-letters to the unpartitioned ``/ns/t<suffix>``."""
    if named is not None:
        return TopicName.parse(named)
    return TopicName(partition.namespace, partition.base + suffix)


async def send_dead_letter(
    store: SubscriptionStore,
    ingest: IngestClient,
    partition: TopicName,
    offset: int,
    record: bytes,
    topic: TopicName,
) -> None:
    """Store ``record`` (``partition``@``offset``) in the dead-letter ``topic``, durably;
    raises what failed (the caller must not store a cursor past it then)."""
    await store.ensure_topic_like_ours(topic)
    await ingest.produce(topic, [record], timeout_s=DEAD_LETTER_TIMEOUT_S)
    metrics.DEAD_LETTERED.inc()
    metrics.SUB_DEAD_LETTERED.labels(*subscription_labels(store.topic, store.sub)).inc()
    log.info("dead-lettered %s@%d to %s", partition, offset, topic)


def drop(partition: TopicName, offset: int, redelivery_count: int) -> None:
    """Count a poison message dropped (acked without being processed)."""
    metrics.POISON_DROPPED.inc()
    log.warning(
        "dropped poison message %s@%d after %d redeliveries", partition, offset, redelivery_count
    )

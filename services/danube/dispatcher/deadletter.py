"""Dead letters: a message refused ``max_redeliveries`` times goes, as it was stored, to the
unpartitioned ``/ns/<topic><suffix>`` — a topic like any other (created with the source
topic's durability and replication on the first letter)."""

from __future__ import annotations

import logging

from danube.dispatcher import metrics
from danube.dispatcher.store import SubscriptionStore
from danube.ingest.client import IngestClient
from danube.meta import TopicName

log = logging.getLogger(__name__)

DEAD_LETTER_TIMEOUT_S = 10.0


def dead_letter_topic(partition: TopicName, suffix: str) -> TopicName:
    """``/ns/t-part-k`` (or ``/ns/t``) dead-letters to the unpartitioned ``/ns/t<suffix>``."""
    return TopicName(partition.namespace, partition.base + suffix)


async def send_dead_letter(
    store: SubscriptionStore,
    ingest: IngestClient,
    partition: TopicName,
    offset: int,
    record: bytes,
    suffix: str,
) -> None:
    """Store ``record`` (``partition``@``offset``) in the dead-letter topic, durably; raises
    what failed (the caller must not store a cursor past it then)."""
    topic = dead_letter_topic(partition, suffix)
    await store.ensure_topic_like_ours(topic)
    await ingest.produce(topic, [record], timeout_s=DEAD_LETTER_TIMEOUT_S)
    metrics.DEAD_LETTERED.inc()
    log.info("dead-lettered %s@%d to %s", partition, offset, topic)

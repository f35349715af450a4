"""Reading every topic config at once (the controller, the uploader and retention all need
the full list)."""

from __future__ import annotations

import logging

from danube.meta import keys as meta_keys
from danube.meta.errors import MetaDecodeError
from danube.meta.kv import decode_model
from danube.meta.records import TopicConfig
from danube.meta.store import MetaStore
from danube.names import InvalidNameError, TopicName

log = logging.getLogger(__name__)


async def read_topics(store: MetaStore) -> dict[TopicName, TopicConfig]:
    """Every topic's config; a key that does not parse is logged and skipped."""
    topics: dict[TopicName, TopicConfig] = {}
    for kv in await store.range(meta_keys.topics_prefix()):
        try:
            topics[meta_keys.parse_topic_key(kv.key)] = decode_model(kv, TopicConfig)
        except (MetaDecodeError, InvalidNameError) as exc:
            log.warning("skipping topic %s: %s", kv.key, exc)
    return topics

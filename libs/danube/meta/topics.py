"""Reading every topic config at once (the controller, the uploader and retention all need
the full list), and creating one that a service writes to on its own (a dead-letter topic)."""

from __future__ import annotations

import logging

from danube.meta import keys as meta_keys
from danube.meta.errors import MetaDecodeError
from danube.meta.keys import ServiceKind
from danube.meta.kv import decode_model, encode_model
from danube.meta.records import NamespacePolicy, Policies, TopicConfig
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


async def read_namespaces(store: MetaStore) -> dict[str, NamespacePolicy]:
    """Every namespace's policy; a key that does not parse is logged and skipped."""
    found: dict[str, NamespacePolicy] = {}
    for kv in await store.range(meta_keys.NAMESPACES_PREFIX):
        try:
            found[kv.key.removeprefix(meta_keys.NAMESPACES_PREFIX)] = decode_model(
                kv, NamespacePolicy
            )
        except MetaDecodeError as exc:
            log.warning("skipping namespace %s: %s", kv.key, exc)
    return found


async def create_topic_if_absent(store: MetaStore, topic: TopicName, config: TopicConfig) -> bool:
    """Write ``config`` for ``topic`` unless it has one; whether it was written. (The caller
    writes next to a topic of the same namespace, so the namespace cannot be deleted.)"""
    result = await (
        store.txn()
        .if_absent(meta_keys.topic_key(topic))
        .then_put(meta_keys.topic_key(topic), encode_model(config))
        .commit()
    )
    if result.succeeded:
        log.info("created topic %s", topic)
    return result.succeeded


async def live_nodes(store: MetaStore, kind: ServiceKind) -> set[str]:
    """The ids of the nodes of ``kind`` registered now (their keys live under their leases,
    so a registered node is a live one)."""
    return {
        meta_keys.parse_node_key(kv.key)[1]
        for kv in await store.range(meta_keys.nodes_prefix(kind))
    }


async def read_policies(store: MetaStore, topic: TopicName) -> Policies:
    """The policies in effect for ``topic`` (or its partition): the topic's own over its
    namespace's (docs/policies.md), read from etcd; none when neither exists."""
    base = topic.parent
    config = await store.get_model(meta_keys.topic_key(base), TopicConfig)
    namespace = await store.get_model(meta_keys.namespace_key(base.namespace), NamespacePolicy)
    own = Policies() if config is None else config.policies
    return own.over(None if namespace is None else namespace.policies)

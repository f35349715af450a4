"""The driver's one look at etcd: a topic's config, and each partition's object descriptors
and uploader checkpoint (docs/metadata.md has the keys). Executors never call etcd."""

from __future__ import annotations

import asyncio
import logging

from danube.config import MetadataConfig
from danube.meta import MetaStore
from danube.meta import keys as meta_keys
from danube.meta.records import TopicConfig, UploaderCheckpoint
from danube.names import TopicName
from danube.spark.errors import TopicNotReadableError
from danube.spark.plan import PartitionObjects
from danube.storage import ObjectDescriptor

log = logging.getLogger(__name__)

CATALOG_TIMEOUT_S = 120.0  # the whole look, however many partitions; each request has its own


async def read_partitions(metadata: MetadataConfig, topic: TopicName) -> list[PartitionObjects]:
    """The objects of ``topic`` (every partition) or of one partition of it.

    Raises :class:`TopicNotReadableError` for a topic that does not exist, keeps nothing in
    object storage (non-reliable), or has no such partition.
    """
    async with asyncio.timeout(CATALOG_TIMEOUT_S):
        store = await MetaStore.connect(metadata)
        try:
            return await _read(store, topic)
        finally:
            await store.close()


async def _read(store: MetaStore, topic: TopicName) -> list[PartitionObjects]:
    parent = topic.parent
    config = await store.get_model(meta_keys.topic_key(parent), TopicConfig)
    if config is None:
        raise TopicNotReadableError(str(parent), "no such topic")
    if config.dispatch != "reliable":
        raise TopicNotReadableError(str(parent), "non-reliable: nothing is in object storage")
    names = parent.partitions(config.partitions)
    if topic != parent:
        if topic not in names:
            raise TopicNotReadableError(str(topic), f"the topic has {config.partitions} partitions")
        names = [topic]
    found = []
    for name in names:
        kvs = await store.range(meta_keys.object_descriptors_prefix(name))
        descriptors = sorted(
            (ObjectDescriptor.from_bytes(kv.value) for kv in kvs), key=lambda d: d.first_offset
        )
        checkpoint = await store.get_model(
            meta_keys.uploader_checkpoint_key(name), UploaderCheckpoint
        )
        uploaded = -1 if checkpoint is None else checkpoint.uploaded_through
        found.append(PartitionObjects(name, name.partition or 0, tuple(descriptors), uploaded))
        log.info("%s: %d objects, uploaded through offset %d", name, len(descriptors), uploaded)
    return found

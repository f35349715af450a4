"""The driver's one look at etcd: a topic's config, and each partition's object descriptors
and uploader checkpoint (docs/metadata.md has the keys); with ``decode=schema``, the topic's
schema binding and its subject's versions (docs/schemas.md). Executors never call etcd."""

from __future__ import annotations

import asyncio
import logging

from danube.config import MetadataConfig
from danube.meta import MetaStore
from danube.meta import keys as meta_keys
from danube.meta.records import (
    SchemaSubject,
    SchemaVersionRecord,
    TopicConfig,
    TopicSchemaRecord,
    UploaderCheckpoint,
)
from danube.names import TopicName
from danube.spark.decode import DECODED_TYPES, TopicSchema
from danube.spark.errors import InvalidOptionError, TopicNotReadableError, UnsupportedSchemaError
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


async def read_topic_schema(metadata: MetadataConfig, topic: TopicName) -> TopicSchema:
    """The subject ``topic`` (its parent, for a partition) is bound to, with every version.

    Raises :class:`InvalidOptionError` (``decode``) for a topic with no binding, a subject of
    a type that is not decoded, or a schema with no Spark type (naming the path in it).
    """
    async with asyncio.timeout(CATALOG_TIMEOUT_S):
        store = await MetaStore.connect(metadata)
        try:
            return await _read_schema(store, topic.parent)
        finally:
            await store.close()


async def _read_schema(store: MetaStore, topic: TopicName) -> TopicSchema:
    binding = await store.get_model(meta_keys.topic_schema_key(topic), TopicSchemaRecord)
    if binding is None:
        raise InvalidOptionError("decode", f"topic {topic} is not bound to a schema subject")
    subject = await store.get_model(meta_keys.subject_key(binding.subject), SchemaSubject)
    if subject is None:
        raise InvalidOptionError("decode", f"subject {binding.subject} of {topic} does not exist")
    if subject.schema_type not in DECODED_TYPES:
        raise InvalidOptionError(
            "decode",
            f"{topic} is bound to {binding.subject}, a {subject.schema_type} subject: only "
            "avro and json_schema payloads are decoded",
        )
    found = await store.range_models(
        meta_keys.schema_versions_prefix(binding.subject), SchemaVersionRecord
    )
    versions = [version for _, version in found]
    live = [v.version for v in versions if v.deleted_ms is None]
    if not live:
        raise InvalidOptionError("decode", f"subject {binding.subject} has no live version")
    schema = TopicSchema(
        topic=str(topic),
        subject=binding.subject,
        schema_id=subject.schema_id,
        schema_type=subject.schema_type,
        latest=max(live),
        definitions={v.version: v.definition for v in versions},
    )
    try:
        schema.value_type()
    except UnsupportedSchemaError as exc:
        raise InvalidOptionError(
            "decode", f"subject {binding.subject} version {schema.latest}: {exc.message}"
        ) from exc
    log.info("%s: decoding with %s version %d", topic, binding.subject, schema.latest)
    return schema

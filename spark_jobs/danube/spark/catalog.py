"""The driver's one look at etcd: the cluster's object store when the config names none, a
topic's config, and each partition's object descriptors and uploader checkpoint
(docs/metadata.md has the keys); with ``decode=schema``, the topic's schema binding and its
subject's versions (docs/schemas.md). Executors never call etcd."""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass

from danube.config import DanubeSettings, MetadataConfig
from danube.meta import MetaStore
from danube.meta import keys as meta_keys
from danube.meta.records import (
    ObjectStoreRecord,
    SchemaSubject,
    SchemaVersionRecord,
    TopicConfig,
    TopicSchemaRecord,
    UploaderCheckpoint,
)
from danube.names import TopicName
from danube.spark.decode import DECODED_TYPES, TopicSchema
from danube.spark.errors import InvalidOptionError, TopicNotReadableError, UnsupportedSchemaError
from danube.spark.options import (
    ReadOptions,
    backend_given,
    load_source_settings,
    recorded_cloud_environment,
    without_cloud,
)
from danube.spark.plan import PartitionObjects
from danube.storage import ObjectDescriptor, ObjectStore
from danube.storage.location import describe

log = logging.getLogger(__name__)

CATALOG_TIMEOUT_S = 120.0  # the whole look, however many partitions; each request has its own


@dataclass(frozen=True, slots=True)
class SourceSettings:
    """The settings a read uses, and where its object store is, said for error messages:
    ``s3://bucket/root at http://... (recorded in etcd by uploader-1)``."""

    settings: DanubeSettings
    location: str


def source_settings(
    options: ReadOptions, environ: Mapping[str, str] | None = None
) -> SourceSettings:
    """:func:`load_source_settings`, with the object store the cluster recorded in etcd
    (``cluster/object_store``) when neither the config file nor the options and ``DANUBE_*``
    variables name a ``wal_cloud.cloud.backend``. The recorded section has no credentials:
    ``DANUBE_WAL_CLOUD__CLOUD__*`` variables and options are laid over it key by key, and
    the backend's own chain (``AWS_*``...) applies as in any service."""
    env = dict(os.environ if environ is None else environ)
    if backend_given(options, env):
        return _located(load_source_settings(options, env), "as configured")
    # Without the cloud keys of the variables and options (credentials alone would fail to
    # load without a backend), to learn whether the file names a store, and where etcd is.
    bare = load_source_settings(*without_cloud(options, env))
    if "cloud" in bare.wal_cloud.model_fields_set:
        return _located(load_source_settings(options, env), "as configured")
    recorded = asyncio.run(read_object_store(bare.wal_cloud.metadata))
    if recorded is None:
        prefix = bare.wal_cloud.metadata.prefix
        note = f"the default: none configured, none recorded in etcd under {prefix}"
        return _located(load_source_settings(options, env), note)
    settings = load_source_settings(options, {**recorded_cloud_environment(recorded.cloud), **env})
    return _located(settings, f"recorded in etcd by {recorded.recorded_by}")


def _located(settings: DanubeSettings, note: str) -> SourceSettings:
    return SourceSettings(settings, f"{describe(settings.wal_cloud.cloud)} ({note})")


async def check_first_object(found: SourceSettings, topic: TopicName) -> None:
    """Read ``topic``'s descriptors and stat its first object: a store configured or
    recorded wrong fails here, with :class:`danube.storage.ObjectNotFoundError` naming
    where it looked, rather than in the first task."""
    partitions = await read_partitions(found.settings.wal_cloud.metadata, topic)
    first = next((p.descriptors[0] for p in partitions if p.descriptors), None)
    if first is not None:
        cloud = found.settings.wal_cloud.cloud
        await ObjectStore.from_config(cloud, location=found.location).stat(first.key)


async def read_object_store(metadata: MetadataConfig) -> ObjectStoreRecord | None:
    """The cluster's object store as a service recorded it (no credentials), if any."""
    async with asyncio.timeout(CATALOG_TIMEOUT_S):
        store = await MetaStore.connect(metadata)
        try:
            return await store.get_model(meta_keys.OBJECT_STORE_KEY, ObjectStoreRecord)
        finally:
            await store.close()


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

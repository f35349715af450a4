"""Test cloud tiers made the way the uploader makes them (objects through ``danube.storage``,
descriptors and checkpoints in etcd), for Spark tests that need exact, varied contents fast."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass

from danube.frame import Record, encode_frame, encode_record
from danube.frame.compression import Compression
from danube.meta import MetaStore
from danube.meta import keys as meta_keys
from danube.meta.records import TopicConfig, UploaderCheckpoint
from danube.names import TopicName
from danube.storage import ObjectDescriptor, ObjectStore, SparseIndexBuilder, object_key

ROOT_PREFIX = "/danube-data"


@dataclass(frozen=True, slots=True)
class Message:
    """What a message of a test topic holds, to compare against what Spark reads."""

    partition: int
    offset: int
    publish_time_ms: int
    producer: str
    key: str | None
    attributes: dict[str, str]
    payload: bytes
    schema_id: int | None = None
    schema_version: int | None = None
    compression: Compression | None = None  # how the object stores its payload

    def row(self) -> tuple[int, int, str | None, str]:
        """(partition, offset, key, sha256 of the payload): what tests compare."""
        return (self.partition, self.offset, self.key, hashlib.sha256(self.payload).hexdigest())


FIRST_TIME_MS = 1_700_000_000_000  # 2023-11-14T22:13:20Z


def message(partition: int, offset: int, *, time_step_ms: int = 10) -> Message:
    """The message a test tier holds at ``offset``: every field derived from it, some with
    no key, some with an empty key, some with attributes, payloads of varying size; published
    ``time_step_ms`` after the one before it."""
    key = None if offset % 7 == 0 else ("" if offset % 11 == 0 else f"k{offset % 13}")
    attributes = {"n": str(offset), "p": str(partition)} if offset % 5 == 0 else {}
    payload = b"p%d-%08d:" % (partition, offset) + bytes([offset % 256]) * (offset % 97)
    time_ms = FIRST_TIME_MS + offset * time_step_ms
    return Message(partition, offset, time_ms, "t", key, attributes, payload)


async def write_tier(
    store: MetaStore,
    objects: ObjectStore,
    topic: TopicName,
    partition_counts: Sequence[int],
    *,
    per_object: int,
    index_every_bytes: int = 4096,
    time_step_ms: int = 10,
) -> list[Message]:
    """Create ``topic`` (partitioned when given more than one count) and upload
    ``partition_counts[i]`` messages to partition ``i``, ``per_object`` per object; return
    every message, in partition then offset order."""
    partitions = 0 if len(partition_counts) == 1 else len(partition_counts)
    await store.put_model(
        meta_keys.topic_key(topic), TopicConfig(partitions=partitions, created_ms=1)
    )
    written: list[Message] = []
    for index, (name, count) in enumerate(
        zip(topic.partitions(partitions), partition_counts, strict=True)
    ):
        for first in range(0, count, per_object):
            last = min(first + per_object, count) - 1
            batch = [
                message(index, offset, time_step_ms=time_step_ms)
                for offset in range(first, last + 1)
            ]
            await _upload(store, objects, name, batch, index_every_bytes)
            written += batch
    return written


async def append_tier(
    store: MetaStore,
    objects: ObjectStore,
    partition: TopicName,
    index: int,
    offsets: range,
    *,
    per_object: int,
) -> list[Message]:
    """Upload the messages of ``offsets`` (those after the partition's last object) to
    partition ``index`` (named ``partition``), ``per_object`` per object, as the uploader
    does after a producer sent more; return them."""
    written: list[Message] = []
    for first in range(offsets.start, offsets.stop, per_object):
        batch = [message(index, o) for o in range(first, min(first + per_object, offsets.stop))]
        await _upload(store, objects, partition, batch, 4096)
        written += batch
    return written


async def upload(
    store: MetaStore, objects: ObjectStore, topic: TopicName, messages: list[Message]
) -> None:
    """Create ``topic`` (no partitions) and upload ``messages`` (offsets from 0) as one object."""
    await store.put_model(meta_keys.topic_key(topic), TopicConfig(partitions=0, created_ms=1))
    await _upload(store, objects, topic, messages, 4096)


async def _upload(
    store: MetaStore,
    objects: ObjectStore,
    name: TopicName,
    batch: list[Message],
    index_every_bytes: int,
) -> None:
    builder = SparseIndexBuilder(index_every_bytes)
    body = bytearray()
    for m in batch:
        record = Record(
            payload=m.payload,
            publish_time_ms=m.publish_time_ms,
            producer=m.producer,
            key=m.key,
            attributes=m.attributes,
            schema_id=m.schema_id,
            schema_version=m.schema_version,
            compression=m.compression,
        )
        frame = encode_frame(m.offset, encode_record(record))
        builder.add(m.offset, len(body), len(frame))
        body += frame
    first, last = batch[0].offset, batch[-1].offset
    key = object_key(ROOT_PREFIX, name.namespace, name.topic, first, last)
    await objects.write(key, bytes(body))
    descriptor = ObjectDescriptor.from_builder(key, builder, created_ms=1_700_000_000_000)
    await store.put(meta_keys.object_descriptor_key(name, first), descriptor.to_bytes())
    await store.put_model(
        meta_keys.uploader_checkpoint_key(name),
        UploaderCheckpoint(uploaded_through=last, last_object_key=key, updated_ms=1),
    )

"""The uploader with a real ingest, etcd, NATS and object storage (local fs and the S3
server): the cloud tier holds every durable offset exactly once, contiguous, and objects,
descriptors and the WAL agree; a pending range left by a crash is finished as recorded; the
object store is recorded in etcd, without credentials."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from danube.bus import Bus, TopicName
from danube.config import (
    BusConfig,
    CloudConfig,
    DanubeSettings,
    IngestConfig,
    MetadataConfig,
    UploaderConfig,
    UploaderServiceConfig,
    WalCloudConfig,
    WalConfig,
)
from danube.frame import Record, decode_frames, encode_record
from danube.ingest import app as ingest_app
from danube.meta import MetaStore, encode_model
from danube.meta import keys as meta_keys
from danube.meta.records import ObjectStoreRecord, TopicConfig, UploaderCheckpoint
from danube.runtime.service import run_in_process
from danube.storage import ObjectDescriptor, ObjectStore
from danube.storage.location import public_settings
from danube.up import free_port
from danube.uploader import app as uploader_app
from danube.uploader import upload
from danube.uploader.verify import verify_partition
from danube.wire.ingest.client import IngestClient

pytestmark = pytest.mark.integration

TOPIC = TopicName("default", "up")
PAYLOAD = b"x" * 1000


def _settings(
    nats_url: str, etcd: str, prefix: str, wal_dir: Path, cloud: CloudConfig
) -> DanubeSettings:
    return DanubeSettings(
        bus=BusConfig(servers=[nats_url]),
        wal_cloud=WalCloudConfig(
            wal=WalConfig(dir=wal_dir),
            metadata=MetadataConfig(etcd_endpoint=etcd, prefix=prefix),
            uploader=UploaderConfig(interval_seconds=1, max_object_mb=1),
            cloud=cloud,
        ),
        ingest=IngestConfig(lease_ttl_s=3, metrics_port=free_port()),
        uploader=UploaderServiceConfig(lease_ttl_s=3, metrics_port=free_port()),
    )


@pytest.fixture
def settings(
    nats_url: str, etcd_endpoint: str, meta_prefix: str, tmp_path: Path, cloud_config: CloudConfig
) -> DanubeSettings:
    return _settings(nats_url, etcd_endpoint, meta_prefix, tmp_path / "wal", cloud_config)


async def _produce(bus: Bus, count: int, start: int = 0) -> list[int]:
    client = IngestClient(bus)
    offsets: list[int] = []
    for first in range(start, start + count, 100):
        records = [
            encode_record(Record(payload=b"%d:" % n + PAYLOAD, publish_time_ms=1, producer="t"))
            for n in range(first, min(first + 100, start + count))
        ]
        offset = await client.produce(TOPIC, records, timeout_s=10)
        offsets += range(offset, offset + len(records))
    return offsets


async def _uploaded_through(store: MetaStore, target: int, timeout_s: float = 30) -> None:
    key = meta_keys.uploader_checkpoint_key(TOPIC)
    async with asyncio.timeout(timeout_s):
        while True:
            checkpoint = await store.get_model(key, UploaderCheckpoint)
            if checkpoint is not None and checkpoint.uploaded_through >= target:
                return
            await asyncio.sleep(0.1)


async def check_cloud_tier(
    store: MetaStore, objects: ObjectStore, partition: TopicName, wal: dict[int, bytes]
) -> list[ObjectDescriptor]:
    """verify_partition finds nothing wrong, the objects hold the WAL's first offsets in order,
    each with the WAL's bytes, and the sparse index points at frame starts."""
    report = await verify_partition(store, objects, partition)
    assert report.ok, report.problems
    assert report.offsets, "nothing uploaded"
    assert report.offsets == sorted(wal)[: len(report.offsets)], "a gap or a wrong order"
    assert report.uploaded_through == report.offsets[-1]
    for descriptor in report.descriptors:
        body = await objects.read(descriptor.key)
        for frame in decode_frames(body)[0]:
            assert bytes(frame.payload) == wal[frame.offset]
        for offset, position in descriptor.index:
            assert decode_frames(body, position)[0][0].offset == offset
    checkpoint = await store.get_model(
        meta_keys.uploader_checkpoint_key(partition), UploaderCheckpoint
    )
    assert checkpoint is not None
    assert checkpoint.pending_end is None
    return report.descriptors


async def _wal(bus: Bus) -> dict[int, bytes]:
    found: dict[int, bytes] = {}
    offset = 0
    client = IngestClient(bus)
    while True:
        reply = await client.fetch(TOPIC, offset, max_count=5000)
        for frame in reply.frames:
            found[frame.offset] = bytes(frame.payload)
        if reply.next_offset == offset:
            return found
        offset = reply.next_offset


async def _create_topic(store: MetaStore) -> None:
    config = TopicConfig(created_ms=int(time.time() * 1000))
    await store.put_model(meta_keys.topic_key(TOPIC), config)


@pytest.mark.parametrize("streamed", [False, True], ids=["in-memory", "streamed"])
async def test_uploads_every_offset_once_in_objects_of_at_most_max_object_mb(
    bus: Bus,
    store: MetaStore,
    settings: DanubeSettings,
    streamed: bool,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    if streamed:  # objects past 64 KiB are streamed (multipart) in a second pass over the WAL
        monkeypatch.setattr(upload, "MEMORY_OBJECT_BYTES", 64 * 1024)
    await _create_topic(store)
    objects = ObjectStore.from_config(settings.wal_cloud.cloud)
    async with run_in_process(ingest_app.serve, settings, "ingest-u"):
        offsets = await _produce(bus, 3000)  # ~3 MB: at least three 1 MiB objects
        async with run_in_process(uploader_app.serve, settings, "uploader-u"):
            await _uploaded_through(store, offsets[-1])
            more = await _produce(bus, 500, start=3000)  # a later cycle picks these up
            await _uploaded_through(store, more[-1])
        wal = await _wal(bus)
    # Where the objects are, for readers given only etcd (never a credential).
    recorded = await store.get_model(meta_keys.OBJECT_STORE_KEY, ObjectStoreRecord)
    assert recorded is not None
    assert recorded.recorded_by == "uploader-u"
    assert recorded.cloud == public_settings(settings.wal_cloud.cloud)
    descriptors = await check_cloud_tier(store, objects, TOPIC, wal)
    assert len(descriptors) >= 4
    assert all(d.size_bytes <= 1 << 20 for d in descriptors)
    assert sorted(wal) == offsets + more


async def test_a_pending_range_is_finished_exactly_as_recorded(
    bus: Bus, store: MetaStore, settings: DanubeSettings
) -> None:
    await _create_topic(store)
    objects = ObjectStore.from_config(settings.wal_cloud.cloud)
    async with run_in_process(ingest_app.serve, settings, "ingest-p"):
        offsets = await _produce(bus, 300)
        # An uploader died after recording 0..99 as pending: whatever is durable by now,
        # the next object is exactly 0..99.
        pending = UploaderCheckpoint(uploaded_through=-1, pending_end=99, updated_ms=1)
        await store.put(meta_keys.uploader_checkpoint_key(TOPIC), encode_model(pending))
        async with run_in_process(uploader_app.serve, settings, "uploader-p"):
            await _uploaded_through(store, offsets[-1])
        wal = await _wal(bus)
    descriptors = await check_cloud_tier(store, objects, TOPIC, wal)
    assert (descriptors[0].first_offset, descriptors[0].last_offset) == (0, 99)

"""The cloud tier end to end on fs and on the S3 server: ingest, uploader, cloud_reader and a
dispatcher in-process. A subscription from earliest on a topic whose early WAL segments are
gone reads everything, first from objects then from the WAL, in order with no duplicate; a
flipped byte in an object is never served (the frames before it are; a read from it names
the object and where its intact frames resume); a start or seek by a time older than the
WAL is found in the objects (descriptors carry publish times)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
from crc32c import crc32c
from prometheus_client import REGISTRY

import danube.frame.codec as codec
from danube.bus import Bus, NoRespondersError, TopicName
from danube.cloud_reader import app as cloud_reader_app
from danube.config import (
    BusConfig,
    CloudConfig,
    CloudReaderConfig,
    DanubeSettings,
    DiscoveryConfig,
    DispatcherConfig,
    IngestConfig,
    MetadataConfig,
    RotationConfig,
    UploaderConfig,
    UploaderServiceConfig,
    WalCloudConfig,
    WalConfig,
)
from danube.discovery import app as discovery_app
from danube.dispatcher import app as dispatcher_app
from danube.frame import Record, append_frame, decode_frames, decode_record, encode_record
from danube.ingest import app as ingest_app
from danube.meta import MetaStore
from danube.meta import keys as meta_keys
from danube.meta.records import TopicConfig, UploaderCheckpoint
from danube.runtime.service import run_in_process
from danube.storage import (
    ObjectDescriptor,
    ObjectStore,
    SparseIndexBuilder,
    object_key,
    topic_prefix,
)
from danube.up import free_port
from danube.uploader import app as uploader_app
from danube.wire.cloud.client import CloudClient
from danube.wire.dispatcher.client import DispatcherClient
from danube.wire.ingest import protocol as ingest_protocol
from danube.wire.ingest.client import IngestClient

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

TOPIC = TopicName("default", "history")
# Messages of the earliest-read test: 100 000 in `make bench` (a soak), 20 000 in `make test`.
# Its WAL segments rotate at this many bytes per message (a message takes about 30 on disk):
# a few segments at either size, so that dropping the lower half leaves objects to read.
MESSAGES = [pytest.param(100_000, marks=pytest.mark.soak), 20_000]
ROTATION_BYTES_PER_MESSAGE = 10


@pytest.fixture
def settings(
    nats_url: str, etcd_endpoint: str, meta_prefix: str, tmp_path: Path, cloud_config: CloudConfig
) -> DanubeSettings:
    return DanubeSettings(
        bus=BusConfig(servers=[nats_url]),
        wal_cloud=WalCloudConfig(
            wal=WalConfig(dir=tmp_path / "wal", rotation=RotationConfig(max_bytes=1 << 20)),
            metadata=MetadataConfig(etcd_endpoint=etcd_endpoint, prefix=meta_prefix),
            uploader=UploaderConfig(interval_seconds=1, max_object_mb=1),
            cloud=cloud_config,
        ),
        ingest=IngestConfig(lease_ttl_s=3, metrics_port=free_port()),
        uploader=UploaderServiceConfig(lease_ttl_s=3, metrics_port=free_port()),
        cloud_reader=CloudReaderConfig(lease_ttl_s=3, metrics_port=free_port()),
        dispatcher=DispatcherConfig(lease_ttl_s=3, metrics_port=free_port()),
    )


async def _produce(bus: Bus, count: int) -> None:
    client = IngestClient(bus)
    for first in range(0, count, 1000):
        records = [
            encode_record(Record(payload=b"m%06d" % n, publish_time_ms=1, producer="t"))
            for n in range(first, min(first + 1000, count))
        ]
        await client.produce(TOPIC, records, timeout_s=10)


async def _uploaded_through(store: MetaStore, target: int) -> None:
    key = meta_keys.uploader_checkpoint_key(TOPIC)
    async with asyncio.timeout(120):
        while True:
            checkpoint = await store.get_model(key, UploaderCheckpoint)
            if checkpoint is not None and checkpoint.uploaded_through >= target:
                return
            await asyncio.sleep(0.2)


async def _drop_wal_below(bus: Bus, offset: int) -> int:
    """Ask ingest to drop whole segments below ``offset``; where the WAL starts now."""
    reply = await bus.request(
        bus.subjects.wal_drop_below(TOPIC), ingest_protocol.encode_offset(offset), timeout_s=10
    )
    _, start = ingest_protocol.decode_drop_reply(reply.body)
    return start


def _served_from_objects() -> float:
    return REGISTRY.get_sample_value("danube_cloud_reader_messages_total") or 0.0


@pytest.mark.parametrize("messages", MESSAGES)
async def test_earliest_reads_objects_then_the_wal_in_order_without_duplicates(
    bus: Bus, store: MetaStore, settings: DanubeSettings, messages: int
) -> None:
    wal = settings.wal_cloud.wal.model_copy(
        update={"rotation": RotationConfig(max_bytes=messages * ROTATION_BYTES_PER_MESSAGE)}
    )
    settings = settings.model_copy(
        update={"wal_cloud": settings.wal_cloud.model_copy(update={"wal": wal})}
    )
    await store.put_model(meta_keys.topic_key(TOPIC), TopicConfig(created_ms=1))
    async with (
        run_in_process(ingest_app.serve, settings, "ingest-c"),
        run_in_process(uploader_app.serve, settings, "uploader-c"),
        run_in_process(cloud_reader_app.serve, settings, "cloud-c"),
    ):
        await _produce(bus, messages)
        await _uploaded_through(store, messages // 2)
        wal_start = await _drop_wal_below(bus, messages // 2)
        assert 0 < wal_start <= messages // 2  # the early segments are gone from the WAL
        assert (await IngestClient(bus).fetch(TOPIC, 0)).below_wal_start
        from_objects = _served_from_objects()
        async with run_in_process(dispatcher_app.serve, settings, "disp-c"):
            client = DispatcherClient(bus)
            consumer = await client.attach(TOPIC, "s", "c", type="exclusive", start="earliest")
            offsets: list[int] = []
            started = time.perf_counter()
            async with asyncio.timeout(120):
                while len(offsets) < messages:
                    got = await client.poll(TOPIC, "s", consumer, max=1000, wait_ms=1000)
                    for message in got:
                        offsets.append(message.offset)
                        payload = decode_record(message.record).payload
                        assert payload == b"m%06d" % message.offset
                    if got:
                        await client.ack(
                            TOPIC, "s", consumer, [(m.partition, m.offset) for m in got]
                        )
            elapsed_s = time.perf_counter() - started
            assert await client.poll(TOPIC, "s", consumer, wait_ms=300) == []
    assert offsets == list(range(messages))
    assert _served_from_objects() - from_objects >= wal_start  # the early part came from objects
    print(f"earliest over objects + WAL: {messages / elapsed_s:,.0f} msg/s through the dispatcher")


async def test_a_time_older_than_the_wal_is_found_in_the_objects(
    bus: Bus, store: MetaStore, settings: DanubeSettings
) -> None:
    await store.put_model(meta_keys.topic_key(TOPIC), TopicConfig(created_ms=1))
    count = 40_000  # ~1.6 MB: two objects of at most 1 MiB, and WAL segments of 1 MiB
    base_ms = 1_000
    client = IngestClient(bus)
    async with (
        run_in_process(ingest_app.serve, settings, "ingest-t"),
        run_in_process(uploader_app.serve, settings, "uploader-t"),
        run_in_process(cloud_reader_app.serve, settings, "cloud-t"),
    ):
        for first in range(0, count, 1000):  # message n is published at base_ms + n
            records = [
                encode_record(
                    Record(payload=b"m%06d" % n, publish_time_ms=base_ms + n, producer="t")
                )
                for n in range(first, first + 1000)
            ]
            await client.produce(TOPIC, records, timeout_s=10)
        await _uploaded_through(store, count - 1)
        wal_start = await _drop_wal_below(bus, count)  # the sealed segments go
        assert wal_start > 0
        kvs = await store.range(meta_keys.object_descriptors_prefix(TOPIC))
        descriptors = [ObjectDescriptor.from_bytes(kv.value) for kv in kvs]
        assert len(descriptors) >= 2
        for d in descriptors:  # the uploader records each object's publish times
            assert (d.publish_ms_min, d.publish_ms_max) == (
                base_ms + d.first_offset,
                base_ms + d.last_offset,
            )

        cloud = CloudClient(bus)
        assert await cloud.offset_for_time(TOPIC, 0) == 0
        second = descriptors[1].first_offset + 7
        assert await cloud.offset_for_time(TOPIC, base_ms + second) == second
        assert await cloud.offset_for_time(TOPIC, base_ms + count) is None  # past every object
        # A descriptor written before publish times existed is scanned instead of skipped.
        stored = orjson.loads(kvs[0].value)
        del stored["p"]
        await store.put(kvs[0].key, orjson.dumps(stored))
        assert await cloud.offset_for_time(TOPIC, base_ms + 123) == 123
        assert await cloud.offset_for_time(TOPIC, base_ms + second) == second

        # The dispatcher asks ingest (the WAL start) then the cloud tier (lower: taken).
        async with run_in_process(dispatcher_app.serve, settings, "disp-t"):
            dispatcher = DispatcherClient(bus)
            consumer = await dispatcher.attach(TOPIC, "s", "c", start={"timestamp_ms": base_ms + 5})
            got = await dispatcher.poll(TOPIC, "s", consumer, max=3, wait_ms=5000)
            assert [m.offset for m in got] == [5, 6, 7]
            assert await dispatcher.seek(TOPIC, "s", {"timestamp_ms": 1}) == {TOPIC.topic: 0}
            in_wal = wal_start + 10
            assert await dispatcher.seek(TOPIC, "s", {"timestamp_ms": base_ms + in_wal}) == {
                TOPIC.topic: in_wal
            }


async def test_a_flipped_byte_is_never_served_and_named_with_where_the_object_resumes(
    bus: Bus, store: MetaStore, settings: DanubeSettings
) -> None:
    await store.put_model(meta_keys.topic_key(TOPIC), TopicConfig(created_ms=1))
    objects = ObjectStore.from_config(settings.wal_cloud.cloud)
    async with (
        run_in_process(ingest_app.serve, settings, "ingest-f"),
        run_in_process(uploader_app.serve, settings, "uploader-f"),
        run_in_process(cloud_reader_app.serve, settings, "cloud-f"),
    ):
        await _produce(bus, 40_000)  # ~1.6 MB: two objects of at most 1 MiB
        await _uploaded_through(store, 39_999)
        kvs = await store.range(meta_keys.object_descriptors_prefix(TOPIC))
        descriptor = ObjectDescriptor.from_bytes(kvs[0].value)
        body = bytearray(await objects.read(descriptor.key))
        middle = len(body) // 2
        frames, _ = decode_frames(bytes(body))
        position = 0
        for frame in frames:  # the frame the flipped byte falls in, and where it starts
            if position + frame.size_bytes > middle:
                hit, hit_at = frame.offset, position
                break
            position += frame.size_bytes
        body[hit_at + 16 + 1] ^= 0x01  # a payload byte (after the 16-byte header)
        await objects.write(descriptor.key, bytes(body))
        cloud = CloudClient(bus)
        first = await cloud.fetch(TOPIC, 0, max_count=10)
        assert [f.offset for f in first.frames] == list(range(10))  # before the flip: fine
        # The good frames before it are served; a read from it serves none and says where
        # the object's intact frames resume (its next sparse-index entry), naming the object.
        before = await cloud.fetch(TOPIC, hit - 3, max_count=1000)
        assert [f.offset for f in before.frames] == [hit - 3, hit - 2, hit - 1]
        assert before.damaged is None
        damaged = await cloud.fetch(TOPIC, hit, max_count=1000)
        assert damaged.frames == []
        assert damaged.damaged is not None
        resume = next(e.offset for e in descriptor.index if e.position > hit_at)
        assert (damaged.damaged.from_offset, damaged.damaged.to_offset) == (hit, resume)
        assert damaged.damaged.file == descriptor.key
        resumed = await cloud.fetch(TOPIC, resume, max_count=5)
        assert [f.offset for f in resumed.frames] == list(range(resume, resume + 5))
        # The objects after it are unaffected.
        after = await cloud.fetch(TOPIC, descriptor.last_offset + 1, max_count=5)
        assert [f.offset for f in after.frames] == list(
            range(descriptor.last_offset + 1, descriptor.last_offset + 6)
        )


async def test_a_fetch_serves_the_objects_frames_unchanged_with_one_crc_each(
    bus: Bus, store: MetaStore, settings: DanubeSettings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The reply carries the frames as they lie in the object, header and CRC included, for
    whole objects and sub-ranges alike; the cloud reader computes one CRC per frame (its check
    of the object), none to frame them again."""
    objects = ObjectStore.from_config(settings.wal_cloud.cloud)
    body, builder = bytearray(), SparseIndexBuilder()
    for offset in range(1000, 1300):
        position = len(body)
        append_frame(body, offset, bytes([offset % 251]) * 200)
        builder.add(offset, position, len(body) - position)
    key = object_key("danube-data", TOPIC.namespace, TOPIC.topic, 1000, 1299)
    await objects.write(key, bytes(body))
    descriptor = ObjectDescriptor.from_builder(key, builder, created_ms=1)
    await store.put(meta_keys.object_descriptor_key(TOPIC, 1000), descriptor.to_bytes())
    calls = [0]

    def counted(data: Any, value: int = 0) -> int:
        calls[0] += len(data) >= 200  # over a payload, not a 12-byte header prefix
        return crc32c(data, value)

    async with run_in_process(cloud_reader_app.serve, settings, "cloud-u"):
        cloud = CloudClient(bus)
        for _ in range(100):  # until the reader answers (its queue group subscribed)
            try:
                await cloud.fetch(TOPIC, 1299, max_count=1)
                break
            except NoRespondersError:
                await asyncio.sleep(0.05)
        monkeypatch.setattr(codec, "crc32c", counted)
        whole = await cloud.fetch(TOPIC, 0, max_count=1000)
        assert calls[0] == 300
        part = await cloud.fetch(TOPIC, 1150, max_count=20)
    assert (whole.in_cloud, whole.next_offset) == (True, 1300)
    assert b"".join(bytes(f.data) for f in whole.frames) == bytes(body)
    assert [f.offset for f in part.frames] == list(range(1150, 1170))
    assert part.next_offset == 1170
    frame_bytes = len(body) // 300
    assert b"".join(bytes(f.data) for f in part.frames) == bytes(
        body[150 * frame_bytes : 170 * frame_bytes]
    )


async def test_deleting_a_topic_deletes_its_descriptors_checkpoint_and_objects(
    bus: Bus, store: MetaStore, settings: DanubeSettings
) -> None:
    settings = settings.model_copy(
        update={"discovery": DiscoveryConfig(port=free_port(), grpc_port=0, lease_ttl_s=3)}
    )
    await store.put_model(meta_keys.topic_key(TOPIC), TopicConfig(created_ms=1))
    objects = ObjectStore.from_config(settings.wal_cloud.cloud)
    prefix = topic_prefix(settings.wal_cloud.uploader.root_prefix, "default", TOPIC.topic)
    async with (
        run_in_process(ingest_app.serve, settings, "ingest-d"),
        run_in_process(uploader_app.serve, settings, "uploader-d"),
        run_in_process(discovery_app.serve, settings, "discovery-d"),
    ):
        await _produce(bus, 30_000)
        await _uploaded_through(store, 29_999)
        assert len(await objects.list(prefix)) >= 2
        url = f"http://127.0.0.1:{settings.discovery.port}/v1/topics/default/{TOPIC.topic}"
        async with httpx.AsyncClient(timeout=30) as http:
            response = await http.delete(url)
        assert response.status_code == 204, response.text
    assert await store.range(meta_keys.storage_prefix(TOPIC)) == []
    assert await objects.list(prefix) == []

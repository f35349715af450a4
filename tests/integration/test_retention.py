"""The retention service on real NATS, etcd, an in-process ingest and fs/S3 object storage: WAL
segments go only when uploaded and past the WAL policy; objects past the topic's cloud retention
go descriptor first, fenced on the descriptor and on the leader's term."""

from __future__ import annotations

import asyncio
import os
import time
import urllib.error
import urllib.request
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
from prometheus_client import REGISTRY

from danube.bus import Bus, TopicName
from danube.cloud_reader import app as cloud_reader_app
from danube.config import (
    BusConfig,
    CloudConfig,
    CloudReaderConfig,
    DanubeSettings,
    FsCloud,
    IngestConfig,
    MetadataConfig,
    RetentionServiceConfig,
    RotationConfig,
    UploaderConfig,
    UploaderServiceConfig,
    WalCloudConfig,
    WalConfig,
    WalRetentionConfig,
)
from danube.frame import Record, append_frame, encode_record
from danube.ingest import app as ingest_app
from danube.meta import DeposedError, Election, MetaStore
from danube.meta import keys as meta_keys
from danube.meta.records import RetentionPolicy, TopicConfig, UploaderCheckpoint
from danube.retention import app as retention_app
from danube.retention.cloud import CloudRetention, Fence
from danube.runtime.service import run_in_process
from danube.storage import ObjectDescriptor, ObjectStore, SparseIndexBuilder, object_key
from danube.up import free_port
from danube.uploader import app as uploader_app
from danube.wire.cloud.client import CloudClient
from danube.wire.ingest.client import IngestClient, WalListing

pytestmark = pytest.mark.integration

MiB = 1024 * 1024
ROOT_PREFIX = "/danube-data"
HOUR_MS = 3_600_000
PASSES = "danube_retention_runs_total"


def _settings(
    nats_url: str,
    etcd: str,
    prefix: str,
    tmp_path: Path,
    *,
    wal_retention: WalRetentionConfig | None = None,
    cloud: CloudConfig | None = None,
) -> DanubeSettings:
    return DanubeSettings(
        bus=BusConfig(servers=[nats_url]),
        wal_cloud=WalCloudConfig(
            wal=WalConfig(
                dir=tmp_path / "wal",
                rotation=RotationConfig(max_bytes=4096),  # a few messages per segment
                retention=wal_retention or WalRetentionConfig(time_minutes=60),
            ),
            cloud=cloud or FsCloud(backend="fs", root=str(tmp_path / "objects")),
            metadata=MetadataConfig(etcd_endpoint=etcd, prefix=prefix),
        ),
        ingest=IngestConfig(lease_ttl_s=3, metrics_port=free_port()),
        retention=RetentionServiceConfig(
            lease_ttl_s=3, metrics_port=free_port(), check_interval_s=0.2
        ),
    )


@pytest.fixture
def settings_for(
    nats_url: str, etcd_endpoint: str, meta_prefix: str, tmp_path: Path
) -> Callable[..., DanubeSettings]:
    def make(**kwargs: object) -> DanubeSettings:
        return _settings(nats_url, etcd_endpoint, meta_prefix, tmp_path, **kwargs)  # type: ignore[arg-type]

    return make


def _passes() -> float:
    return REGISTRY.get_sample_value(PASSES) or 0.0


async def _eventually(check: Callable[[], Awaitable[bool]], timeout_s: float = 10.0) -> None:
    """Wait until ``await check()`` holds, or fail."""
    async with asyncio.timeout(timeout_s):
        while not await check():  # noqa: ASYNC110  (state in other processes: no event to await)
            await asyncio.sleep(0.05)


async def _wait_passes(count: int) -> None:
    """Let the running retention service finish ``count`` more passes."""
    target = _passes() + count

    async def done() -> bool:
        return _passes() >= target

    await _eventually(done, timeout_s=20)


@asynccontextmanager
async def _running(settings: DanubeSettings, *, ingest: bool = True) -> AsyncIterator[None]:
    async with (
        run_in_process(ingest_app.serve, settings, "ingest-r", must_stop_cleanly=True)
        if ingest
        else _nothing(),
        run_in_process(retention_app.serve, settings, "retention-r", must_stop_cleanly=True),
    ):
        yield


@asynccontextmanager
async def _nothing() -> AsyncIterator[None]:
    yield


async def _create_topic(store: MetaStore, topic: TopicName, **config: object) -> None:
    value = TopicConfig(created_ms=int(time.time() * 1000), **config)
    await store.put_model(meta_keys.topic_key(topic), value)


async def _checkpoint(store: MetaStore, partition: TopicName, uploaded_through: int) -> None:
    value = UploaderCheckpoint(uploaded_through=uploaded_through, updated_ms=1)
    await store.put_model(meta_keys.uploader_checkpoint_key(partition), value)


async def _produce(bus: Bus, partition: TopicName, count: int, size: int, batch: int) -> None:
    client = IngestClient(bus)
    for start in range(0, count, batch):
        records = [
            encode_record(Record(payload=bytes([i % 251]) * size, publish_time_ms=1, producer="t"))
            for i in range(start, min(count, start + batch))
        ]
        await client.produce(partition, records, timeout_s=10)


async def _listing(bus: Bus, partition: TopicName) -> WalListing:
    return await IngestClient(bus).wal_segments(partition, max_segments=4096)


def _age(settings: DanubeSettings, partition: TopicName, first_offsets: list[int]) -> None:
    """Make the segments starting at ``first_offsets`` look written two hours ago."""
    directory = settings.wal_cloud.wal.dir / partition.namespace / partition.topic
    old_s = time.time() - 2 * 3600
    for first in first_offsets:
        os.utime(directory / f"{first:020d}.wal", (old_s, old_s))


async def _wal_start_becomes(bus: Bus, partition: TopicName, start: int) -> None:
    async def there() -> bool:
        return (await _listing(bus, partition)).start_offset == start

    await _eventually(there)


async def _assert_wal_starts_at(bus: Bus, partition: TopicName, start: int) -> None:
    client = IngestClient(bus)
    below = await client.fetch(partition, start - 1)
    assert below.below_wal_start
    assert below.wal_start == start
    served = await client.fetch(partition, start, max_count=1)
    assert not served.below_wal_start
    assert [frame.offset for frame in served.frames] == [start]


# --- WAL retention -----------------------------------------------------------------------------


async def test_wal_drops_exactly_the_segments_that_are_uploaded_and_old(
    bus: Bus, store: MetaStore, settings_for: Callable[..., DanubeSettings]
) -> None:
    settings = settings_for()
    topic = TopicName("default", "wal-age")
    await _create_topic(store, topic)
    async with _running(settings):
        await _produce(bus, topic, count=48, size=900, batch=8)
        segments = (await _listing(bus, topic)).segments
        assert len(segments) >= 8
        firsts = [segment.first_offset for segment in segments]
        # Uploaded: segments 0..3 whole and part of segment 4. Old: 0, 1, 2, 4, 5 (not 3).
        uploaded = firsts[4] + 1
        await _checkpoint(store, topic, uploaded)
        _age(settings, topic, [firsts[0], firsts[1], firsts[2], firsts[4], firsts[5]])

        # Segment 3 is uploaded but young: it stops the drop, whatever lies beyond it.
        await _wal_start_becomes(bus, topic, firsts[3])
        await _wait_passes(3)
        listing = await _listing(bus, topic)
        assert listing.start_offset == firsts[3]
        assert listing.segment_count == len(segments) - 3
        await _assert_wal_starts_at(bus, topic, firsts[3])

        # Once segment 3 is old too, it goes; segment 4 is old but not wholly uploaded: stays.
        _age(settings, topic, [firsts[3]])
        await _wal_start_becomes(bus, topic, firsts[4])
        await _wait_passes(3)
        assert (await _listing(bus, topic)).start_offset == firsts[4]
        assert firsts[4] <= uploaded + 1
        await _assert_wal_starts_at(bus, topic, firsts[4])
    dropped = REGISTRY.get_sample_value("danube_retention_wal_segments_dropped_total")
    assert dropped is not None
    assert dropped >= 4


async def test_without_a_readable_checkpoint_nothing_leaves_the_wal(
    bus: Bus, store: MetaStore, settings_for: Callable[..., DanubeSettings]
) -> None:
    settings = settings_for()
    topic = TopicName("default", "wal-nockpt")
    await _create_topic(store, topic)
    async with _running(settings):
        await _produce(bus, topic, count=24, size=900, batch=8)
        before = await _listing(bus, topic)
        _age(settings, topic, [segment.first_offset for segment in before.segments])

        await _wait_passes(3)  # no checkpoint at all
        assert _layout(await _listing(bus, topic)) == _layout(before)

        errors_before = _errors("checkpoint")
        await store.put(meta_keys.uploader_checkpoint_key(topic), b'{"uploaded_through": "x"}')
        await _wait_passes(3)  # a checkpoint that does not decode
        assert _layout(await _listing(bus, topic)) == _layout(before)
        assert _errors("checkpoint") > errors_before

        # The same WAL with a real checkpoint does lose its uploaded segments: the two above
        # kept them because of the checkpoint, not by accident.
        await _checkpoint(store, topic, before.segments[1].first_offset - 1)
        await _wal_start_becomes(bus, topic, before.segments[1].first_offset)


def _layout(listing: WalListing) -> tuple[int, int, list[tuple[int, int]]]:
    """WAL start, bytes and ``(first offset, size)`` of each segment."""
    segments = [(segment.first_offset, segment.size_bytes) for segment in listing.segments]
    return listing.start_offset, listing.disk_bytes, segments


def _errors(stage: str) -> float:
    return REGISTRY.get_sample_value("danube_retention_errors_total", {"stage": stage}) or 0.0


async def test_wal_over_its_size_drops_oldest_uploaded_segments_until_under_it(
    bus: Bus, store: MetaStore, settings_for: Callable[..., DanubeSettings]
) -> None:
    settings = settings_for(wal_retention=WalRetentionConfig(size_mb=1))
    topic = TopicName("default", "wal-size")
    await _create_topic(store, topic)
    async with _running(settings):
        await _produce(bus, topic, count=1400, size=1000, batch=100)  # about 1.4 MiB
        listing = await _listing(bus, topic)
        assert listing.disk_bytes > MiB
        segments = listing.segments
        # Everything is young; all but the last 10 segments are uploaded.
        uploaded = segments[-10].first_offset - 1
        held, keep_from = listing.disk_bytes, 0
        while held > MiB:
            held -= segments[keep_from].size_bytes
            keep_from += 1
        assert keep_from < len(segments) - 10  # the size limit, not the upload, decides here
        await _checkpoint(store, topic, uploaded)
        await _wal_start_becomes(bus, topic, segments[keep_from].first_offset)
        await _wait_passes(3)
        after = await _listing(bus, topic)
        assert after.start_offset == segments[keep_from].first_offset
        assert after.disk_bytes <= MiB
        assert after.disk_bytes + segments[keep_from - 1].size_bytes > MiB


async def test_with_the_real_uploader_what_leaves_the_wal_is_still_read_from_objects(
    bus: Bus, store: MetaStore, settings_for: Callable[..., DanubeSettings]
) -> None:
    base = settings_for()
    settings = base.model_copy(
        update={
            "wal_cloud": base.wal_cloud.model_copy(
                update={
                    "wal": base.wal_cloud.wal.model_copy(
                        update={"rotation": RotationConfig(max_bytes=64 * 1024)}
                    ),
                    "uploader": UploaderConfig(interval_seconds=1, max_object_mb=1),
                }
            ),
            "uploader": UploaderServiceConfig(lease_ttl_s=3, metrics_port=free_port()),
            "cloud_reader": CloudReaderConfig(lease_ttl_s=3, metrics_port=free_port()),
        }
    )
    topic = TopicName("default", "wal-uploaded")
    count = 20_000
    await _create_topic(store, topic)
    async with (
        _running(settings),
        run_in_process(uploader_app.serve, settings, "uploader-r", must_stop_cleanly=True),
        run_in_process(cloud_reader_app.serve, settings, "cloud-r", must_stop_cleanly=True),
    ):
        await _produce(bus, topic, count=count, size=20, batch=1000)

        async def all_uploaded() -> bool:
            key = meta_keys.uploader_checkpoint_key(topic)
            checkpoint = await store.get_model(key, UploaderCheckpoint)
            return checkpoint is not None and checkpoint.uploaded_through == count - 1

        await _eventually(all_uploaded, timeout_s=60)
        listing = await _listing(bus, topic)
        assert listing.segment_count >= 4
        _age(settings, topic, [segment.first_offset for segment in listing.segments])
        newest = listing.segments[-1].first_offset  # the active segment stays
        await _wal_start_becomes(bus, topic, newest)
        await _assert_wal_starts_at(bus, topic, newest)

        # Every offset below the WAL start comes back from the objects, in order, once.
        cloud, offsets, position = CloudClient(bus), [], 0
        while position < newest:
            reply = await cloud.fetch(topic, position, max_count=5000)
            assert reply.in_cloud
            offsets += [frame.offset for frame in reply.frames]
            position = reply.next_offset
        assert offsets[:newest] == list(range(newest))


# --- cloud retention ---------------------------------------------------------------------------


async def _put_object(
    objects: ObjectStore,
    store: MetaStore,
    partition: TopicName,
    first: int,
    *,
    count: int,
    payload_bytes: int,
    created_ms: int,
) -> ObjectDescriptor:
    """An object of ``count`` frames and its descriptor, as the uploader writes them."""
    data = bytearray()
    builder = SparseIndexBuilder()
    for offset in range(first, first + count):
        position = len(data)
        append_frame(data, offset, bytes([offset % 251]) * payload_bytes)
        builder.add(offset, position, len(data) - position)
    key = object_key(ROOT_PREFIX, partition.namespace, partition.topic, first, first + count - 1)
    await objects.write(key, bytes(data))
    descriptor = ObjectDescriptor.from_builder(key, builder, created_ms=created_ms)
    await store.put(meta_keys.object_descriptor_key(partition, first), descriptor.to_bytes())
    return descriptor


async def _descriptor_starts(store: MetaStore, partition: TopicName) -> list[int]:
    kvs = await store.range(meta_keys.object_descriptors_prefix(partition))
    return [meta_keys.parse_object_descriptor_key(kv.key)[1] for kv in kvs]


async def test_objects_past_the_topic_retention_are_deleted_by_the_service(
    store: MetaStore, settings_for: Callable[..., DanubeSettings], tmp_path: Path
) -> None:
    settings = settings_for()
    topic = TopicName("default", "cloud-age")
    await _create_topic(store, topic, partitions=2, retention=RetentionPolicy(time_minutes=60))
    objects = ObjectStore.from_config(settings.wal_cloud.cloud)
    now_ms = int(time.time() * 1000)
    old, young = now_ms - 2 * HOUR_MS, now_ms - 60_000
    # Partition 1: a young object stops the deletion; partition 0: all expired, and the
    # newest stays anyway (it marks where the tier ends; docs/retention.md).
    ages = {1: [old, old, young, old, old], 0: [old, old, old]}
    written = {
        index: [
            await _put_object(
                objects,
                store,
                topic.partition_name(index),
                i * 10,
                count=10,
                payload_bytes=100,
                created_ms=created,
            )
            for i, created in enumerate(created_list)
        ]
        for index, created_list in ages.items()
    }
    expected = {1: [20, 30, 40], 0: [20]}

    async def expired_gone() -> bool:
        starts = {i: await _descriptor_starts(store, topic.partition_name(i)) for i in ages}
        return starts == expected

    async with _running(settings, ingest=False):
        await _eventually(expired_gone)
        await _wait_passes(3)
    assert await expired_gone()
    present = {i: [await objects.exists(d.key) for d in written[i]] for i in ages}
    assert present == {1: [False, False, True, True, True], 0: [False, False, True]}
    root = tmp_path / "objects"
    assert not (root / written[1][0].key).exists()
    assert (root / written[1][2].key).exists()


class WatchedStore(ObjectStore):
    """An object store that records, at each delete, whether the descriptor was gone first,
    and can run a hook (a concurrent writer) before a delete."""

    def __init__(self, inner: ObjectStore, meta: MetaStore, partition: TopicName) -> None:
        self.__dict__.update(inner.__dict__)
        self.meta = meta
        self.partition = partition
        self.deleted: list[tuple[str, bool]] = []  # (object key, descriptor already gone)
        self.before_delete: Callable[[str], object] | None = None

    async def delete(self, key: str, *, timeout_s: float | None = None) -> None:
        start = int(key.rsplit("/", 1)[1].split("-")[0])
        descriptor = await self.meta.get(meta_keys.object_descriptor_key(self.partition, start))
        self.deleted.append((key, descriptor is None))
        if self.before_delete is not None:
            outcome = self.before_delete(key)
            if asyncio.iscoroutine(outcome):
                await outcome
        await super().delete(key, timeout_s=timeout_s)


@asynccontextmanager
async def _leading(store: MetaStore) -> AsyncIterator[Fence]:
    election = Election(store, meta_keys.RETENTION_ELECTION, "test-leader", ttl_s=5)
    async with election.leadership() as term:
        yield Fence(meta_keys.election_key(meta_keys.RETENTION_ELECTION), term.revision)


async def test_size_retention_deletes_oldest_descriptor_then_object(
    store: MetaStore, cloud_config: CloudConfig
) -> None:
    part = TopicName("default", "cloud-size")
    objects = WatchedStore(ObjectStore.from_config(cloud_config), store, part)
    now_ms = int(time.time() * 1000)
    written = [
        await _put_object(
            objects, store, part, i * 100, count=100, payload_bytes=3000, created_ms=now_ms
        )
        for i in range(5)
    ]  # about 300 KiB each
    policy = RetentionPolicy(size_mb=1)
    held = sum(descriptor.size_bytes for descriptor in written)
    expected = 0
    while held > MiB:
        held -= written[expected].size_bytes
        expected += 1
    assert expected == 2
    async with _leading(store) as fence:
        outcome = await CloudRetention(store, objects).enforce(
            part, policy, fence=fence, now_ms=now_ms
        )
    assert outcome.objects == expected
    assert outcome.size_bytes == sum(d.size_bytes for d in written[:expected])
    assert objects.deleted == [(d.key, True) for d in written[:expected]]
    assert await _descriptor_starts(store, part) == [200, 300, 400]
    present = [await objects.exists(descriptor.key) for descriptor in written]
    assert present == [False, False, True, True, True]


async def test_a_descriptor_changed_after_it_was_read_is_kept_with_everything_after_it(
    store: MetaStore, cloud_config: CloudConfig
) -> None:
    part = TopicName("default", "cloud-cas")
    objects = WatchedStore(ObjectStore.from_config(cloud_config), store, part)
    now_ms = int(time.time() * 1000)
    old = now_ms - 2 * HOUR_MS
    written = [
        await _put_object(objects, store, part, i * 10, count=10, payload_bytes=50, created_ms=old)
        for i in range(4)
    ]
    second_key = meta_keys.object_descriptor_key(part, 10)

    async def rewrite_second(_: str) -> None:  # another writer touches descriptor 2 meanwhile
        kv = await store.get(second_key)
        assert kv is not None
        await store.put(second_key, kv.value)

    objects.before_delete = rewrite_second
    async with _leading(store) as fence:
        outcome = await CloudRetention(store, objects).enforce(
            part, RetentionPolicy(time_minutes=60), fence=fence, now_ms=now_ms
        )
    assert outcome.objects == 1
    assert objects.deleted == [(written[0].key, True)]
    assert await _descriptor_starts(store, part) == [10, 20, 30]
    present = [await objects.exists(descriptor.key) for descriptor in written]
    assert present == [False, True, True, True]


async def test_a_deposed_leader_deletes_nothing(store: MetaStore, tmp_path: Path) -> None:
    part = TopicName("default", "cloud-deposed")
    objects = ObjectStore.from_config(FsCloud(backend="fs", root=str(tmp_path / "objects")))
    now_ms = int(time.time() * 1000)
    old = now_ms - 2 * HOUR_MS
    for i in range(3):
        await _put_object(objects, store, part, i * 10, count=10, payload_bytes=50, created_ms=old)
    async with _leading(store) as fence:
        stale = Fence(fence.election_key, fence.revision - 1)  # an earlier term's token
        with pytest.raises(DeposedError):
            await CloudRetention(store, objects).enforce(
                part, RetentionPolicy(time_minutes=60), fence=stale, now_ms=now_ms
            )
    assert await _descriptor_starts(store, part) == [0, 10, 20]


async def test_overlapping_descriptors_stop_the_deletion_before_them(
    store: MetaStore, tmp_path: Path
) -> None:
    part = TopicName("default", "cloud-overlap")
    objects = ObjectStore.from_config(FsCloud(backend="fs", root=str(tmp_path / "objects")))
    old = int(time.time() * 1000) - 2 * HOUR_MS
    for first in (0, 10, 15, 30):  # 10..19 and 15..24 overlap: an uploader bug, say
        await _put_object(objects, store, part, first, count=10, payload_bytes=50, created_ms=old)
    errors_before = _errors("descriptor")
    async with _leading(store) as fence:
        outcome = await CloudRetention(store, objects).enforce(
            part, RetentionPolicy(time_minutes=60), fence=fence, now_ms=old + 2 * HOUR_MS
        )
    assert outcome.objects == 1
    assert await _descriptor_starts(store, part) == [10, 15, 30]
    assert _errors("descriptor") == errors_before + 1


async def test_non_reliable_topics_and_topics_without_policy_keep_their_objects(
    store: MetaStore, settings_for: Callable[..., DanubeSettings]
) -> None:
    settings = settings_for()
    objects = ObjectStore.from_config(settings.wal_cloud.cloud)
    old = int(time.time() * 1000) - 2 * HOUR_MS
    keep = [TopicName("default", "fast"), TopicName("default", "forever")]
    await _create_topic(
        store, keep[0], dispatch="non_reliable", retention=RetentionPolicy(time_minutes=1)
    )
    await _create_topic(store, keep[1])  # no cloud retention: kept forever
    for topic in keep:
        for i in range(3):
            await _put_object(
                objects, store, topic, i * 10, count=10, payload_bytes=50, created_ms=old
            )
    async with _running(settings, ingest=False):
        await _wait_passes(3)
    for topic in keep:
        assert await _descriptor_starts(store, topic) == [0, 10, 20]


def _http_get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return int(response.status), str(response.read().decode())
    except urllib.error.HTTPError as exc:
        return int(exc.code), ""


async def test_one_leader_at_a_time_and_the_next_takes_over_when_it_leaves(
    store: MetaStore, settings_for: Callable[..., DanubeSettings]
) -> None:
    first, second = settings_for(), settings_for()
    election_key = meta_keys.election_key(meta_keys.RETENTION_ELECTION)

    async def leader_is(node_id: str) -> bool:
        kv = await store.get(election_key)
        return kv is not None and kv.value == node_id.encode()

    a = run_in_process(retention_app.serve, first, "retention-a", must_stop_cleanly=True)
    await a.__aenter__()
    a_running = True
    try:
        await _eventually(lambda: leader_is("retention-a"))
        async with run_in_process(
            retention_app.serve, second, "retention-b", must_stop_cleanly=True
        ):
            await _wait_passes(3)
            assert await leader_is("retention-a")  # b campaigns, but a keeps leading
            port = first.retention.metrics_port
            status, body = await asyncio.to_thread(_http_get, f"http://127.0.0.1:{port}/metrics")
            assert status == 200
            assert PASSES in body
            ready, _ = await asyncio.to_thread(_http_get, f"http://127.0.0.1:{port}/readyz")
            assert ready == 200

            a_running = False
            await a.__aexit__(None, None, None)  # a stops and resigns: b leads at once
            await _eventually(lambda: leader_is("retention-b"), timeout_s=5)
            await _wait_passes(2)
    finally:
        if a_running:
            await a.__aexit__(None, None, None)

"""Queue retention (``policies.retention_mode: "queue"``, docs/retention.md) on a real mesh
(nats-server, etcd, fs objects; discovery, ingest, dispatcher, uploader, cloud_reader and
retention in-process): a topic's WAL and cloud bytes fall as its two subscriptions ack, only as
far as the slower one has acked, down to the active segment and no object once both acked all;
what went is counted exactly; a later ``earliest`` subscription reads only what is left; a
queue topic without subscriptions keeps everything; the ack floor read from stored cursors."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client import REGISTRY

from danube.bus import Bus, TopicName
from danube.client import AsyncDanubeClient, Policies
from danube.client.admin import Dropped
from danube.cloud_reader import app as cloud_reader_app
from danube.config import (
    BusConfig,
    CloudReaderConfig,
    DanubeSettings,
    DiscoveryConfig,
    DispatcherConfig,
    FsCloud,
    IngestConfig,
    MetadataConfig,
    MetricsConfig,
    RetentionServiceConfig,
    RotationConfig,
    UploaderConfig,
    UploaderServiceConfig,
    WalCloudConfig,
    WalConfig,
)
from danube.discovery import app as discovery_app
from danube.dispatcher import app as dispatcher_app
from danube.ingest import app as ingest_app
from danube.meta import MetaStore
from danube.meta import keys as meta_keys
from danube.meta.records import SubscriptionConfig, SubscriptionCursor, UploaderCheckpoint
from danube.retention import app as retention_app
from danube.retention.floors import ack_floor
from danube.runtime.service import run_in_process
from danube.storage import ObjectDescriptor
from danube.up import free_port
from danube.uploader import app as uploader_app
from danube.wire.ingest.client import IngestClient
from tests.readiness import until_ready

pytestmark = pytest.mark.integration

NS = "default"
BATCHES, BATCH = 4, 500  # one object per batch: the uploader runs between batches
COUNT = BATCHES * BATCH
PAYLOAD = "x" * 200
WAIT_S = 20.0
PASSES = "danube_retention_runs_total"
FLOOR = 1100  # the slower subscription acks below this first


def _settings(nats_url: str, etcd: str, prefix: str, tmp_path: Path) -> DanubeSettings:
    return DanubeSettings(
        bus=BusConfig(servers=[nats_url]),
        wal_cloud=WalCloudConfig(
            # Small segments: the WAL falls segment by segment. The WAL limits (48 h, 20 GiB)
            # and the topic's cloud limits (none) never take anything here: only acks do.
            wal=WalConfig(dir=tmp_path / "wal", rotation=RotationConfig(max_bytes=16 * 1024)),
            uploader=UploaderConfig(interval_seconds=1, max_object_mb=1),
            cloud=FsCloud(backend="fs", root=str(tmp_path / "objects")),
            metadata=MetadataConfig(etcd_endpoint=etcd, prefix=prefix),
        ),
        ingest=IngestConfig(lease_ttl_s=3, metrics_port=free_port()),
        dispatcher=DispatcherConfig(
            lease_ttl_s=3,
            metrics_port=free_port(),
            cursor_flush_interval_s=0.1,
            ack_timeout_s=60.0,
            max_unacked_per_consumer=COUNT,
        ),
        discovery=DiscoveryConfig(
            port=free_port(), grpc_port=0, lease_ttl_s=3, topic_cache_ttl_s=0.0
        ),
        uploader=UploaderServiceConfig(lease_ttl_s=3, metrics_port=free_port()),
        cloud_reader=CloudReaderConfig(lease_ttl_s=3, metrics_port=free_port()),
        retention=RetentionServiceConfig(
            lease_ttl_s=3, metrics_port=free_port(), check_interval_s=0.2
        ),
        # Room for every topic other tests of this process labelled before (the per-topic
        # gauges read below exist only for topics under the cap).
        metrics=MetricsConfig(topics_max=100_000),
    )


@asynccontextmanager
async def _mesh(settings: DanubeSettings) -> AsyncIterator[httpx.AsyncClient]:
    base_url = f"http://127.0.0.1:{settings.discovery.port}"
    async with (
        run_in_process(ingest_app.serve, settings, "ingest-q", must_stop_cleanly=True),
        run_in_process(dispatcher_app.serve, settings, "disp-q", must_stop_cleanly=True),
        run_in_process(uploader_app.serve, settings, "upl-q", must_stop_cleanly=True),
        run_in_process(cloud_reader_app.serve, settings, "cloud-q", must_stop_cleanly=True),
        run_in_process(retention_app.serve, settings, "ret-q", must_stop_cleanly=True),
        run_in_process(discovery_app.serve, settings, "disc-q", must_stop_cleanly=True) as task,
        httpx.AsyncClient(base_url=base_url, timeout=30) as client,
    ):
        await until_ready(client, task)
        yield client


async def _eventually(check: Callable[[], Awaitable[bool]], what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not await check():  # state in other processes: no event to await
        assert time.monotonic() < deadline, what
        await asyncio.sleep(0.1)


async def _passes(count: int) -> None:
    """Let the retention leader complete ``count`` more passes (each starts after now)."""
    target = (REGISTRY.get_sample_value(PASSES) or 0.0) + count + 1

    async def done() -> bool:
        return (REGISTRY.get_sample_value(PASSES) or 0.0) >= target

    await _eventually(done, f"{count} retention passes")


@dataclass(frozen=True)
class Tiers:
    """A partition's WAL and cloud tier as they are now."""

    wal_start: int
    wal_bytes: int
    wal_segments: int
    objects: list[tuple[int, int, int]]  # (first, last, size)

    @property
    def cloud_bytes(self) -> int:
        return sum(size for _, _, size in self.objects)


async def _tiers(bus: Bus, store: MetaStore, topic: TopicName) -> Tiers:
    listing = await IngestClient(bus).wal_segments(topic, max_segments=4096)
    kvs = await store.range(meta_keys.object_descriptors_prefix(topic))
    descriptors = [ObjectDescriptor.from_bytes(kv.value) for kv in kvs]
    return Tiers(
        listing.start_offset,
        listing.disk_bytes,
        listing.segment_count,
        [(d.first_offset, d.last_offset, d.size_bytes) for d in descriptors],
    )


async def _uploaded(store: MetaStore, topic: TopicName, through: int) -> None:
    async def there() -> bool:
        key = meta_keys.uploader_checkpoint_key(topic)
        checkpoint = await store.get_model(key, UploaderCheckpoint)
        return checkpoint is not None and checkpoint.uploaded_through >= through

    await _eventually(there, f"{topic} uploaded through {through}")


async def _produce(http: httpx.AsyncClient, topic: str, store: MetaStore) -> None:
    """COUNT messages in BATCHES, each uploaded before the next (so one object each)."""
    for batch in range(BATCHES):
        body = {"messages": [{"payload": PAYLOAD} for _ in range(BATCH)]}
        answer = await http.post(f"/v1/topics/{NS}/{topic}/messages", json=body)
        assert answer.status_code == 200, answer.text
        await _uploaded(store, TopicName(NS, topic), (batch + 1) * BATCH - 1)


async def _attach(http: httpx.AsyncClient, topic: str, sub: str) -> str:
    answer = await http.post(
        f"/v1/topics/{NS}/{topic}/subscriptions/{sub}/consumers",
        json={"name": f"{sub}-c", "type": "shared", "start": "earliest"},
    )
    assert answer.status_code == 201, answer.text
    consumer: str = answer.json()["consumer_id"]
    return consumer


async def _receive(http: httpx.AsyncClient, consumer: str, count: int) -> list[dict[str, Any]]:
    got: list[dict[str, Any]] = []
    deadline = time.monotonic() + WAIT_S
    while len(got) < count:
        assert time.monotonic() < deadline, f"{len(got)} of {count} messages received"
        answer = await http.get(
            f"/v1/consumers/{consumer}/messages", params={"max": 1000, "wait_ms": 500}
        )
        assert answer.status_code == 200, answer.text
        got += answer.json()["messages"]
    return got


async def _ack(http: httpx.AsyncClient, consumer: str, messages: list[dict[str, Any]]) -> None:
    body = {"messages": [{"partition": m["partition"], "offset": m["offset"]} for m in messages]}
    answer = await http.post(f"/v1/consumers/{consumer}/ack", json=body)
    assert answer.status_code == 204, answer.text


def _covers(objects: list[tuple[int, int, int]], first: int, last: int) -> bool:
    """Whether ``objects`` hold exactly the offsets ``first..last``, one run, no overlap."""
    expected = first
    for start, end, _ in objects:
        if start != expected:
            return False
        expected = end + 1
    return expected == last + 1


def _gauges(topic: str) -> tuple[float | None, float | None]:
    """The retention leader's ``danube_topic_wal_bytes`` and ``danube_topic_cloud_bytes``."""
    labels = {"topic": f"/{NS}/{topic}"}
    return (
        REGISTRY.get_sample_value("danube_topic_wal_bytes", labels),
        REGISTRY.get_sample_value("danube_topic_cloud_bytes", labels),
    )


def _dropped(topic: str, tier: str, reason: str, unit: str = "messages") -> float:
    labels = {"topic": f"/{NS}/{topic}", "tier": tier, "reason": reason}
    name = f"danube_topic_retention_dropped_{unit}_total"
    return REGISTRY.get_sample_value(name, labels) or 0.0


async def test_wal_and_cloud_bytes_fall_as_far_as_the_slowest_subscription_acked(
    nats_url: str, etcd_endpoint: str, meta_prefix: str, tmp_path: Path, bus: Bus, store: MetaStore
) -> None:
    settings = _settings(nats_url, etcd_endpoint, meta_prefix, tmp_path)
    topic, idle = "queue", "queue-unread"
    name, idle_name = TopicName(NS, topic), TopicName(NS, idle)
    async with _mesh(settings) as http:
        queue = {"policies": {"retention_mode": "queue"}}
        created = await http.put(f"/v1/topics/{NS}/{topic}", json=queue)
        assert created.status_code == 201, created.text
        assert created.json()["config"]["policies"]["retention_mode"] == "queue"
        # The other through the SDK's PATCH, as any policy.
        assert (await http.put(f"/v1/topics/{NS}/{idle}")).status_code == 201
        async with AsyncDanubeClient(str(http.base_url)) as client:
            patched = await client.admin.update_topic_policies(
                f"/{NS}/{idle}", Policies(retention_mode="queue")
            )
        assert patched.config.policies.retention_mode == "queue"
        fast, slow = await _attach(http, topic, "fast"), await _attach(http, topic, "slow")
        await _produce(http, topic, store)
        await _produce(http, idle, store)  # queue retention, but no subscription at all
        fast_got = await _receive(http, fast, COUNT)
        slow_got = await _receive(http, slow, COUNT)
        assert sorted(m["offset"] for m in slow_got) == list(range(COUNT))

        # Nothing acked yet: nothing goes, however many passes run.
        await _passes(3)
        full = await _tiers(bus, store, name)
        assert full.wal_start == 0
        assert _gauges(topic) == (full.wal_bytes, full.cloud_bytes)
        # The uploader ran between batches: objects never straddle two (usually one each).
        assert _covers(full.objects, 0, COUNT - 1)
        assert {BATCH * b for b in range(BATCHES)} <= {first for first, _, _ in full.objects}
        print(
            f"\nall unacked: WAL {full.wal_bytes} B in {full.wal_segments} segments, "
            f"cloud {full.cloud_bytes} B in {len(full.objects)} objects"
        )

        # fast acks everything, slow the first FLOOR offsets: the floor is FLOOR.
        await _ack(http, fast, fast_got)
        by_offset = sorted(slow_got, key=lambda m: int(m["offset"]))
        await _ack(http, slow, by_offset[:FLOOR])

        # Exactly the objects wholly below the floor go; the one holding FLOOR stays whole.
        below = [o for o in full.objects if o[1] < FLOOR]
        above = [o for o in full.objects if o[1] >= FLOOR]
        assert below
        assert above
        assert above[0][0] <= FLOOR <= above[0][1]  # partly acked: kept whole

        async def acked_objects_gone() -> bool:
            return (await _tiers(bus, store, name)).objects == above

        await _eventually(acked_objects_gone, f"the objects below offset {FLOOR} deleted")
        await _passes(3)
        half = await _tiers(bus, store, name)
        assert half.objects == above
        assert half.cloud_bytes == full.cloud_bytes - sum(o[2] for o in below)
        # The WAL starts at the segment holding FLOOR: everything before it went, no more.
        assert 0 < half.wal_start <= FLOOR
        assert half.wal_bytes < full.wal_bytes
        held = await IngestClient(bus).wal_segments(name, max_segments=4096)
        assert held.segments[0].next_offset is not None
        assert held.segments[0].next_offset > FLOOR
        print(
            f"slow acked {FLOOR}: WAL {half.wal_bytes} B from {half.wal_start}, "
            f"cloud {half.cloud_bytes} B in {len(half.objects)} objects"
        )
        assert _gauges(topic) == (half.wal_bytes, half.cloud_bytes)
        assert _dropped(topic, "cloud", "acked") == sum(
            last - first + 1 for first, last, _ in below
        )
        assert _dropped(topic, "wal", "acked") == half.wal_start
        assert _dropped(topic, "cloud", "limits") == _dropped(topic, "wal", "limits") == 0

        # slow acks the rest: no object is left, the WAL keeps only its active segment.
        await _ack(http, slow, by_offset[FLOOR:])

        async def all_gone() -> bool:
            tiers = await _tiers(bus, store, name)
            return not tiers.objects and tiers.wal_segments == 1

        await _eventually(all_gone, "every object and every sealed segment gone")
        await _passes(3)
        empty = await _tiers(bus, store, name)
        assert empty.objects == []
        assert empty.wal_segments == 1
        assert empty.wal_bytes <= settings.wal_cloud.wal.rotation.max_bytes
        print(
            f"all acked: WAL {empty.wal_bytes} B (the active segment, from "
            f"{empty.wal_start}), cloud {empty.cloud_bytes} B"
        )
        assert _gauges(topic) == (empty.wal_bytes, 0)
        assert _dropped(topic, "cloud", "acked") == COUNT
        assert _dropped(topic, "cloud", "acked", "bytes") == full.cloud_bytes
        assert _dropped(topic, "wal", "acked") == empty.wal_start

        # The same counts in etcd, shown by describe: exact for the cloud tier.
        async with AsyncDanubeClient(str(http.base_url)) as client:
            described = await client.admin.describe_topic(f"/{NS}/{topic}")
        dropped = described.partitions[0].offsets.retention_dropped
        assert dropped is not None
        assert dropped.cloud_acked == Dropped(messages=COUNT, size_bytes=full.cloud_bytes)
        wal_gone = full.wal_bytes - empty.wal_bytes
        assert dropped.wal_acked == Dropped(messages=empty.wal_start, size_bytes=wal_gone)
        assert dropped.cloud_limits == dropped.wal_limits == Dropped()

        # A subscription created now from earliest reads only what is left, in order.
        late = await _attach(http, topic, "late")
        left = await _receive(http, late, COUNT - empty.wal_start)
        assert [m["offset"] for m in left] == list(range(empty.wal_start, COUNT))
        extra = await http.get(f"/v1/consumers/{late}/messages", params={"wait_ms": 300})
        assert extra.json()["messages"] == []

        # Uploads go on into the emptied tier; what nobody acked yet stays.
        more = {"messages": [{"payload": PAYLOAD} for _ in range(BATCH)]}
        assert (await http.post(f"/v1/topics/{NS}/{topic}/messages", json=more)).status_code == 200
        await _uploaded(store, name, COUNT + BATCH - 1)
        await _passes(3)
        assert _covers((await _tiers(bus, store, name)).objects, COUNT, COUNT + BATCH - 1)

        # The queue topic nobody subscribed to kept everything (only the limits apply).
        unread = await _tiers(bus, store, idle_name)
        assert unread.wal_start == 0
        assert _covers(unread.objects, 0, COUNT - 1)
        assert _dropped(idle, "cloud", "acked") == _dropped(idle, "wal", "acked") == 0


async def test_the_ack_floor_is_the_lowest_cursor_of_every_subscription_of_the_partition(
    store: MetaStore,
) -> None:
    topic = TopicName(NS, "floors")
    p0, p1 = topic.partition_name(0), topic.partition_name(1)
    config = SubscriptionConfig(type="shared", created_ms=1)

    async def subscribe(scope: TopicName, sub: str, **cursors: int) -> None:
        await store.put_model(meta_keys.subscription_key(scope, sub), config)
        for partition, offset in cursors.items():
            key = meta_keys.subscription_cursor_key(scope, sub, TopicName(NS, partition))
            await store.put_model(key, SubscriptionCursor(next_offset=offset, updated_ms=1))

    assert await ack_floor(store, p0) is None  # no subscription: no floor, limits only
    await subscribe(topic, "whole", **{p0.topic: 500, p1.topic: 40})
    assert (await ack_floor(store, p0), await ack_floor(store, p1)) == (500, 40)
    # A subscription of partition 0 alone (Danube's clients) holds partition 0 only.
    await subscribe(p0, "mine", **{p0.topic: 300})
    assert (await ack_floor(store, p0), await ack_floor(store, p1)) == (300, 40)
    # One that has no cursor yet holds everything until it stores one.
    await subscribe(topic, "new")
    assert (await ack_floor(store, p0), await ack_floor(store, p1)) == (0, 0)
    await subscribe(topic, "new", **{p0.topic: 700, p1.topic: 900})
    assert (await ack_floor(store, p0), await ack_floor(store, p1)) == (300, 40)
    # A cursor that does not decode holds everything too (and is counted).
    errors = REGISTRY.get_sample_value("danube_retention_errors_total", {"stage": "cursor"}) or 0
    await store.put(meta_keys.subscription_cursor_key(topic, "new", p1), b"{not json")
    assert await ack_floor(store, p1) == 0
    after = REGISTRY.get_sample_value("danube_retention_errors_total", {"stage": "cursor"})
    assert after == errors + 1
    # A deleted subscription (its whole prefix) holds nothing any more.
    await store.delete_prefix(meta_keys.subscription_prefix(topic, "new"))
    await store.delete_prefix(meta_keys.subscription_prefix(topic, "whole"))
    assert (await ack_floor(store, p0), await ack_floor(store, p1)) == (300, None)
    # Delayed messages not delivered yet (acked in the cursor when read, read again from
    # delay_from after a restart) hold the log from delay_from.
    key = meta_keys.subscription_cursor_key(p0, "mine", p0)
    delayed = SubscriptionCursor(next_offset=300, updated_ms=1, delay_from=120, delay_due_ms=5)
    await store.put_model(key, delayed)
    assert await ack_floor(store, p0) == 120

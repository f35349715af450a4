"""The ingest node on real NATS and etcd: claim, produce, fetch, live, exact restart,
fencing on lease loss and a new epoch, and factor 1 staying unavailable (never moved)."""

from __future__ import annotations

import asyncio
import urllib.request
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path

import orjson
import pytest
from prometheus_client import REGISTRY

from danube.bus import Bus, NoRespondersError, RemoteError, TopicName
from danube.config import (
    BusConfig,
    DanubeSettings,
    IngestConfig,
    MetadataConfig,
    RotationConfig,
    WalCloudConfig,
    WalConfig,
)
from danube.frame import Record, decode_record, encode_record
from danube.ingest import app
from danube.ingest import node as ingest_node
from danube.ingest.wal import Durability, Wal, WalOptions
from danube.meta import MetaStore
from danube.meta import keys as meta_keys
from danube.meta.records import Assignment, Owner, PartitionState
from danube.up import free_port
from danube.wire.ingest import protocol
from danube.wire.ingest.client import IngestClient
from danube.wire.ingest.protocol import Damaged

pytestmark = pytest.mark.integration

P = TopicName("default", "orders-part-0")


def _settings(nats_url: str, etcd: str, prefix: str, wal_dir: Path) -> DanubeSettings:
    return DanubeSettings(
        bus=BusConfig(servers=[nats_url]),
        wal_cloud=WalCloudConfig(
            wal=WalConfig(dir=wal_dir, rotation=RotationConfig(max_bytes=4096)),
            metadata=MetadataConfig(etcd_endpoint=etcd, prefix=prefix),
        ),
        ingest=IngestConfig(lease_ttl_s=3, metrics_port=free_port()),
    )


def _records(*payloads: bytes) -> list[bytes]:
    return [encode_record(Record(payload=p, publish_time_ms=7, producer="t")) for p in payloads]


@asynccontextmanager
async def running_node(
    settings: DanubeSettings, node_id: str
) -> AsyncIterator[tuple[asyncio.Event, asyncio.Task[None]]]:
    stop = asyncio.Event()
    task = asyncio.create_task(app.serve(settings, node_id, stop))
    try:
        yield stop, task
    finally:
        stop.set()
        await asyncio.gather(task, return_exceptions=True)


@pytest.fixture
def settings_for(
    nats_url: str, etcd_endpoint: str, meta_prefix: str, tmp_path: Path
) -> Callable[[str], DanubeSettings]:
    return lambda node: _settings(nats_url, etcd_endpoint, meta_prefix, tmp_path / node)


async def _all(client: IngestClient, partition: TopicName) -> list[tuple[int, bytes]]:
    reply = await client.fetch(partition, 0, max_count=10_000)
    return [(f.offset, decode_record(f.payload).payload) for f in reply.frames]


async def test_claim_produce_fetch_live_and_stats(
    bus: Bus, settings_for: Callable[[str], DanubeSettings]
) -> None:
    client = IngestClient(bus)
    appended_before = _appended_total()
    commits_before = _sample("danube_ingest_commit_seconds_count")
    writes_before = _sample("danube_ingest_write_seconds_count")
    live = await bus.subscribe(bus.subjects.live(P))
    settings = settings_for("a")
    async with running_node(settings, "node-a"):
        first = await client.produce(P, _records(b"one", b"two"), timeout_s=10)
        second = await client.produce(P, _records(b"three"), timeout_s=10)
        assert (first, second) == (0, 2)
        assert await _all(client, P) == [(0, b"one"), (1, b"two"), (2, b"three")]
        from_one = await client.fetch(P, 1, max_count=1)
        assert [f.offset for f in from_one.frames] == [1]
        assert from_one.next_offset == 2
        # A reliable partition's live subject wakes readers up (durable_next), no payloads.
        wakeups: list[protocol.Wakeup] = []
        async with asyncio.timeout(5):
            while not wakeups or wakeups[-1].next_offset < 3:
                message = await live.next(timeout_s=5)
                wakeup = protocol.Wakeup.decode(message.body)
                assert wakeup is not None, message.body
                wakeups.append(wakeup)
        assert [w.next_offset for w in wakeups] == sorted({w.next_offset for w in wakeups})
        assert sum(w.count for w in wakeups) == 3
        assert sum(w.payload_bytes for w in wakeups) == sum(
            map(len, _records(b"one", b"two", b"three"))
        )
        stats = orjson.loads((await bus.request(bus.subjects.wal_stats(P), b"")).body)
        assert stats["epoch"] == 1
        assert stats["partition"] == str(P)
        assert stats["wal"]["next_offset"] == 3
        port = settings.ingest.metrics_port
        text = await asyncio.to_thread(_http_get, f"http://127.0.0.1:{port}/metrics")
        # The registry is per process: other in-process tests may have appended before.
        assert _appended_total() - appended_before == 3
        assert "danube_ingest_appended_messages_total" in text
        assert "danube_ingest_fsync_seconds_count" in text
        # Per hop: each produce's commit timed once; at least one WAL write under them.
        assert _sample("danube_ingest_commit_seconds_count") == commits_before + 2
        assert _sample("danube_ingest_write_seconds_count") > writes_before
    await live.unsubscribe()


async def test_a_claim_answers_once_its_leader_serves_not_at_its_next_poll(
    bus: Bus, settings_for: Callable[[str], DanubeSettings], monkeypatch: pytest.MonkeyPatch
) -> None:
    # The first produce to a partition pays its claim: the answer is woken by the replica
    # starting to lead, not by the next poll of etcd (here an hour away), and comes only
    # once the leader's handlers serve, so the requester's retry at once finds them.
    monkeypatch.setattr(ingest_node, "_CLAIM_POLL_S", 3600.0)
    async with running_node(settings_for("a"), "node-a"):
        async with asyncio.timeout(10):
            while True:
                try:
                    answer = await bus.request(bus.subjects.ownership(P), b"", timeout_s=10)
                    break
                except NoRespondersError:  # the node is not serving claims yet
                    await asyncio.sleep(0.05)
            assert orjson.loads(answer.body) == {"leader": "node-a", "epoch": 1}
            body = protocol.encode_produce_request(_records(b"first"))
            reply = await bus.request(bus.subjects.produce(P), body, timeout_s=5)
            assert protocol.decode_produce_reply(reply.body)[:2] == (0, 1)


async def test_bad_produce_body_is_refused_and_nothing_is_written(
    bus: Bus, settings_for: Callable[[str], DanubeSettings]
) -> None:
    client = IngestClient(bus)
    async with running_node(settings_for("a"), "node-a"):
        await client.produce(P, _records(b"ok"), timeout_s=10)
        with pytest.raises(RemoteError) as info:
            await bus.request(bus.subjects.produce(P), b"\x01\x00\x00\x00\x05\x00\x00\x00ab")
        assert info.value.code == "bad_request"
        garbage = b"\x01\x00\x00\x00\x03\x00\x00\x00abc"  # not a record
        with pytest.raises(RemoteError):
            await bus.request(bus.subjects.produce(P), garbage)
        assert await _all(client, P) == [(0, b"ok")]


async def test_restart_resumes_exactly_after_the_last_offset(
    bus: Bus, settings_for: Callable[[str], DanubeSettings]
) -> None:
    client = IngestClient(bus)
    settings = settings_for("a")
    async with running_node(settings, "node-a"):
        assert await client.produce(P, _records(*[b"x"] * 10), timeout_s=10) == 0
    async with running_node(settings, "node-a"):
        assert await client.produce(P, _records(b"y"), timeout_s=10) == 10
        assert [o for o, _ in await _all(client, P)] == list(range(11))


async def test_factor_1_is_unavailable_without_its_replica_and_resumes_at_the_same_offsets(
    bus: Bus, store: MetaStore, settings_for: Callable[[str], DanubeSettings]
) -> None:
    """The only replica's lease revoked (as etcd expires it in an outage): it serves on and
    takes its owner key back under a new lease, same epoch; stopped, another node never takes
    the partition over with an empty log: produce answers partition_unavailable naming it;
    the replica back, offsets continue where they were (no gap)."""
    client = IngestClient(bus)
    async with running_node(settings_for("a"), "node-a") as (stop_a, task_a):
        assert await client.produce(P, _records(b"a1", b"a2"), timeout_s=10) == 0
        async with running_node(settings_for("b"), "node-b") as (_, task_b):
            # Claim requests (the queue group picks A or B) never move it.
            for _ in range(6):
                reply = await bus.request(bus.subjects.ownership(P), b"", timeout_s=5)
                assert orjson.loads(reply.body)["leader"] == "node-a"
            assignment = await store.get_model(meta_keys.partition_assignment_key(P), Assignment)
            assert assignment is not None
            assert assignment.replicas == ("node-a",)

            owner_key = meta_keys.partition_owner_key(P)
            before = await store.get(owner_key)
            assert before is not None
            await store.revoke_lease(before.lease_id)  # the owner key goes with it
            assert await client.produce(P, _records(b"a3"), timeout_s=10) == 2
            async with asyncio.timeout(10):
                while True:  # written again under the node's new lease
                    after = await store.get(owner_key)
                    if after is not None:
                        break
                    await asyncio.sleep(0.05)
            assert after.lease_id != before.lease_id
            was, now = (Owner.model_validate_json(kv.value) for kv in (before, after))
            assert (now.node_id, now.epoch) == (was.node_id, was.epoch)  # no failover
            assert not task_a.done()

            stop_a.set()  # a factor-1 leader stops: no other node may take it over
            await asyncio.wait_for(task_a, 30)
            with pytest.raises(RemoteError) as refused:
                await client.produce(P, _records(b"b1"), timeout_s=5)
            assert refused.value.code == "partition_unavailable"
            assert str(P) in refused.value.message
            assert not task_b.done()
    async with running_node(settings_for("a"), "node-a"):
        assert await client.produce(P, _records(b"a4"), timeout_s=10) == 3
        assert [o for o, _ in await _all(client, P)] == [0, 1, 2, 3]
        state = await store.get_model(meta_keys.partition_state_key(P), PartitionState)
        assert state is not None
        assert (state.leader, state.isr) == ("node-a", ("node-a",))
        assert state.leader_epoch >= 2


async def test_an_owner_key_moved_elsewhere_fences_the_partition_at_once(
    bus: Bus, store: MetaStore, settings_for: Callable[[str], DanubeSettings]
) -> None:
    client = IngestClient(bus)
    async with running_node(settings_for("a"), "node-a") as (_, task_a):
        assert await client.produce(P, _records(b"a"), timeout_s=10) == 0
        # What the controller does when it moves a partition: a new owner, a higher epoch.
        moved = Owner(node_id="node-x", epoch=2, assigned_ms=1)
        await store.put_model(meta_keys.partition_owner_key(P), moved)
        async with asyncio.timeout(5):
            while True:  # A stops answering the partition's subjects
                try:
                    await bus.request(bus.subjects.produce(P), b"", timeout_s=1)
                except NoRespondersError:
                    break
                except RemoteError:
                    pass
                await asyncio.sleep(0.05)
        assert not task_a.done()  # the node itself keeps running
    assert await _all_from_disk(settings_for("a")) == [(0, b"a")]


async def _all_from_disk(settings: DanubeSettings) -> list[tuple[int, bytes]]:
    wal = await Wal.open(
        settings.wal_cloud.wal.dir / P.namespace / P.topic,
        WalOptions.from_config(settings.wal_cloud.wal, Durability.FSYNC),
    )
    try:
        result = await wal.fetch(0, max_bytes=1 << 20, max_count=100)
        return [(o, decode_record(p).payload) for o, p in result.messages]
    finally:
        await wal.close()


async def test_a_flipped_bit_in_a_sealed_segment_is_answered_damaged_naming_segment_and_range(
    bus: Bus, settings_for: Callable[[str], DanubeSettings]
) -> None:
    client = IngestClient(bus)
    settings = settings_for("a")
    async with running_node(settings, "node-a"):
        for index in range(40):
            await client.produce(P, _records(b"%03d" % index + b"x" * 200), timeout_s=10)
    segments = sorted((settings.wal_cloud.wal.dir / P.namespace / P.topic).glob("*.wal"))
    assert len(segments) > 2
    first = segments[0]
    data = bytearray(first.read_bytes())
    data[len(data) // 2] ^= 0x01
    first.write_bytes(bytes(data))
    async with running_node(settings, "node-a"):
        await client.produce(P, _records(b"after"), timeout_s=10)  # the node serves again
        # Good messages before the damage are served; the first read at the damaged frame
        # answers DAMAGED, up to the next segment, naming the file: never wrong data.
        served: list[int] = []
        damaged = await _read_until_damaged(client, served)
        assert served == list(range(len(served)))
        assert len(served) < int(segments[1].stem)
        assert damaged.from_offset == len(served)
        assert damaged.to_offset == int(segments[1].stem)
        assert damaged.file == first.name
        # Segments after the damaged one are still served, exactly.
        later = int(segments[1].stem)
        reply = await client.fetch(P, later, max_count=1)
        assert [f.offset for f in reply.frames] == [later]


async def _read_until_damaged(client: IngestClient, served: list[int]) -> Damaged:
    offset = 0
    while True:
        reply = await client.fetch(P, offset, max_count=1000)
        if reply.damaged is not None:
            return reply.damaged
        served.extend(f.offset for f in reply.frames)
        offset = reply.next_offset


def _appended_total() -> float:
    return REGISTRY.get_sample_value("danube_ingest_appended_messages_total") or 0.0


def _sample(name: str) -> float:
    return REGISTRY.get_sample_value(name) or 0.0


def _http_get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=5) as response:
        return str(response.read().decode())


async def test_drop_below_removes_whole_segments_and_fetch_then_says_below_wal_start(
    bus: Bus, settings_for: Callable[[str], DanubeSettings]
) -> None:
    client = IngestClient(bus)
    async with running_node(settings_for("a"), "node-a"):
        for index in range(40):
            await client.produce(P, _records(b"%03d" % index + b"y" * 200), timeout_s=10)
        reply = await bus.request(bus.subjects.wal_drop_below(P), protocol.encode_offset(20))
        removed, wal_start = protocol.decode_drop_reply(reply.body)
        assert removed >= 1
        assert 0 < wal_start <= 20
        below = await client.fetch(P, 0)
        assert below.below_wal_start
        assert below.wal_start == wal_start
        assert below.frames == []
        kept = await client.fetch(P, wal_start, max_count=1000)
        assert [f.offset for f in kept.frames] == list(range(wal_start, 40))


async def test_offset_for_time_over_rotated_segments_and_after_a_drop(
    bus: Bus, settings_for: Callable[[str], DanubeSettings]
) -> None:
    client = IngestClient(bus)

    def at(time_ms: int, index: int) -> bytes:
        record = Record(payload=b"%03d" % index + b"t" * 200, publish_time_ms=time_ms, producer="t")
        return encode_record(record)

    settings = settings_for("a")
    async with running_node(settings, "node-a"):
        with pytest.raises(NoRespondersError):
            await client.offset_for_time(P, 0)  # nothing owns it yet
        # Offset i is published at 1000 + 10 * i: 40 records over many 4 KiB segments.
        for index in range(40):
            await client.produce(P, [at(1000 + 10 * index, index)], timeout_s=10)
        segments = sorted((settings.wal_cloud.wal.dir / P.namespace / P.topic).glob("*.wal"))
        assert len(segments) > 2
        assert await client.offset_for_time(P, 0) == 0
        assert await client.offset_for_time(P, 1000) == 0
        assert await client.offset_for_time(P, 1001) == 1
        assert await client.offset_for_time(P, 1250) == 25
        assert await client.offset_for_time(P, 1255) == 26
        for segment in segments[1:]:  # a segment's first record, and the one before it
            first = int(segment.stem)
            assert await client.offset_for_time(P, 1000 + 10 * first) == first
            assert await client.offset_for_time(P, 1000 + 10 * first - 5) == first
        assert await client.offset_for_time(P, 1390) == 39
        assert await client.offset_for_time(P, 1391) == 40  # past the end: the next offset
        reply = await bus.request(bus.subjects.wal_drop_below(P), protocol.encode_offset(20))
        _, wal_start = protocol.decode_drop_reply(reply.body)
        assert wal_start > 0
        # Older than the WAL start: the WAL start (the cloud tier will refine this).
        assert await client.offset_for_time(P, 1000) == wal_start
        assert await client.offset_for_time(P, 1300) == 30

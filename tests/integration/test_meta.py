"""danube.meta against a real etcd: keys, CAS under contention, leases, watches, elections."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator, Awaitable, Callable

import aetcd
import pytest

from danube.config.wal_cloud import MetadataConfig
from danube.meta import (
    Election,
    LeaseLostError,
    MetaDecodeError,
    MetaStore,
    MetaUnavailableError,
    TopicName,
    UpdateRacedError,
    WatchCompactedError,
    WatchEvent,
    keys,
)
from danube.meta.records import Owner, TopicConfig

pytestmark = pytest.mark.integration

CONTENDERS = 20


def _config(endpoint: str, prefix: str) -> MetadataConfig:
    return MetadataConfig(etcd_endpoint=endpoint, prefix=prefix, request_timeout_s=3.0)


@pytest.fixture
async def connect(
    etcd_endpoint: str, meta_prefix: str
) -> AsyncIterator[Callable[..., Awaitable[MetaStore]]]:
    """Open stores (default: under the test's prefix); clean up and close them after."""
    opened: list[MetaStore] = []

    async def open_store(prefix: str = meta_prefix) -> MetaStore:
        store = await MetaStore.connect(_config(etcd_endpoint, prefix))
        opened.append(store)
        return store

    yield open_store
    for store in opened:
        await store.delete_prefix("")
        await store.close()


@pytest.fixture
async def store(connect: Callable[..., Awaitable[MetaStore]]) -> MetaStore:
    return await connect()


async def _until(condition: Callable[[], Awaitable[bool]], timeout_s: float) -> None:
    """Poll ``condition`` until it holds; fail the test after ``timeout_s``."""
    async with asyncio.timeout(timeout_s):
        while True:
            if await condition():
                return
            await asyncio.sleep(0.1)


# --- keys ----------------------------------------------------------------------------


async def test_put_get_range_delete_round_trip(store: MetaStore) -> None:
    rev_a1 = await store.put("a/1", b"one")
    rev_a2 = await store.put("a/2", b"two")
    await store.put("a0", b"sibling")  # shares the text "a" but not the prefix "a/"
    assert rev_a2 > rev_a1

    a1 = await store.get("a/1")
    assert a1 is not None
    assert (a1.key, a1.value, a1.create_revision, a1.mod_revision, a1.version, a1.lease_id) == (
        "a/1", b"one", rev_a1, rev_a1, 1, 0,
    )  # fmt: skip
    rev_a1b = await store.put("a/1", b"uno")
    a1b = await store.get("a/1")
    assert a1b is not None
    assert (a1b.value, a1b.create_revision, a1b.mod_revision, a1b.version) == (
        b"uno", rev_a1, rev_a1b, 2,
    )  # fmt: skip
    assert await store.get("a/3") is None

    assert [(kv.key, kv.value) for kv in await store.range("a/")] == [
        ("a/1", b"uno"),
        ("a/2", b"two"),
    ]
    assert [kv.key for kv in await store.range("")] == ["a/1", "a/2", "a0"]
    assert [kv.key for kv in await store.range("a/", limit=1)] == ["a/1"]

    assert await store.delete("a/1") is True
    assert await store.delete("a/1") is False
    assert await store.delete_prefix("a/") == 1
    assert [kv.key for kv in await store.range("")] == ["a0"]


async def test_prefixes_isolate_stores_sharing_one_etcd(
    connect: Callable[..., Awaitable[MetaStore]], meta_prefix: str
) -> None:
    mine = await connect()
    other = await connect(meta_prefix + "-other")
    await mine.put("topics/default/t", b"mine")
    await other.put("topics/default/t", b"other")
    assert mine.prefix == meta_prefix + "/"

    mine_kv, other_kv = await mine.get("topics/default/t"), await other.get("topics/default/t")
    assert mine_kv is not None
    assert other_kv is not None
    assert (mine_kv.value, other_kv.value) == (b"mine", b"other")
    assert await mine.delete_prefix("") == 1
    assert await mine.range("") == []
    assert [kv.value for kv in await other.range("")] == [b"other"]


async def test_long_ranges_are_paged_into_one_consistent_sorted_snapshot(store: MetaStore) -> None:
    topic = TopicName("default", "big")
    count = 2_500  # several pages of RANGE_PAGE_KEYS
    for first in range(0, count, 100):
        txn = store.txn()
        for offset in range(first, first + 100):
            txn.then_put(keys.object_descriptor_key(topic, offset * 10), str(offset).encode())
        assert (await txn.commit()).succeeded

    result = await store.snapshot(keys.object_descriptors_prefix(topic))
    assert len(result.kvs) == count
    assert not result.more
    starts = [keys.parse_object_descriptor_key(kv.key)[1] for kv in result.kvs]
    assert starts == [offset * 10 for offset in range(count)]  # sorted by offset, not by text
    assert result.revision == max(kv.mod_revision for kv in result.kvs)

    page = await store.snapshot(keys.object_descriptors_prefix(topic), limit=10)
    assert page.more
    assert len(page.kvs) == 10
    after = keys.object_descriptor_key(topic, 95)  # pages resume at any key
    rest = await store.snapshot(keys.object_descriptors_prefix(topic), limit=3, start_key=after)
    assert [keys.parse_object_descriptor_key(kv.key)[1] for kv in rest.kvs] == [100, 110, 120]


async def test_model_helpers_round_trip_and_refuse_bad_values(store: MetaStore) -> None:
    topic = TopicName("default", "orders")
    config = TopicConfig(partitions=4, created_ms=1_700_000_000_000)
    revision = await store.put_model(keys.topic_key(topic), config)
    assert await store.get_model(keys.topic_key(topic), TopicConfig) == config
    found = await store.get_model_kv(keys.topic_key(topic), TopicConfig)
    assert found is not None
    assert found[0] == config
    assert found[1].mod_revision == revision
    assert await store.get_model(keys.topic_key(TopicName("default", "none")), TopicConfig) is None

    owner_key = keys.partition_owner_key(topic.partition_name(0))
    owner = Owner(node_id="ingest-1", epoch=1, assigned_ms=5)
    assert await store.create_model(owner_key, owner) is True
    assert await store.create_model(owner_key, owner.model_copy(update={"epoch": 2})) is False
    assert await store.range_models(keys.partitions_prefix("default"), Owner) == [
        (owner_key, owner)
    ]

    await store.put(owner_key, b'{"node_id": "ingest-1"}')
    with pytest.raises(MetaDecodeError) as info:
        await store.get_model(owner_key, Owner)
    assert info.value.key == owner_key


async def test_an_unreachable_etcd_is_a_retriable_error() -> None:
    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    with pytest.raises(MetaUnavailableError) as info:
        await MetaStore.connect(_config(f"127.0.0.1:{port}", "/unreachable"))
    assert info.value.retriable
    assert info.value.code == "meta_unavailable"


# --- transactions ----------------------------------------------------------------------


async def test_compare_and_swap_succeeds_exactly_once_under_contention(store: MetaStore) -> None:
    revision = await store.put("owner", b"nobody")

    async def contend(i: int) -> bool:
        return await store.compare_and_swap(
            "owner", f"node-{i}".encode(), expected_mod_revision=revision
        )

    won = await asyncio.gather(*(contend(i) for i in range(CONTENDERS)))
    assert won.count(True) == 1
    current = await store.get("owner")
    assert current is not None
    assert current.value == f"node-{won.index(True)}".encode()
    assert current.version == 2


async def test_update_model_retries_lost_races_and_counts_its_tries(store: MetaStore) -> None:
    await store.put_model("t", TopicConfig(partitions=1, created_ms=1))

    def grow(config: TopicConfig) -> TopicConfig:
        return config.model_copy(update={"partitions": config.partitions + 1})

    # Each round of the race has a winner: as many tries as contenders lets every one land.
    updates = [store.update_model("t", TopicConfig, grow, tries=10) for _ in range(10)]
    results = await asyncio.gather(*updates)
    assert sorted(after.partitions for _, after in (r for r in results if r)) == list(range(2, 12))
    # One try each: whoever lost its race is told so, and wrote nothing.
    outcomes = await asyncio.gather(
        *(store.update_model("t", TopicConfig, grow, tries=1) for _ in range(10)),
        return_exceptions=True,
    )
    landed = [o for o in outcomes if isinstance(o, tuple)]
    assert all(isinstance(o, UpdateRacedError) for o in outcomes if not isinstance(o, tuple))
    final = await store.get_model("t", TopicConfig)
    assert final is not None
    assert final.partitions == 11 + len(landed)
    # No change writes nothing; a missing key is None.
    kv = await store.get("t")
    assert kv is not None
    assert await store.update_model("t", TopicConfig, lambda c: c, tries=1) == (final, final)
    after = await store.get("t")
    assert after is not None
    assert after.mod_revision == kv.mod_revision
    assert await store.update_model("absent", TopicConfig, grow, tries=3) is None


async def test_create_succeeds_exactly_once_under_contention(store: MetaStore) -> None:
    async def contend(i: int) -> bool:
        return await store.create("elections/x", f"c{i}".encode())

    created = await asyncio.gather(*(contend(i) for i in range(CONTENDERS)))
    assert created.count(True) == 1
    current = await store.get("elections/x")
    assert current is not None
    assert current.value == f"c{created.index(True)}".encode()


async def test_compare_and_delete_and_the_else_branch(store: MetaStore) -> None:
    revision = await store.put("k", b"v1")
    assert await store.compare_and_delete("k", expected_mod_revision=revision - 1) is False
    assert await store.compare_and_delete("k", expected_mod_revision=revision) is True
    assert await store.get("k") is None

    await store.put("k", b"v2")
    result = await (
        store.txn().if_value("k", "==", b"v1").then_put("k", b"v3").else_get("k").commit()
    )
    assert not result.succeeded
    seen = result.first_kv()
    assert seen is not None
    assert (seen.key, seen.value) == ("k", b"v2")
    assert result.revision >= seen.mod_revision


# --- leases ----------------------------------------------------------------------------


async def test_lease_expiry_removes_its_key(store: MetaStore) -> None:
    lease = await store.grant_lease(1)  # etcd raises it to its minimum (2 s here)
    await store.put("nodes/ingest/n1", b"{}", lease=lease)
    kv = await store.get("nodes/ingest/n1")
    assert kv is not None
    assert kv.lease_id == lease.id

    await lease.stop_keepalive()

    async def gone() -> bool:
        return await store.get("nodes/ingest/n1") is None

    await _until(gone, timeout_s=lease.ttl_s + 5)
    await asyncio.wait_for(lease.lost.wait(), lease.ttl_s + 1)
    with pytest.raises(LeaseLostError):
        await store.put("nodes/ingest/n1", b"{}", lease=lease)


async def test_keepalive_keeps_a_key_past_several_ttls(store: MetaStore) -> None:
    lease = await store.grant_lease(1)
    await store.put("nodes/ingest/n2", b"{}", lease=lease)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 2.5 * lease.ttl_s
    while loop.time() < deadline:
        assert await store.get("nodes/ingest/n2") is not None
        await asyncio.sleep(0.25)
    assert lease.alive
    assert lease.refreshes >= 5
    assert await lease.revoke() is True
    assert await store.get("nodes/ingest/n2") is None


async def test_a_lease_revoked_elsewhere_is_refused_by_etcd_and_then_lost(
    store: MetaStore,
) -> None:
    async with store.lease(5) as lease:
        assert await store.revoke_lease(lease.id) is True
        assert await store.revoke_lease(lease.id) is False
        with pytest.raises(LeaseLostError) as info:
            await store.put("k", b"v", lease=lease)  # not yet known locally: etcd refuses
        assert info.value.lease_id == lease.id
        await asyncio.wait_for(lease.lost.wait(), lease.ttl_s)  # the next refresh finds out


# --- watches ---------------------------------------------------------------------------


async def test_a_watch_sees_puts_and_deletes_under_its_prefix_only(
    connect: Callable[..., Awaitable[MetaStore]], meta_prefix: str
) -> None:
    store = await connect()
    neighbour = await connect(meta_prefix + "-n")
    async with store.watch_prefix("nodes/") as events:
        await neighbour.put("nodes/ingest/x", b"not mine")
        await store.put("topics/default/t", b"not under nodes/")
        put_rev = await store.put("nodes/ingest/n1", b"up")
        await store.delete("nodes/ingest/n1")
        got = [await asyncio.wait_for(anext(events), 5) for _ in range(2)]
    assert got[0] == WatchEvent("put", "nodes/ingest/n1", b"up", put_rev, put_rev, 0)
    assert (got[1].kind, got[1].key, got[1].value) == ("delete", "nodes/ingest/n1", b"")
    assert got[1].mod_revision == put_rev + 1


async def test_a_watch_from_a_revision_replays_history(store: MetaStore) -> None:
    revisions = [await store.put("cursor", str(i).encode()) for i in range(3)]
    async with store.watch_key("cursor", start_revision=revisions[0]) as events:
        got = [await asyncio.wait_for(anext(events), 5) for _ in range(3)]
    assert [(e.value, e.mod_revision) for e in got] == [
        (b"0", revisions[0]), (b"1", revisions[1]), (b"2", revisions[2]),
    ]  # fmt: skip


async def test_a_watch_from_a_compacted_revision_raises_a_typed_error(
    store: MetaStore, etcd_endpoint: str
) -> None:
    first = await store.put("k", b"1")
    last = await store.put("k", b"2")
    host, _, port = etcd_endpoint.rpartition(":")
    async with aetcd.Client(host, int(port)) as raw:
        await raw.compact(last)
    async with store.watch_key("k", start_revision=first) as events:
        with pytest.raises(WatchCompactedError) as info:
            await asyncio.wait_for(anext(events), 5)
    assert info.value.compact_revision == last
    assert info.value.resume_revision == first


# --- elections ---------------------------------------------------------------------------


async def test_leadership_moves_when_the_leaders_lease_is_revoked(
    connect: Callable[..., Awaitable[MetaStore]],
) -> None:
    first_store, second_store = await connect(), await connect()
    first = Election(first_store, "controller", "node-a", ttl_s=2)
    second = Election(second_store, "controller", "node-b", ttl_s=2)
    first_term = await asyncio.wait_for(first.campaign(), 5)
    assert first.is_leader
    assert not first.lost.is_set()
    contender = asyncio.create_task(second.campaign())
    try:
        assert await second.leader() == "node-a"
        assert not second.is_leader

        assert await first_store.revoke_lease(first_term.lease.id)  # as if node-a died
        second_term = await asyncio.wait_for(contender, 5)
    finally:
        contender.cancel()
    assert second.is_leader
    assert await first.leader() == "node-b"
    await asyncio.wait_for(first_term.lost.wait(), 5)
    assert not first.is_leader
    assert first.lost.is_set()
    assert second_term.revision > first_term.revision  # the fencing token grew

    await second.resign()
    assert second_term.lost_reason == "resigned"
    assert await first.leader() is None


async def test_leadership_block_resigns_and_the_next_candidate_takes_over(
    connect: Callable[..., Awaitable[MetaStore]],
) -> None:
    first = Election(await connect(), "retention", "node-a", ttl_s=5)
    second = Election(await connect(), "retention", "node-b", ttl_s=5)
    async with first.leadership() as term:
        assert term.active
        contender = asyncio.create_task(second.campaign())
        assert await first.leader() == "node-a"  # a round trip: the contender tried and lost
        assert not second.is_leader
    assert not term.active
    second_term = await asyncio.wait_for(contender, 5)
    assert second_term.candidate_id == "node-b"
    assert await first.leader() == "node-b"
    await second.resign()


async def test_a_cancelled_campaign_stops_at_once_and_releases_its_lease(
    connect: Callable[..., Awaitable[MetaStore]],
) -> None:
    store = await connect()
    leader = Election(store, "controller", "node-a", ttl_s=5)
    waiting = Election(store, "controller", "node-b", ttl_s=5)
    async with leader.leadership():
        contender = asyncio.create_task(waiting.campaign())

        async def contender_has_a_lease() -> bool:
            return len(await store.range("", limit=10)) == 1 and waiting.lease is not None

        await _until(contender_has_a_lease, timeout_s=5)
        lease = waiting.lease
        assert lease is not None
        contender.cancel()
        with pytest.raises(asyncio.CancelledError):
            await asyncio.wait_for(contender, 2)
        assert lease.lost_reason == "revoked"
        assert not waiting.is_leader
        assert await leader.leader() == "node-a"

"""Producer access modes on real etcd, NATS, one ingest and two discovery instances: an
exclusive producer refuses others (sessions and produces), DELETE and expiry free the topic,
keep-alives hold it, a session opened on one instance is enforced on the other, and
sessions of partitions and of their whole topic exclude each other."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from danube.config import (
    BusConfig,
    DanubeSettings,
    DiscoveryConfig,
    IngestConfig,
    MetadataConfig,
    WalCloudConfig,
    WalConfig,
)
from danube.discovery import app as discovery_app
from danube.discovery.catalog.catalog import Catalog
from danube.discovery.doors.bodies.api import TopicSpec
from danube.discovery.errors import ConflictError
from danube.discovery.produce.sessions import DiscoverySessions
from danube.ingest import app as ingest_app
from danube.meta import MetaStore, TopicName
from danube.meta import keys as meta_keys
from danube.meta.records import AccessMode
from danube.runtime.service import run_in_process
from danube.up import free_port
from tests.readiness import until_ready

pytestmark = pytest.mark.integration

# Bounds the waits on etcd's lease expiry (TTL 1 s, raised by etcd to its minimum of 2 s,
# checked by etcd every 0.5 s).
EXPIRY_WAIT_S = 10.0
T = "/v1/topics/default/orders"
ONE = {"messages": [{"payload": "x"}]}


def _settings(nats_url: str, etcd: str, prefix: str, wal_dir: Path, ttl_s: int) -> DanubeSettings:
    return DanubeSettings(
        bus=BusConfig(servers=[nats_url]),
        wal_cloud=WalCloudConfig(
            wal=WalConfig(dir=wal_dir),
            metadata=MetadataConfig(etcd_endpoint=etcd, prefix=prefix),
        ),
        ingest=IngestConfig(lease_ttl_s=3, metrics_port=free_port()),
        discovery=DiscoveryConfig(
            port=free_port(),
            grpc_port=0,  # a free port
            lease_ttl_s=3,
            topic_cache_ttl_s=0.0,
            producer_session_ttl_s=ttl_s,
        ),
    )


@dataclass
class Mesh:
    a: httpx.AsyncClient  # discovery instance 1
    b: httpx.AsyncClient  # discovery instance 2
    store: MetaStore


MeshFactory = Callable[..., AbstractAsyncContextManager[Mesh]]


@pytest.fixture
def mesh_for(nats_url: str, etcd_endpoint: str, meta_prefix: str, tmp_path: Path) -> MeshFactory:
    """``async with mesh_for(ttl_s=...) as mesh``: one ingest node and two discovery
    instances (``mesh.a``, ``mesh.b``) on one etcd prefix, plus a store on it."""

    @asynccontextmanager
    async def start(*, ttl_s: int = 15) -> AsyncIterator[Mesh]:
        one = _settings(nats_url, etcd_endpoint, meta_prefix, tmp_path / "wal", ttl_s)
        two = one.model_copy(
            update={"discovery": one.discovery.model_copy(update={"port": free_port()})}
        )
        async with (
            await MetaStore.connect(one.wal_cloud.metadata) as store,
            run_in_process(ingest_app.serve, one, "ingest-1", must_stop_cleanly=True),
            run_in_process(discovery_app.serve, one, "disc-a", must_stop_cleanly=True) as ta,
            run_in_process(discovery_app.serve, two, "disc-b", must_stop_cleanly=True) as tb,
            httpx.AsyncClient(base_url=f"http://127.0.0.1:{one.discovery.port}") as a,
            httpx.AsyncClient(base_url=f"http://127.0.0.1:{two.discovery.port}") as b,
        ):
            await until_ready(a, ta)
            await until_ready(b, tb)
            yield Mesh(a, b, store)

    return start


def _code(response: httpx.Response) -> str:
    code: str = response.json()["error"]["code"]
    return code


async def _open(http: httpx.AsyncClient, mode: str, name: str = "p") -> httpx.Response:
    return await http.post(f"{T}/producers", json={"name": name, "access_mode": mode})


async def _open_ok(http: httpx.AsyncClient, mode: str, name: str = "p") -> str:
    response = await _open(http, mode, name)
    assert response.status_code == 201, response.text
    body = response.json()
    assert body["access_mode"] == mode
    producer_id: str = body["producer_id"]
    return producer_id


async def _produce(http: httpx.AsyncClient, producer_id: str | None) -> httpx.Response:
    body: dict[str, Any] = dict(ONE)
    if producer_id is not None:
        body["producer_id"] = producer_id
    return await http.post(f"{T}/messages", json=body)


async def _until(condition: Callable[[], Awaitable[bool]], timeout_s: float) -> None:
    """Poll ``condition()`` (awaited) until true, at most ``timeout_s``."""
    async with asyncio.timeout(timeout_s):
        while True:
            if await condition():
                return
            await asyncio.sleep(0.05)


async def test_exclusive_refuses_others_until_closed(mesh_for: MeshFactory) -> None:
    async with mesh_for() as mesh:
        opened = await _open(mesh.a, "exclusive", "one")
        assert opened.status_code == 201
        assert opened.json()["session_ttl_ms"] == 15_000
        holder = opened.json()["producer_id"]
        for mode in ("exclusive", "shared"):
            refused = await _open(mesh.a, mode, "two")
            assert (refused.status_code, _code(refused)) == (409, "exclusive_producer")
        for other in (None, "0123456789abcdef"):
            fenced = await _produce(mesh.a, other)
            assert (fenced.status_code, _code(fenced)) == (409, "producer_fenced")
        produced = await _produce(mesh.a, holder)
        assert produced.status_code == 200, produced.text
        assert produced.json()["results"] == [{"partition": "/default/orders", "offset": 0}]

        listed = (await mesh.a.get(f"{T}/producers")).json()["producers"]
        assert [(p["producer_id"], p["name"], p["access_mode"]) for p in listed] == [
            (holder, "one", "exclusive")
        ]
        described = (await mesh.b.get(T)).json()["producers"]
        assert [p["producer_id"] for p in described] == [holder]
        assert (await mesh.b.post(f"{T}/producers/{holder}/keepalive")).status_code == 204
        unknown = await mesh.a.post(f"{T}/producers/0123456789abcdef/keepalive")
        assert (unknown.status_code, _code(unknown)) == (404, "producer_not_found")

        assert (await mesh.a.delete(f"{T}/producers/{holder}")).status_code == 204
        assert (
            await mesh.store.range(meta_keys.producers_prefix(TopicName("default", "orders"))) == []
        )
        gone = await mesh.a.post(f"{T}/producers/{holder}/keepalive")
        assert (gone.status_code, _code(gone)) == (404, "producer_not_found")
        assert (await mesh.a.delete(f"{T}/producers/{holder}")).status_code == 204  # idempotent

        # The next one takes it at once, and fences the first (the opener's view is updated
        # by the open itself, not by the watch).
        second = await _open_ok(mesh.a, "exclusive", "two")
        fenced = await _produce(mesh.a, holder)
        assert (fenced.status_code, _code(fenced)) == (409, "producer_fenced")
        produced = await _produce(mesh.a, second)
        assert produced.json()["results"] == [{"partition": "/default/orders", "offset": 1}]


async def test_shared_producers_refuse_an_exclusive_one(mesh_for: MeshFactory) -> None:
    async with mesh_for() as mesh:
        first = await _open_ok(mesh.a, "shared", "one")
        second = await _open_ok(mesh.b, "shared", "two")
        refused = await _open(mesh.b, "exclusive", "three")
        assert (refused.status_code, _code(refused)) == (409, "producer_exists")
        for producer_id in (None, first, second):  # shared sessions fence nobody
            assert (await _produce(mesh.a, producer_id)).status_code == 200
        assert (await mesh.a.delete(f"{T}/producers/{first}")).status_code == 204
        refused = await _open(mesh.a, "exclusive", "three")
        assert (refused.status_code, _code(refused)) == (409, "producer_exists")

        # Deleting the topic removes its sessions.
        assert (await mesh.a.delete(T)).status_code == 204
        prefix = meta_keys.producers_prefix(TopicName("default", "orders"))
        assert await mesh.store.range(prefix) == []
        gone = await mesh.b.post(f"{T}/producers/{second}/keepalive")
        assert (gone.status_code, _code(gone)) == (404, "producer_not_found")
        await _open_ok(mesh.a, "exclusive", "three")


async def test_keepalive_holds_and_expiry_frees(mesh_for: MeshFactory) -> None:
    async with mesh_for(ttl_s=1) as mesh:
        opened = (await _open(mesh.a, "exclusive", "one")).json()
        holder, ttl_s = opened["producer_id"], opened["session_ttl_ms"] / 1000
        assert 1 <= ttl_s <= 5  # etcd raises a short TTL to its minimum
        # Kept alive through the other instance for 1.5 TTLs: still held.
        loop = asyncio.get_running_loop()
        until = loop.time() + ttl_s * 1.5
        while loop.time() < until:
            assert (await mesh.b.post(f"{T}/producers/{holder}/keepalive")).status_code == 204
            await asyncio.sleep(ttl_s / 4)
        refused = await _open(mesh.b, "exclusive", "two")
        assert (refused.status_code, _code(refused)) == (409, "exclusive_producer")

        # Silent from now on: etcd drops the session after its TTL, and the next takes it.
        silent_at = loop.time()

        async def taken() -> bool:
            return (await _open(mesh.b, "exclusive", "two")).status_code == 201

        await _until(taken, EXPIRY_WAIT_S)
        assert loop.time() - silent_at >= ttl_s / 2  # not before its time
        gone = await mesh.a.post(f"{T}/producers/{holder}/keepalive")
        assert (gone.status_code, _code(gone)) == (404, "producer_not_found")


async def test_a_session_is_enforced_on_every_instance(mesh_for: MeshFactory) -> None:
    async with mesh_for() as mesh:
        holder = await _open_ok(mesh.a, "exclusive", "one")

        async def fenced_on(http: httpx.AsyncClient) -> bool:
            response = await _produce(http, None)
            if response.status_code == 200:
                return False
            assert (response.status_code, _code(response)) == (409, "producer_fenced")
            return True

        await _until(lambda: fenced_on(mesh.b), 5.0)  # b's watch saw the holder
        refused = await _open(mesh.b, "shared", "two")
        assert (refused.status_code, _code(refused)) == (409, "exclusive_producer")
        assert (await _produce(mesh.b, holder)).status_code == 200

        # Closed through b: a's watch sees it go, and a accepts anyone again.
        assert (await mesh.b.delete(f"{T}/producers/{holder}")).status_code == 204

        async def open_on(http: httpx.AsyncClient) -> bool:
            return not await fenced_on(http)

        await _until(lambda: open_on(mesh.a), 5.0)
        second = await _open_ok(mesh.b, "exclusive", "two")
        await _until(lambda: fenced_on(mesh.a), 5.0)
        assert (await _produce(mesh.a, second)).status_code == 200


async def test_prefix_compare_sees_only_its_prefix(store: MetaStore) -> None:
    """The transaction compare exclusive sessions rely on: no key under a prefix, and a
    sibling (``orders2`` for ``orders``) is not under it."""
    orders = meta_keys.producers_prefix(TopicName("default", "orders"))
    sibling = meta_keys.producer_key(TopicName("default", "orders2"), "abc")
    await store.put(sibling, b"{}")
    result = await store.txn().if_prefix_empty(orders).then_put(orders + "x", b"1").commit()
    assert result.succeeded
    result = await store.txn().if_prefix_empty(orders).then_put(orders + "y", b"2").commit()
    assert not result.succeeded
    assert [kv.key for kv in await store.range(orders)] == [orders + "x"]


async def test_partitions_and_their_topic_exclude_each_other(store: MetaStore) -> None:
    """Danube's clients hold sessions per partition (the gRPC front door), HTTP producers on
    the whole topic: one etcd prefix per topic makes each mode hold across both."""
    catalog = Catalog(store, cache_ttl_s=0.0)
    await catalog.ensure_default_namespace()
    orders = TopicName("default", "orders")
    await catalog.create_topic(orders, TopicSpec(partitions=2).stored())
    p0, p1 = orders.partitions(2)
    sessions = DiscoverySessions(store, catalog, ttl_s=15)

    async def refused(topic: TopicName, mode: AccessMode) -> str:
        with pytest.raises(ConflictError) as error:
            await sessions.open(topic, "x", access_mode=mode)
        return error.value.code

    one = await sessions.open(p1, "one", access_mode="exclusive")
    zero = await sessions.open(p0, "zero", access_mode="exclusive")  # another partition
    assert await refused(p1, "shared") == "exclusive_producer"
    assert await refused(orders, "shared") == "exclusive_producer"
    assert await refused(orders, "exclusive") == "exclusive_producer"
    await sessions.check(p1, one.producer_id)
    for topic, producer_id in ((p1, zero.producer_id), (orders, one.producer_id)):
        with pytest.raises(ConflictError):  # a whole-topic produce may reach either partition
            await sessions.check(topic, producer_id)
    listed = await sessions.list_sessions(orders)
    assert sorted((str(t), i) for t, i, _ in listed) == sorted(
        [(str(p0), zero.producer_id), (str(p1), one.producer_id)]
    )
    assert [i for _, i, _ in await sessions.list_sessions(p1)] == [one.producer_id]

    await sessions.close(p1, one.producer_id)
    await sessions.close(p0, zero.producer_id)
    whole = await sessions.open(orders, "whole", access_mode="shared")
    assert await refused(p1, "exclusive") == "producer_exists"  # the shared one reaches p1
    await sessions.close(orders, whole.producer_id)
    await sessions.open(p1, "one", access_mode="exclusive")

    # Deleting the topic removes its partitions' sessions too.
    await catalog.delete_topic(orders)
    assert await store.range(meta_keys.producers_prefix(orders)) == []

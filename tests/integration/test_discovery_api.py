"""The discovery HTTP API on real NATS and etcd with an in-process ingest node: namespaces,
topics, describe, lookup, produce round trips, key routing, auto-create, and a table of bad
inputs that must each get their 4xx and leave no trace in etcd or the WAL."""

from __future__ import annotations

import asyncio
import base64
import json
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
from prometheus_client import REGISTRY

from danube.aio import task_stacks
from danube.bus import Bus, BusError, TopicName
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
from danube.discovery.produce.producer import PLACE_TIMEOUT_S
from danube.frame import decode_record
from danube.ingest import app as ingest_app
from danube.meta import MetaStore
from danube.meta import keys as meta_keys
from danube.routing import partition_for_key
from danube.runtime.service import run_in_process
from danube.up import free_port
from danube.wire.ingest.client import IngestClient
from tests.readiness import until_ready

pytestmark = pytest.mark.integration

MAX_PAYLOAD = 64 * 1024
MAX_BODY = 256 * 1024
MAX_MESSAGES = 50
ONE = {"messages": [{"payload": "x"}]}
B64_OK = base64.b64encode(b"ok").decode()


def _settings(
    nats_url: str,
    etcd: str,
    prefix: str,
    wal_dir: Path,
    *,
    auto_create: bool = True,
    produce_timeout_s: float = 10.0,
) -> DanubeSettings:
    return DanubeSettings(
        bus=BusConfig(servers=[nats_url]),
        wal_cloud=WalCloudConfig(
            wal=WalConfig(dir=wal_dir),
            metadata=MetadataConfig(etcd_endpoint=etcd, prefix=prefix),
        ),
        ingest=IngestConfig(lease_ttl_s=3, metrics_port=free_port(), max_message_bytes=MAX_PAYLOAD),
        discovery=DiscoveryConfig(
            port=free_port(),
            grpc_port=0,
            lease_ttl_s=3,
            auto_create_topics=auto_create,
            max_body_bytes=MAX_BODY,
            max_produce_messages=MAX_MESSAGES,
            topic_cache_ttl_s=0.0,
            produce_timeout_s=produce_timeout_s,
        ),
    )


@dataclass
class Mesh:
    http: httpx.AsyncClient
    bus: Bus
    store: MetaStore
    client: IngestClient
    settings: DanubeSettings


MeshFactory = Callable[..., Any]


@pytest.fixture
def mesh_for(
    nats_url: str, etcd_endpoint: str, meta_prefix: str, tmp_path: Path
) -> Callable[..., Any]:
    """``async with mesh_for(auto_create=...) as mesh``: one ingest node (started once per
    test) and one discovery instance, both in-process, plus a test bus and store."""

    @asynccontextmanager
    async def start(
        *, auto_create: bool = True, with_ingest: bool = True, produce_timeout_s: float = 10.0
    ) -> AsyncIterator[Mesh]:
        settings = _settings(
            nats_url,
            etcd_endpoint,
            meta_prefix,
            tmp_path / "wal",
            auto_create=auto_create,
            produce_timeout_s=produce_timeout_s,
        )
        bus = await Bus.connect(BusConfig(servers=[nats_url]), name="test")
        store = await MetaStore.connect(settings.wal_cloud.metadata)
        base_url = f"http://127.0.0.1:{settings.discovery.port}"
        try:
            async with (
                _maybe_ingest(settings, with_ingest),
                run_in_process(
                    discovery_app.serve,
                    settings,
                    f"disc-{settings.discovery.port}",
                    must_stop_cleanly=True,
                ) as task,
                httpx.AsyncClient(base_url=base_url, timeout=30) as http,
            ):
                await until_ready(http, task)
                yield Mesh(http, bus, store, IngestClient(bus), settings)
        finally:
            await store.close()
            await bus.close()

    return start


@asynccontextmanager
async def _maybe_ingest(settings: DanubeSettings, enabled: bool) -> AsyncIterator[None]:
    if not enabled:
        yield
        return
    async with run_in_process(ingest_app.serve, settings, "ingest-1", must_stop_cleanly=True):
        yield


async def _fetch_all(mesh: Mesh, partition: str) -> list[tuple[int, Any]]:
    reply = await mesh.client.fetch(TopicName.parse(partition), 0, max_count=10_000)
    return [(f.offset, decode_record(f.payload)) for f in reply.frames]


def _error(response: httpx.Response) -> tuple[int, str]:
    return response.status_code, response.json()["error"]["code"]


# --- namespaces and topics -------------------------------------------------------------


async def test_namespaces_crud(mesh_for: MeshFactory) -> None:
    async with mesh_for(with_ingest=False) as mesh:
        http = mesh.http
        assert "default" in (await http.get("/v1/namespaces")).json()["namespaces"]
        assert (await http.put("/v1/namespaces/billing")).status_code == 201
        assert (await http.put("/v1/namespaces/billing")).status_code == 200  # idempotent
        other = await http.put("/v1/namespaces/billing", json={"max_topics": 5})
        assert _error(other) == (409, "namespace_exists")
        got = (await http.get("/v1/namespaces/billing")).json()
        assert (got["name"], got["max_topics"]) == ("billing", 10_000)
        assert (await http.put("/v1/topics/billing/invoices")).status_code == 201
        topics = (await http.get("/v1/namespaces/billing/topics")).json()
        assert topics == {"namespace": "billing", "topics": ["invoices"]}
        assert _error(await http.delete("/v1/namespaces/billing")) == (409, "namespace_not_empty")
        assert (await http.delete("/v1/topics/billing/invoices")).status_code == 204
        assert (await http.delete("/v1/namespaces/billing")).status_code == 204
        assert _error(await http.get("/v1/namespaces/billing")) == (404, "namespace_not_found")
        assert _error(await http.delete("/v1/namespaces/default")) == (409, "namespace_protected")
        assert _error(await http.put("/v1/topics/nope/t")) == (404, "namespace_not_found")


async def test_topic_create_idempotent_conflict_describe_lookup_delete(
    mesh_for: MeshFactory,
) -> None:
    async with mesh_for() as mesh:
        http = mesh.http
        created = await http.put("/v1/topics/default/orders", json={"partitions": 3})
        assert created.status_code == 201
        assert created.json()["config"]["partitions"] == 3
        again = await http.put("/v1/topics/default/orders", json={"partitions": 3})
        assert again.status_code == 200
        assert again.json()["config"]["created_ms"] == created.json()["config"]["created_ms"]
        conflict = await http.put("/v1/topics/default/orders", json={"partitions": 2})
        assert _error(conflict) == (409, "topic_exists")

        body = {"messages": [{"payload": f"m{i}"} for i in range(6)]}  # keyless: 2 each
        produced = await http.post("/v1/topics/default/orders/messages", json=body)
        assert produced.status_code == 200, produced.text

        lookup = (await http.get("/v1/lookup/default/orders")).json()
        names = [f"/default/orders-part-{i}" for i in range(3)]
        assert lookup["name"] == "/default/orders"
        assert lookup["dispatch"] == "reliable"
        assert [p["name"] for p in lookup["partitions"]] == names
        assert all(p["owner"]["node_id"] == "ingest-1" for p in lookup["partitions"])

        described = (await http.get("/v1/topics/default/orders")).json()
        assert described["config"]["partitions"] == 3
        assert described["subscriptions"] == []
        for partition in described["partitions"]:
            assert partition["owner"]["node_id"] == "ingest-1"
            assert partition["offsets"]["wal_start"] == 0
            assert partition["offsets"]["next_offset"] == 2
            assert partition["offsets"]["uploaded_through"] is None

        assert (await http.delete("/v1/topics/default/orders")).status_code == 204
        assert _error(await http.get("/v1/topics/default/orders")) == (404, "topic_not_found")
        assert _error(await http.get("/v1/lookup/default/orders")) == (404, "topic_not_found")
        assert await mesh.store.range("partitions/default/orders-part-") == []
        assert _error(await http.delete("/v1/topics/default/orders")) == (404, "topic_not_found")


async def test_a_created_topic_is_placed_before_its_first_produce(mesh_for: MeshFactory) -> None:
    async with mesh_for() as mesh:
        created = await mesh.http.put("/v1/topics/default/placed", json={"partitions": 3})
        assert created.status_code == 201, created.text
        # Every partition has its leader before anything was produced to it ...
        lookup = (await mesh.http.get("/v1/lookup/default/placed")).json()["partitions"]
        assert [p["name"] for p in lookup] == [f"/default/placed-part-{i}" for i in range(3)]
        assert [p["owner"]["node_id"] for p in lookup] == ["ingest-1"] * 3
        # ... and serving: a produce straight to a partition's subject needs no claim.
        for index in range(3):
            partition = TopicName.parse(f"/default/placed-part-{index}")
            reply = await mesh.bus.request(mesh.bus.subjects.wal_stats(partition), b"", timeout_s=2)
            assert orjson.loads(reply.body)["high_watermark"] == 0
        body = {"messages": [{"payload": f"m{i}"} for i in range(3)]}
        produced = await mesh.http.post("/v1/topics/default/placed/messages", json=body)
        assert sorted(r["offset"] for r in produced.json()["results"]) == [0, 0, 0]


async def test_a_topic_created_with_no_ingest_up_is_placed_by_its_first_produce(
    mesh_for: MeshFactory,
) -> None:
    async with mesh_for(with_ingest=False) as mesh:
        started = time.monotonic()
        created = await mesh.http.put("/v1/topics/default/later", json={"partitions": 2})
        assert created.status_code == 201, created.text
        # No responder answers a claim at once: the creation does not wait out its bound.
        assert time.monotonic() - started < PLACE_TIMEOUT_S
        lookup = (await mesh.http.get("/v1/lookup/default/later")).json()["partitions"]
        assert [p["owner"] for p in lookup] == [None, None]


async def test_replication_settings_per_topic_and_inherited_from_the_namespace(
    mesh_for: MeshFactory,
) -> None:
    """A namespace's replication default reaches its topics (factor 2 with one ingest node:
    produce refused with 503 not_enough_replicas, nothing written); a topic's own factor 1
    wins over it; both are shown as configured (null: inherited)."""
    async with mesh_for(produce_timeout_s=2.0) as mesh:
        http = mesh.http
        ns = await http.put(
            "/v1/namespaces/copies", json={"replication_factor": 2, "min_insync_replicas": 2}
        )
        assert ns.status_code == 201, ns.text
        assert (ns.json()["replication_factor"], ns.json()["min_insync_replicas"]) == (2, 2)
        shown = (await http.get("/v1/namespaces/copies")).json()
        assert (shown["replication_factor"], shown["min_insync_replicas"]) == (2, 2)
        other = await http.put("/v1/namespaces/copies", json={"replication_factor": 3})
        assert _error(other) == (409, "namespace_exists")

        inherits = await http.put("/v1/topics/copies/inherits")
        assert inherits.json()["config"]["replication_factor"] is None
        refused = await http.post("/v1/topics/copies/inherits/messages", json=ONE)
        assert _error(refused) == (503, "not_enough_replicas")
        assert await mesh.store.get("partitions/copies/inherits/assignment") is None

        single = await http.put("/v1/topics/copies/single", json={"replication_factor": 1})
        assert single.status_code == 201, single.text
        assert single.json()["config"]["replication_factor"] == 1
        ok = await http.post("/v1/topics/copies/single/messages", json=ONE)
        assert ok.json() == {"results": [{"partition": "/copies/single", "offset": 0}]}
        assert await mesh.store.get("partitions/copies/single/assignment") is not None
        described = (await http.get("/v1/topics/copies/single")).json()
        (partition,) = described["partitions"]
        assert partition["offsets"]["replicas"] == ["ingest-1"]
        assert partition["offsets"]["isr"] == ["ingest-1"]
        too_many = await http.put("/v1/topics/copies/many", json={"replication_factor": 8})
        assert too_many.status_code == 400


async def test_a_namespace_policy_is_updated_in_place(mesh_for: MeshFactory) -> None:
    async with mesh_for() as mesh:
        http = mesh.http
        created = await http.put("/v1/namespaces/kept", json={"max_topics": 5})
        assert created.status_code == 201
        patched = await http.patch(
            "/v1/namespaces/kept",
            json={"retention": {"time_minutes": 60}, "replication_factor": 2},
        )
        assert patched.status_code == 200, patched.text
        body = patched.json()
        assert body["max_topics"] == 5  # not given: kept
        assert body["retention"] == {"time_minutes": 60, "size_mb": None}
        assert body["replication_factor"] == 2
        assert body["created_ms"] == created.json()["created_ms"]
        assert (await http.get("/v1/namespaces/kept")).json() == body
        reset = await http.patch("/v1/namespaces/kept", json={"replication_factor": None})
        assert reset.json()["replication_factor"] is None
        assert reset.json()["retention"] == {"time_minutes": 60, "size_mb": None}
        assert _error(await http.patch("/v1/namespaces/kept", json={"max_topics": None})) == (
            400,
            "invalid_request",
        )
        assert _error(await http.patch("/v1/namespaces/ghost", json={})) == (
            404,
            "namespace_not_found",
        )


# --- produce -----------------------------------------------------------------------------


async def test_produce_utf8_and_base64_round_trip(mesh_for: MeshFactory) -> None:
    async with mesh_for() as mesh:
        raw = bytes(range(256))
        body = {
            "producer": "p-1",
            "messages": [
                {"payload": "héllo wörld", "key": "k", "attributes": {"a": "1", "b": "2"}},
                {"payload": base64.b64encode(raw).decode(), "encoding": "base64"},
                {"payload": ""},
            ],
        }
        answer = await mesh.http.post("/v1/topics/default/rt/messages", json=body)
        assert answer.status_code == 200, answer.text
        assert answer.json() == {
            "results": [{"partition": "/default/rt", "offset": i} for i in range(3)]
        }
        records = await _fetch_all(mesh, "/default/rt")
        assert [offset for offset, _ in records] == [0, 1, 2]
        first, second, third = (record for _, record in records)
        assert first.payload == "héllo wörld".encode()
        assert (first.key, dict(first.attributes), first.producer) == (
            "k",
            {"a": "1", "b": "2"},
            "p-1",
        )
        assert (second.payload, second.key, dict(second.attributes)) == (raw, None, {})
        assert third.payload == b""
        auto = (await mesh.http.get("/v1/topics/default/rt")).json()
        assert (auto["config"]["partitions"], auto["config"]["dispatch"]) == (0, "reliable")


async def test_partitioned_topic_routes_by_key_and_round_robin(mesh_for: MeshFactory) -> None:
    async with mesh_for() as mesh:
        http = mesh.http
        assert (
            await http.put("/v1/topics/default/keyed", json={"partitions": 4})
        ).status_code == 201
        keys = [f"user-{i % 10}" for i in range(40)]
        body = {"messages": [{"payload": str(i), "key": k} for i, k in enumerate(keys)]}
        results = (await http.post("/v1/topics/default/keyed/messages", json=body)).json()[
            "results"
        ]
        by_key: dict[str, set[str]] = {}
        for key, result in zip(keys, results, strict=True):
            by_key.setdefault(key, set()).add(result["partition"])
        for key, partitions in by_key.items():
            assert partitions == {f"/default/keyed-part-{partition_for_key(key, 4)}"}
        assert len({p for ps in by_key.values() for p in ps}) >= 2  # keys spread
        # Within a partition, offsets follow message order.
        last: dict[str, int] = {}
        for result in results:
            assert result["offset"] > last.get(result["partition"], -1)
            last[result["partition"]] = result["offset"]
        # Payloads went where the answer says.
        for result, i in zip(results, range(40), strict=True):
            stored = dict(await _fetch_all(mesh, result["partition"]))
            assert stored[result["offset"]].payload == str(i).encode()
            assert stored[result["offset"]].key == keys[i]

        keyless = {"messages": [{"payload": "x"} for _ in range(8)]}
        spread = (await http.post("/v1/topics/default/keyed/messages", json=keyless)).json()
        counts: dict[str, int] = {}
        for result in spread["results"]:
            counts[result["partition"]] = counts.get(result["partition"], 0) + 1
        assert counts == {f"/default/keyed-part-{i}": 2 for i in range(4)}


async def test_auto_create_off_refuses_unknown_topics(mesh_for: MeshFactory) -> None:
    async with mesh_for(auto_create=False) as mesh:
        body = {"messages": [{"payload": "x"}]}
        answer = await mesh.http.post("/v1/topics/default/ghost/messages", json=body)
        assert _error(answer) == (404, "topic_not_found")
        assert await mesh.store.get("topics/default/ghost") is None
        await mesh.http.put("/v1/topics/default/real")
        ok = await mesh.http.post("/v1/topics/default/real/messages", json=body)
        assert ok.json() == {"results": [{"partition": "/default/real", "offset": 0}]}


async def test_no_ingest_node_is_503_no_owner(mesh_for: MeshFactory) -> None:
    async with mesh_for(with_ingest=False, produce_timeout_s=0.5) as mesh:
        answer = await mesh.http.post("/v1/topics/default/lonely/messages", json=ONE)
        assert _error(answer) == (503, "no_owner")
        # The topic itself was created (the batch was valid); nothing owns it.
        assert (await mesh.http.get("/v1/lookup/default/lonely")).json()["partitions"] == [
            {"name": "/default/lonely", "owner": None, "url": None}
        ]


async def test_chunked_body_over_the_limit_is_413(mesh_for: MeshFactory) -> None:
    async with mesh_for(with_ingest=False) as mesh:

        async def chunks() -> AsyncIterator[bytes]:  # no Content-Length: counted as it comes
            yield b'{"messages": [{"payload": "'
            for _ in range(MAX_BODY // 10_000 + 1):
                yield b"x" * 10_000
            yield b'"}]}'

        answer = await mesh.http.post(
            "/v1/topics/default/big/messages",
            content=chunks(),
            headers={"content-type": "application/json"},
        )
        assert _error(answer) == (413, "body_too_large")
        assert await mesh.store.get("topics/default/big") is None


async def test_cluster_and_metrics(mesh_for: MeshFactory) -> None:
    async with mesh_for() as mesh:
        disc_id = f"disc-{mesh.settings.discovery.port}"
        # The in-process ingest node registers on its own schedule, not before discovery's
        # controller leads (a CI run on a busy machine read the listing in between).
        async with asyncio.timeout(15):
            while True:
                cluster = (await mesh.http.get("/v1/cluster")).json()
                if cluster["controller"]["leader"] == disc_id and cluster["nodes"]["ingest"]:
                    break
                await asyncio.sleep(0.05)
        assert [n["node_id"] for n in cluster["nodes"]["discovery"]] == [disc_id]
        assert [n["node_id"] for n in cluster["nodes"]["ingest"]] == ["ingest-1"]
        bus_before = REGISTRY.get_sample_value("danube_discovery_bus_produce_seconds_count")
        await mesh.http.post("/v1/topics/default/m/messages", json={"messages": [{"payload": "x"}]})
        # One bus request to ingest for a one-message produce, timed (the per-hop histogram).
        bus_after = REGISTRY.get_sample_value("danube_discovery_bus_produce_seconds_count")
        assert (bus_after or 0.0) == (bus_before or 0.0) + 1
        text = (await mesh.http.get("/metrics")).text
        assert (
            'danube_discovery_http_requests_total{method="POST",'
            'route="/v1/topics/{ns}/{topic}/messages",status="200"}' in text
        )
        assert "danube_discovery_produce_seconds_count" in text
        assert (await mesh.http.get("/docs")).status_code == 200
        spec = (await mesh.http.get("/openapi.json")).json()
        assert "/v1/topics/{ns}/{topic}/messages" in spec["paths"]


# --- the bad-input table ------------------------------------------------------------------


@dataclass(frozen=True)
class Row:
    method: str
    path: str
    body: Any  # a JSON value, or bytes sent as they are
    status: int
    code: str


ROWS = {
    "namespace-bad-char": Row("POST", "/v1/topics/bad.ns/t/messages", ONE, 400, "invalid_name"),
    "topic-bad-char": Row("POST", "/v1/topics/default/a.b/messages", ONE, 400, "invalid_name"),
    "topic-too-long": Row("PUT", "/v1/topics/default/" + "t" * 300, None, 400, "invalid_name"),
    "topic-part-suffix-produce": Row(
        "POST", "/v1/topics/default/t-part-3/messages", ONE, 404, "topic_not_found"
    ),
    "topic-part-suffix-create": Row(
        "PUT", "/v1/topics/default/t-part-3", None, 400, "invalid_name"
    ),
    "namespace-bad-create": Row("PUT", "/v1/namespaces/a%20b", None, 400, "invalid_name"),
    "unknown-top-field": Row(
        "POST", "/v1/topics/default/new/messages", {**ONE, "colour": 1}, 400, "unknown_field"
    ),
    "unknown-message-field": Row(
        "POST",
        "/v1/topics/default/new/messages",
        {"messages": [{"payload": "x", "ttl": 5}]},
        400,
        "unknown_field",
    ),
    "unknown-topic-field": Row(
        "PUT", "/v1/topics/default/new", {"partitions": 1, "replicas": 3}, 400, "unknown_field"
    ),
    "bad-base64-after-good": Row(
        "POST",
        "/v1/topics/default/existing/messages",
        {
            "messages": [
                {"payload": B64_OK, "encoding": "base64"},
                {"payload": "%%%", "encoding": "base64"},
            ]
        },
        400,
        "bad_encoding",
    ),
    "unknown-encoding": Row(
        "POST",
        "/v1/topics/default/existing/messages",
        {"messages": [{"payload": "x", "encoding": "hex"}]},
        400,
        "invalid_request",
    ),
    "oversize-payload": Row(
        "POST",
        "/v1/topics/default/existing/messages",
        {"messages": [{"payload": "ok"}, {"payload": "x" * (MAX_PAYLOAD + 1)}]},
        413,
        "payload_too_large",
    ),
    "oversize-body": Row(
        "POST",
        "/v1/topics/default/existing/messages",
        {"messages": [{"payload": "x" * 60_000} for _ in range(5)]},
        413,
        "body_too_large",
    ),
    "empty-messages": Row(
        "POST", "/v1/topics/default/existing/messages", {"messages": []}, 400, "invalid_request"
    ),
    "too-many-messages": Row(
        "POST",
        "/v1/topics/default/existing/messages",
        {"messages": [{"payload": "x"}] * (MAX_MESSAGES + 1)},
        413,
        "too_many_messages",
    ),
    "non-json": Row(
        "POST", "/v1/topics/default/existing/messages", b"{not json", 400, "invalid_json"
    ),
    "wrong-type-payload": Row(
        "POST",
        "/v1/topics/default/existing/messages",
        {"messages": [{"payload": 12}]},
        400,
        "invalid_request",
    ),
    "wrong-type-attributes": Row(
        "POST",
        "/v1/topics/default/existing/messages",
        {"messages": [{"payload": "x", "attributes": ["a"]}]},
        400,
        "invalid_request",
    ),
    "partitions-too-many": Row(
        "PUT", "/v1/topics/default/new", {"partitions": 5000}, 400, "invalid_request"
    ),
    "partitions-negative": Row(
        "PUT", "/v1/topics/default/new", {"partitions": -1}, 400, "invalid_request"
    ),
    "conflicting-config": Row(
        "PUT", "/v1/topics/default/existing", {"partitions": 2}, 409, "topic_exists"
    ),
    "unknown-namespace": Row(
        "POST", "/v1/topics/ghost/t/messages", ONE, 404, "namespace_not_found"
    ),
}


async def _trace(mesh: Mesh) -> tuple[list[tuple[str, int]], int]:
    """What a bad request must not change: every etcd record but the controller's own
    (assignments, elections) and node registrations, and the WAL end of ``existing``."""
    kvs = await mesh.store.range("")
    state = [
        (kv.key, kv.mod_revision)
        for kv in kvs
        if not kv.key.startswith(("nodes/", "elections/")) and not kv.key.endswith("/assignment")
    ]
    reply = await mesh.bus.request(mesh.bus.subjects.wal_stats("/default/existing"), b"")
    return state, int(orjson.loads(reply.body)["wal"]["durable_next"])


async def _send(http: httpx.AsyncClient, row: Row) -> httpx.Response:
    if isinstance(row.body, bytes):
        content = row.body
    elif row.body is None:
        content = b""
    else:
        content = json.dumps(row.body).encode()
    headers = {"content-type": "application/json"}
    return await http.request(row.method, row.path, content=content, headers=headers)


@pytest.mark.parametrize("row", list(ROWS.values()), ids=list(ROWS))
async def test_bad_input_gets_its_4xx_and_leaves_no_trace(mesh_for: MeshFactory, row: Row) -> None:
    async with mesh_for() as mesh:
        await mesh.http.put("/v1/topics/default/existing")
        ok = await mesh.http.post("/v1/topics/default/existing/messages", json=ONE)
        assert ok.status_code == 200
        before = await _trace(mesh)
        answer = await _send(mesh.http, row)
        assert _error(answer) == (row.status, row.code), answer.text
        assert await _trace(mesh) == before
        for name in ("/default/new", "/default/t-part-3", "/default/a"):
            with pytest.raises(BusError):  # nobody claimed a partition for it
                await mesh.bus.request(mesh.bus.subjects.wal_stats(name), b"", timeout_s=0.5)


async def test_produce_to_unknown_topic_with_auto_create_off_leaves_no_trace(
    mesh_for: MeshFactory,
) -> None:
    async with mesh_for(auto_create=False) as mesh:
        await mesh.http.put("/v1/topics/default/existing")
        await mesh.http.post("/v1/topics/default/existing/messages", json=ONE)
        before = await _trace(mesh)
        answer = await mesh.http.post("/v1/topics/default/ghost/messages", json=ONE)
        assert _error(answer) == (404, "topic_not_found")
        assert await _trace(mesh) == before


async def _wal_goes(wal_root: Path, topic: str, after: str) -> None:
    """Wait until no WAL directory of ``topic`` is left; fail naming where the mesh's tasks
    (in this process) waited when one outlives ``after`` by 10 s."""
    try:
        async with asyncio.timeout(10):
            while any(p.name.startswith(topic) for p in wal_root.iterdir()):  # noqa: ASYNC110, ASYNC240
                await asyncio.sleep(0.05)
    except TimeoutError:
        pytest.fail(f"the WAL outlived {after} by 10 s; tasks:\n{task_stacks()}")


async def test_a_deleted_topics_wal_goes_even_when_the_bus_notice_is_lost(
    mesh_for: MeshFactory,
) -> None:
    """The topic's records deleted from etcd as discovery deletes them, with no wal.delete on
    the bus (NATS delivers at most once: a node reconnecting then misses it): the replicas
    see their assignments go and remove their copies themselves."""
    async with mesh_for() as mesh:
        http = mesh.http
        assert (
            await http.put("/v1/topics/default/lost", json={"partitions": 2})
        ).status_code == 201
        body = {"messages": [{"payload": f"m{i}", "key": f"k{i}"} for i in range(10)]}
        assert (await http.post("/v1/topics/default/lost/messages", json=body)).status_code == 200
        wal_root = mesh.settings.wal_cloud.wal.dir / "default"
        assert sorted(p.name for p in wal_root.iterdir() if p.name.startswith("lost")) == [
            "lost-part-0",
            "lost-part-1",
        ]
        topic = TopicName("default", "lost")
        await mesh.store.delete(meta_keys.topic_key(topic))
        for partition in topic.partitions(2):
            await mesh.store.delete_prefix(meta_keys.partition_prefix(partition))
        await _wal_goes(wal_root, "lost", "its topic's records")


async def test_delete_topic_removes_its_wal_and_a_recreated_topic_starts_empty(
    mesh_for: MeshFactory,
) -> None:
    async with mesh_for() as mesh:
        http = mesh.http
        assert (
            await http.put("/v1/topics/default/gone", json={"partitions": 2})
        ).status_code == 201
        body = {"messages": [{"payload": f"m{i}", "key": f"k{i}"} for i in range(10)]}
        assert (await http.post("/v1/topics/default/gone/messages", json=body)).status_code == 200
        wal_root = mesh.settings.wal_cloud.wal.dir / "default"
        names = sorted(p.name for p in wal_root.iterdir() if p.name.startswith("gone"))
        assert names == ["gone-part-0", "gone-part-1"]
        assert (await http.delete("/v1/topics/default/gone")).status_code == 204
        await _wal_goes(wal_root, "gone", "its topic's delete")
        assert (
            await http.put("/v1/topics/default/gone", json={"partitions": 2})
        ).status_code == 201
        answer = await http.post("/v1/topics/default/gone/messages", json=body)
        assert answer.status_code == 200
        results = answer.json()["results"]
        assert min(r["offset"] for r in results) == 0  # a new topic: its partitions start empty
        stored = await _fetch_all(mesh, "/default/gone-part-0")
        assert len(stored) == sum(1 for r in results if r["partition"].endswith("part-0"))

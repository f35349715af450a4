"""Reassignments and drains through the HTTP API and the `danube admin` commands on real NATS
and etcd with an in-process ingest node (the controller's balancer off, so only the requests
write): start, repeat, list with progress, cancel; drain, status, undrain; every refusal with
its status and code. Extra ingest nodes are registered records only: nothing carries the
reassignments out here."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

from danube.discovery import app as discovery_app
from danube.ingest import app as ingest_app
from danube.meta import MetaStore
from danube.meta import keys as meta_keys
from danube.meta.records import Assignment, NodeRecord, Owner
from danube.names import TopicName
from danube.runtime.service import run_in_process
from tests.integration.conftest import MeshSettings
from tests.readiness import until_ready

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

TOPIC = TopicName("default", "elastic")
DANUBE = str(Path(sys.executable).parent / "danube")


async def _danube(*args: str) -> tuple[int, str, str]:
    """Run `danube ARGS`; its exit code, stdout and stderr."""
    env = {**os.environ, "COLUMNS": "200", "NO_COLOR": "1"}
    env.pop("DANUBE_SERVICE_ADDR", None)
    process = await asyncio.create_subprocess_exec(
        DANUBE,
        *args,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=env,
    )
    async with asyncio.timeout(60):
        out, err = await process.communicate()
    assert process.returncode is not None
    return process.returncode, out.decode(), err.decode()


@pytest.fixture
async def http(mesh_settings: MeshSettings) -> AsyncIterator[httpx.AsyncClient]:
    settings = mesh_settings()
    settings = settings.model_copy(
        update={"discovery": settings.discovery.model_copy(update={"balance_enabled": False})}
    )
    base_url = f"http://127.0.0.1:{settings.discovery.port}"
    async with (
        run_in_process(ingest_app.serve, settings, "ingest-1", must_stop_cleanly=True),
        run_in_process(discovery_app.serve, settings, "disc-1", must_stop_cleanly=True) as task,
        httpx.AsyncClient(base_url=base_url, timeout=30) as client,
    ):
        await until_ready(client, task)
        yield client


def _error(response: httpx.Response) -> tuple[int, str]:
    return response.status_code, response.json()["error"]["code"]


async def _ghost(store: MetaStore, node_id: str) -> None:
    record = NodeRecord(node_id=node_id, kind="ingest", started_ms=1)
    await store.put_model(meta_keys.node_key("ingest", node_id), record)


async def _placed(http: httpx.AsyncClient, store: MetaStore) -> Assignment:
    assert (await http.put("/v1/topics/default/elastic")).status_code == 201
    key = meta_keys.partition_assignment_key(TOPIC)
    found = await store.get_model(key, Assignment)
    assert found is not None
    return found


async def test_a_reassignment_is_started_listed_and_cancelled(
    http: httpx.AsyncClient, store: MetaStore
) -> None:
    placed = await _placed(http, store)
    assert placed.replicas == ("ingest-1",)
    await _ghost(store, "ghost-1")
    path = "/v1/partitions/default/elastic/reassign"

    started = await http.post(path, json={"replicas": ["ghost-1"], "catchup_bytes_s": 65536})
    assert started.status_code == 200, started.text
    body = started.json()
    assert body["replicas"] == ["ghost-1", "ingest-1"]
    assert (body["adding"], body["removing"]) == (["ghost-1"], ["ingest-1"])
    assert body["catchup_bytes_s"] == 65536
    assert body["changed"] is True
    again = await http.post(path, json={"replicas": ["ghost-1"], "catchup_bytes_s": 65536})
    assert again.json()["changed"] is False
    stored = await store.get_model(meta_keys.partition_assignment_key(TOPIC), Assignment)
    assert stored is not None
    assert stored.target == ("ghost-1",)

    listed = (await http.get("/v1/reassignments")).json()
    assert listed["truncated"] is False
    [entry] = listed["reassignments"]
    assert entry["partition"] == "/default/elastic"
    assert entry["leader"] == "ingest-1"
    assert entry["isr"] == ["ingest-1"]
    assert [(p["node_id"], p["in_isr"]) for p in entry["progress"]] == [("ghost-1", False)]

    cancelled = await http.delete(path)
    assert cancelled.status_code == 200
    assert cancelled.json()["target"] == ["ingest-1"]
    assert cancelled.json()["removing"] == ["ghost-1"]


async def test_bad_reassignments_are_refused_with_their_codes(
    http: httpx.AsyncClient, store: MetaStore
) -> None:
    await _placed(http, store)
    await _ghost(store, "ghost-1")
    path = "/v1/partitions/default/elastic/reassign"
    cases = [
        ({"replicas": ["nobody"]}, (400, "node_not_live")),
        ({"replicas": ["ghost-1", "ingest-1"]}, (400, "factor_mismatch")),
        ({"replicas": ["ghost-1", "ghost-1"]}, (400, "invalid_request")),
        ({"replicas": []}, (400, "invalid_request")),
        ({"replicas": ["ghost-1"], "catchup_bytes_s": 10}, (400, "invalid_request")),
        ({"replicas": ["ghost-1"], "extra": 1}, (400, "unknown_field")),
    ]
    for body, expected in cases:
        assert _error(await http.post(path, json=body)) == expected, body
    assert _error(await http.delete(path)) == (409, "not_reassigning")
    missing = "/v1/partitions/default/nothing/reassign"
    assert _error(await http.post(missing, json={"replicas": ["ghost-1"]}))[0] == 404
    part = "/v1/partitions/default/elastic-part-3/reassign"
    assert _error(await http.post(part, json={"replicas": ["ghost-1"]}))[0] == 404
    assert (await http.post("/v1/nodes/ghost-1/drain")).status_code == 201
    assert _error(await http.post(path, json={"replicas": ["ghost-1"]})) == (400, "node_drained")
    # Nothing was written by any refusal.
    stored = await store.get_model(meta_keys.partition_assignment_key(TOPIC), Assignment)
    assert stored is not None
    assert not stored.moving


async def test_drain_status_and_undrain(http: httpx.AsyncClient, store: MetaStore) -> None:
    await _placed(http, store)
    await _ghost(store, "ghost-1")
    # A node that holds nothing is drained at once (drained first: the drain of ingest-1
    # below may move its replica to any undrained node).
    await _ghost(store, "ghost-2")
    assert (await http.post("/v1/nodes/ghost-2/drain")).status_code == 201
    assert (await http.get("/v1/nodes/ghost-2/drain")).json()["done"] is True

    drained = await http.post("/v1/nodes/ingest-1/drain")
    assert drained.status_code == 201
    assert drained.json()["replicas"] == ["/default/elastic"]
    assert drained.json()["done"] is False
    assert (await http.post("/v1/nodes/ingest-1/drain")).status_code == 200
    status = (await http.get("/v1/nodes/ingest-1/drain")).json()
    assert status["drained"] is True
    assert status["replicas"] == ["/default/elastic"]
    # The controller drains with the balancer off: its move may have begun already.
    assert status["leaving"] in ([], ["/default/elastic"])
    cluster = (await http.get("/v1/cluster")).json()
    assert {n["node_id"]: n["drained"] for n in cluster["nodes"]["ingest"]} == {
        "ingest-1": True,
        "ghost-1": False,
        "ghost-2": True,
    }
    assert _error(await http.post("/v1/nodes/nobody/drain")) == (400, "node_not_live")
    # A node lost for good that still holds replicas may be drained (they are copied anew).
    # (Of a topic that exists: the controller forgets the keys of a partition without one.)
    assert (await http.put("/v1/topics/default/x")).status_code == 201
    lost = Assignment(replicas=("gone-1",), assigned_ms=1)
    await store.put_model(meta_keys.partition_assignment_key(TopicName("default", "x")), lost)
    gone = await http.post("/v1/nodes/gone-1/drain")
    assert gone.status_code == 201
    assert gone.json()["replicas"] == ["/default/x"]
    assert _error(await http.post("/v1/nodes/bad%20id/drain"))[0] == 400

    assert (await http.delete("/v1/nodes/ingest-1/drain")).status_code == 204
    assert _error(await http.delete("/v1/nodes/ingest-1/drain")) == (404, "not_drained")
    assert (await http.get("/v1/nodes/ingest-1/drain")).json()["drained"] is False
    assert await store.get(meta_keys.drain_key("ingest", "ingest-1")) is None


async def test_a_dispatcher_is_drained_by_the_same_route(
    http: httpx.AsyncClient, store: MetaStore
) -> None:
    """A dispatcher's drain key is written; its status lists the subscriptions it still
    serves (its owner keys) until they are handed over; undrain deletes the key."""
    record = NodeRecord(node_id="disp-1", kind="dispatcher", started_ms=1)
    await store.put_model(meta_keys.node_key("dispatcher", "disp-1"), record)
    owner_key = meta_keys.subscription_owner_key(TopicName("default", "owned"), "s")
    await store.put_model(owner_key, Owner(node_id="disp-1", epoch=1, assigned_ms=1))
    # A cursor of a partition whose name ends like an owner key is no owner key.
    cursor = meta_keys.subscription_cursor_key(
        TopicName("default", "owner"), "s", TopicName("default", "owner")
    )
    await store.put(cursor, b"{}")

    drained = await http.post("/v1/nodes/disp-1/drain")
    assert drained.status_code == 201, drained.text
    body = drained.json()
    assert (body["kinds"], body["replicas"]) == (["dispatcher"], [])
    assert (body["subscriptions"], body["done"]) == (["/default/owned/s"], False)
    assert await store.get(meta_keys.drain_key("dispatcher", "disp-1")) is not None
    assert await store.get(meta_keys.drain_key("ingest", "disp-1")) is None
    await store.delete(owner_key)  # handed over
    assert (await http.get("/v1/nodes/disp-1/drain")).json()["done"] is True
    assert (await http.delete("/v1/nodes/disp-1/drain")).status_code == 204
    assert await store.get(meta_keys.drain_key("dispatcher", "disp-1")) is None


async def test_the_admin_commands_reassign_list_cancel_and_drain(
    http: httpx.AsyncClient, store: MetaStore
) -> None:
    url = str(http.base_url).rstrip("/")
    assert (await http.put("/v1/topics/default/cli", json={"partitions": 2})).status_code == 201
    await _ghost(store, "ghost-1")

    code, out, err = await _danube(
        "admin", "partitions", "reassign", "/default/cli", "--partition", "1",
        "--replicas", "ghost-1", "--catchup-bytes-s", "4096", "-s", url,
    )  # fmt: skip
    assert code == 0, err
    assert "/default/cli-part-1: reassigning ingest-1 -> ghost-1" in out
    code, out, err = await _danube("admin", "partitions", "reassignments", "-s", url, "--json")
    assert code == 0, err
    [entry] = json.loads(out)["reassignments"]
    assert entry["partition"] == "/default/cli-part-1"
    assert entry["catchup_bytes_s"] == 4096
    assert entry["progress"][0]["node_id"] == "ghost-1"
    code, out, err = await _danube("admin", "partitions", "reassignments", "-s", url)
    assert code == 0, err
    assert "1 under way" in out
    code, out, err = await _danube(
        "admin", "partitions", "cancel-reassign", "/default/cli", "-p", "1", "-s", url
    )
    assert code == 0, err
    assert "-> ingest-1" in out

    code, out, err = await _danube(
        "admin", "partitions", "reassign", "/default/cli", "-p", "0", "--replicas", "nobody",
        "-s", url,
    )  # fmt: skip
    assert code == 1
    assert "node_not_live" in err or "not live" in err

    code, out, err = await _danube("admin", "nodes", "drain", "ingest-1", "-s", url)
    assert code == 0, err
    assert "ingest-1 (ingest): draining; still holds 2 replicas, 0 subscriptions" in out
    code, out, err = await _danube(
        "admin", "nodes", "drain-status", "ingest-1", "-s", url, "--json"
    )
    assert code == 0, err
    assert json.loads(out)["drained"] is True
    code, out, err = await _danube("admin", "cluster", "-s", url)
    assert "ingest-1 (drained)" in out
    code, out, err = await _danube("admin", "nodes", "undrain", "ingest-1", "-s", url)
    assert code == 0, err
    code, out, err = await _danube("admin", "nodes", "undrain", "ingest-1", "-s", url)
    assert code == 1
    assert "not drained" in err

"""Topic and namespace policies on a mesh of service processes (ingest, dispatcher, two
discovery instances): a publish rate holds within 10% over 10 s through both front doors;
the 4th producer over a limit of 3 gets 409; subscriptions and consumers are counted; an
oversized message is refused with nothing written; the backlog quota refuses, or evicts the
oldest; a topic inherits its namespace's policies and a PATCH changes a live limit."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import httpx
import pytest

from danube.up import ServerProcess

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240)]

# Front doors re-read a topic's config and namespace this often: a PATCH made through one
# instance holds on the other within it.
CACHE_TTL_S = 0.5
RATE_MSGS_S = 200
RATE_WINDOW_S = 10.0
BATCH = 5
PRODUCERS_PER_DOOR = 4


@dataclass
class Processes:
    dispatcher: ServerProcess
    doors: list[ServerProcess]


@pytest.fixture(scope="module")
def processes(module_services: Callable[..., ServerProcess]) -> Processes:
    """One mesh for the module: starting its four service processes was most of each test's
    time. Each test uses topics (and namespaces) of its own, and each metric a test asserts
    counts an event only that test causes (a refused consumer, evicted messages)."""
    module_services("ingest", "ingest-0")
    dispatcher = module_services(
        "dispatcher", "dispatcher-0", DANUBE_DISPATCHER__CURSOR_FLUSH_INTERVAL_S="0.1"
    )
    env = {"DANUBE_DISCOVERY__TOPIC_CACHE_TTL_S": str(CACHE_TTL_S)}
    doors = [module_services("discovery", f"discovery-{i}", **env) for i in range(2)]
    return Processes(dispatcher, doors)


@dataclass
class Mesh:
    a: httpx.AsyncClient
    b: httpx.AsyncClient
    dispatcher: ServerProcess


@asynccontextmanager
async def _mesh(processes: Processes) -> AsyncIterator[Mesh]:
    urls = [f"http://127.0.0.1:{door.spec.port}" for door in processes.doors]
    async with (
        httpx.AsyncClient(base_url=urls[0], timeout=30) as a,
        httpx.AsyncClient(base_url=urls[1], timeout=30) as b,
    ):
        yield Mesh(a, b, processes.dispatcher)


def _ok(answer: httpx.Response, *statuses: int) -> Any:
    assert answer.status_code in (statuses or (200, 201, 204)), answer.text
    return answer.json() if answer.content else None


def _code(answer: httpx.Response) -> str:
    return str(answer.json()["error"]["code"])


async def _produce(
    http: httpx.AsyncClient, path: str, *payloads: str, key: str | None = None
) -> httpx.Response:
    body = {"messages": [{"payload": p, "key": key} for p in payloads]}
    return await http.post(f"/v1/topics/{path}/messages", json=body)


async def _attach(
    http: httpx.AsyncClient, path: str, sub: str, name: str, kind: str = "shared"
) -> httpx.Response:
    body = {"name": name, "type": kind, "start": "earliest"}
    return await http.post(f"/v1/topics/{path}/subscriptions/{sub}/consumers", json=body)


async def _until(check: Callable[[], Any], timeout_s: float = 20.0) -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        found = await check()
        if found:
            return found
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.1)


async def test_publish_rate_holds_within_ten_per_cent_over_ten_seconds(
    processes: Processes,
) -> None:
    async with _mesh(processes) as mesh:
        _ok(await mesh.a.put("/v1/namespaces/rl"))
        policies = {"publish_rate_msgs_s": RATE_MSGS_S}
        _ok(await mesh.a.put("/v1/topics/rl/t", json={"partitions": 2, "policies": policies}))
        for http in (mesh.a, mesh.b):  # both doors see the topic and its partitions led
            _ok(await _produce(http, "rl/t", "warm-up"))
        await asyncio.sleep(1.0)  # the warm-up's tokens are back
        acked = refused = 0
        retry_after: set[str] = set()
        stop_at = time.monotonic() + RATE_WINDOW_S

        async def producer(http: httpx.AsyncClient) -> None:
            nonlocal acked, refused
            payloads = [f"m{i}" for i in range(BATCH)]
            sent = 0
            while time.monotonic() < stop_at:
                # One key per batch: each batch goes to one partition whole (a batch spread
                # over partitions may be refused by one leader and stored by the other).
                sent += 1
                answer = await _produce(http, "rl/t", *payloads, key=f"{id(http)}-{sent}")
                if answer.status_code == 200:
                    acked += len(answer.json()["results"])
                    continue
                assert answer.status_code == 429, answer.text
                assert _code(answer) == "rate_limited"
                retry_after.add(answer.headers["Retry-After"])
                refused += 1

        async with asyncio.TaskGroup() as tg:
            for http in (mesh.a, mesh.b):
                for _ in range(PRODUCERS_PER_DOOR):
                    tg.create_task(producer(http))
        expected = RATE_MSGS_S * RATE_WINDOW_S
        assert refused > 0
        assert retry_after == {"1"}
        assert abs(acked - expected) <= expected * 0.10, (acked, expected)


async def test_producers_subscriptions_consumers_and_message_size(
    processes: Processes,
) -> None:
    async with _mesh(processes) as mesh:
        policies = {
            "max_producers": 3,
            "max_subscriptions": 2,
            "max_consumers_per_subscription": 1,
            "max_message_bytes": 100,
        }
        _ok(await mesh.a.put("/v1/topics/default/lim", json={"policies": policies}))
        # The 4th producer over a limit of 3 gets 409, through either door.
        opened = []
        for i in range(3):
            http = (mesh.a, mesh.b)[i % 2]
            found = _ok(await http.post("/v1/topics/default/lim/producers", json={"name": f"p{i}"}))
            opened.append(found["producer_id"])
        fourth = await mesh.b.post("/v1/topics/default/lim/producers", json={"name": "p3"})
        assert fourth.status_code == 409, fourth.text
        assert _code(fourth) == "too_many_producers"
        _ok(await mesh.a.delete(f"/v1/topics/default/lim/producers/{opened[0]}"), 204)
        _ok(await mesh.b.post("/v1/topics/default/lim/producers", json={"name": "p3"}), 201)

        # An oversized message is refused before anything is written.
        too_big = await _produce(mesh.a, "default/lim", "x" * 101)
        assert too_big.status_code == 413, too_big.text
        assert _code(too_big) == "payload_too_large"
        described = _ok(await mesh.a.get("/v1/topics/default/lim"))
        assert described["partitions"][0]["offsets"]["next_offset"] in (None, 0)
        _ok(await _produce(mesh.a, "default/lim", "x" * 100))
        # A policy over the cluster's own limit, or out of bounds, is a 400 naming it.
        bad = await mesh.a.patch(
            "/v1/topics/default/lim", json={"policies": {"max_message_bytes": 2**31}}
        )
        assert bad.status_code == 400, bad.text
        assert "policies.max_message_bytes" in bad.text
        bad = await mesh.a.patch("/v1/topics/default/lim", json={"policies": {"max_producers": 0}})
        assert bad.status_code == 400, bad.text
        assert "policies.max_producers" in bad.text

        # Two subscriptions, one consumer each.
        _ok(await _attach(mesh.a, "default/lim", "s1", "c1"))
        _ok(await _attach(mesh.b, "default/lim", "s2", "c1"))
        third = await _attach(mesh.a, "default/lim", "s3", "c1")
        assert third.status_code == 409, third.text
        assert _code(third) == "too_many_subscriptions"
        second = await _attach(mesh.b, "default/lim", "s1", "c2")
        assert second.status_code == 409, second.text
        assert _code(second) == "too_many_consumers"
        listed = _ok(await mesh.a.get("/v1/topics/default/lim/subscriptions"))
        assert sorted(s["name"] for s in listed["subscriptions"]) == ["s1", "s2"]
        metrics = (await mesh.a.get(f"http://127.0.0.1:{mesh.dispatcher.spec.port}/metrics")).text
        assert 'danube_dispatcher_policy_refusals_total{reason="too_many_consumers"} 1.0' in metrics


async def test_inherited_policies_and_a_patch_of_a_live_limit(
    processes: Processes,
) -> None:
    async with _mesh(processes) as mesh:
        ns = {"policies": {"max_message_bytes": 50, "max_producers": 7}}
        _ok(await mesh.a.put("/v1/namespaces/inh", json=ns))
        _ok(await mesh.a.put("/v1/topics/inh/t", json={"policies": {"max_producers": 2}}))
        config = _ok(await mesh.b.get("/v1/topics/inh/t"))["config"]
        assert config["policies"]["max_message_bytes"] is None
        assert config["effective_policies"]["max_message_bytes"] == 50
        assert config["effective_policies"]["max_producers"] == 2
        assert (await _produce(mesh.b, "inh/t", "x" * 51)).status_code == 413

        # The topic's own value, set through one door, holds on the other within its TTL.
        _ok(await mesh.a.patch("/v1/topics/inh/t", json={"policies": {"max_message_bytes": 80}}))

        async def takes_70() -> bool:
            return (await _produce(mesh.b, "inh/t", "y" * 70)).status_code == 200

        await _until(takes_70)
        assert (await _produce(mesh.b, "inh/t", "y" * 81)).status_code == 413
        # Unset on the topic: the namespace's applies again; a namespace PATCH moves it.
        _ok(await mesh.b.patch("/v1/topics/inh/t", json={"policies": {"max_message_bytes": None}}))
        _ok(await mesh.b.patch("/v1/namespaces/inh", json={"policies": {"max_message_bytes": 60}}))

        async def refuses_70() -> bool:
            return (await _produce(mesh.a, "inh/t", "y" * 70)).status_code == 413

        await _until(refuses_70)
        _ok(await _produce(mesh.a, "inh/t", "y" * 60))
        namespace = _ok(await mesh.a.get("/v1/namespaces/inh"))
        assert namespace["policies"]["max_message_bytes"] == 60
        assert namespace["policies"]["max_producers"] == 7

        # A live rate limit: none, then 5 messages per second.
        for _ in range(20):
            _ok(await _produce(mesh.a, "inh/t", "z"))
        patch = {"policies": {"publish_rate_msgs_s": 5}}
        _ok(await mesh.a.patch("/v1/topics/inh/t", json=patch))

        async def limited() -> bool:
            answers = [await _produce(mesh.b, "inh/t", "z") for _ in range(10)]
            return any(a.status_code == 429 for a in answers)

        await _until(limited)


async def test_backlog_quota_refuse_until_consumers_catch_up(
    processes: Processes,
) -> None:
    async with _mesh(processes) as mesh:
        quota = {"backlog_quota_messages": 5, "backlog_quota_policy": "refuse"}
        _ok(await mesh.a.put("/v1/topics/default/bq", json={"policies": quota}))
        consumer = _ok(await _attach(mesh.a, "default/bq", "slow", "c1", "exclusive"))
        for i in range(5):
            _ok(await _produce(mesh.a, "default/bq", f"m{i}"))
        refused = await _produce(mesh.b, "default/bq", "m5")
        assert refused.status_code == 429, refused.text
        assert _code(refused) == "backlog_quota_exceeded"
        described = _ok(await mesh.a.get("/v1/topics/default/bq"))
        assert described["partitions"][0]["offsets"]["next_offset"] == 5  # nothing written

        cid = consumer["consumer_id"]
        got = _ok(await mesh.a.get(f"/v1/consumers/{cid}/messages?max=10&wait_ms=2000"))
        refs = [{"partition": m["partition"], "offset": m["offset"]} for m in got["messages"]]
        assert len(refs) == 5
        _ok(await mesh.a.post(f"/v1/consumers/{cid}/ack", json={"messages": refs}))

        async def accepted() -> bool:
            return (await _produce(mesh.b, "default/bq", "m5")).status_code == 200

        await _until(accepted, timeout_s=5.0)


async def test_backlog_quota_evict_oldest_moves_the_slowest_cursor(
    processes: Processes,
) -> None:
    async with _mesh(processes) as mesh:
        quota = {"backlog_quota_messages": 5, "backlog_quota_policy": "evict_oldest"}
        _ok(await mesh.a.put("/v1/topics/default/ev", json={"policies": quota}))
        slow = _ok(await _attach(mesh.a, "default/ev", "slow", "c1", "exclusive"))
        fast = _ok(await _attach(mesh.a, "default/ev", "fast", "c1", "exclusive"))
        for i in range(20):  # never refused under evict_oldest
            _ok(await _produce(mesh.a, "default/ev", f"m{i}"))
        fid = fast["consumer_id"]
        got = _ok(await mesh.a.get(f"/v1/consumers/{fid}/messages?max=20&wait_ms=2000"))
        while len(got["messages"]) < 20:
            more = _ok(await mesh.a.get(f"/v1/consumers/{fid}/messages?max=20&wait_ms=2000"))
            got["messages"] += more["messages"]
        refs = [{"partition": m["partition"], "offset": m["offset"]} for m in got["messages"]]
        _ok(await mesh.a.post(f"/v1/consumers/{fid}/ack", json={"messages": refs}))

        async def backlogs() -> dict[str, int] | None:
            listed = _ok(await mesh.a.get("/v1/topics/default/ev/subscriptions"))
            found = {s["name"]: s["backlog"] for s in listed["subscriptions"]}
            return found if found.get("slow") == 5 else None

        found = await _until(backlogs)
        assert found["fast"] == 0
        metrics = (await mesh.a.get(f"http://127.0.0.1:{mesh.dispatcher.spec.port}/metrics")).text
        assert "danube_dispatcher_backlog_evicted_messages_total 15.0" in metrics
        sid = slow["consumer_id"]
        # The slow consumer goes on from the oldest message kept (its unacked window was
        # dropped with the seek).
        first = _ok(await mesh.a.get(f"/v1/consumers/{sid}/messages?max=1&wait_ms=3000"))
        assert first["messages"][0]["offset"] == 15

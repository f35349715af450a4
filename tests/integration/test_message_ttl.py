"""Message TTL through the whole path (docs/policies.md, "Message TTL"): per message (the
HTTP ``ttl_ms`` field, the ``danube.ttl_ms`` attribute from the SDK) and per topic
(``message_ttl_s``): an expired message is never delivered, the subscription counts it (admin
API and metric), and its backlog drops, also with no consumer polling."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from prometheus_client import REGISTRY

from danube.client import TTL_ATTRIBUTE, AsyncDanubeClient
from tests.integration.conftest import ConsumeMesh

pytestmark = pytest.mark.integration

TOPIC = "default/ttl"
WAIT_S = 15.0


@pytest.fixture
async def consume_http(consume_mesh: ConsumeMesh) -> AsyncIterator[httpx.AsyncClient]:
    """A mesh per test, not the module's shared one: both tests create TOPIC, with other
    policies."""
    async with consume_mesh() as client:
        yield client


async def _attach(http: httpx.AsyncClient, sub: str) -> str:
    response = await http.post(
        f"/v1/topics/{TOPIC}/subscriptions/{sub}/consumers",
        json={"name": "c", "type": "shared", "start": "earliest"},
    )
    assert response.status_code == 201, response.text
    cid: str = response.json()["consumer_id"]
    return cid


async def _subscription(http: httpx.AsyncClient, sub: str) -> dict[str, Any]:
    listed = (await http.get(f"/v1/topics/{TOPIC}/subscriptions")).json()["subscriptions"]
    found: dict[str, Any] = next(s for s in listed if s["name"] == sub)
    return found


async def _drain(http: httpx.AsyncClient, cid: str) -> list[dict[str, Any]]:
    """Every message the consumer is given until a poll comes back empty."""
    got: list[dict[str, Any]] = []
    while True:
        answer = await http.get(f"/v1/consumers/{cid}/messages", params={"wait_ms": 700})
        assert answer.status_code == 200, answer.text
        batch = answer.json()["messages"]
        if not batch:
            return got
        got += batch


async def _until(check: Any, what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not await check():
        assert time.monotonic() < deadline, what
        await asyncio.sleep(0.1)


def _expired_metric(sub: str) -> float:
    labels = {"topic": "/" + TOPIC, "subscription": sub}
    return REGISTRY.get_sample_value("danube_subscription_expired_messages_total", labels) or 0.0


async def test_expired_messages_are_not_delivered_counted_and_leave_the_backlog(
    consume_http: httpx.AsyncClient,
) -> None:
    http = consume_http
    assert (await http.put(f"/v1/topics/{TOPIC}")).status_code == 201
    polled = await _attach(http, "polled")
    idle = await _attach(http, "idle")  # attached, never polls
    metric_before = _expired_metric("polled")

    # 30 with the HTTP field, 30 with the attribute from the SDK (binary records), 30 without.
    body = {"messages": [{"payload": f"short-{i}", "ttl_ms": 300} for i in range(30)]}
    assert (await http.post(f"/v1/topics/{TOPIC}/messages", json=body)).status_code == 200
    async with (
        AsyncDanubeClient(str(http.base_url)) as client,
        client.producer("/" + TOPIC) as producer,
    ):
        for i in range(30):
            await producer.send(f"attr-{i}", attributes={TTL_ATTRIBUTE: "300"})
        for i in range(30):
            await producer.send(f"keep-{i}")
    await asyncio.sleep(0.6)

    got = await _drain(http, polled)
    assert sorted(m["payload"] for m in got) == sorted(f"keep-{i}" for i in range(30))
    polled_sub = await _subscription(http, "polled")
    assert polled_sub["expired"] == 60
    assert polled_sub["backlog"] == 30  # the 30 delivered, not acked yet
    assert _expired_metric("polled") - metric_before == 60
    acked = {"messages": [{"partition": m["partition"], "offset": m["offset"]} for m in got]}
    assert (await http.post(f"/v1/consumers/{polled}/ack", json=acked)).status_code == 204
    assert (await _subscription(http, "polled"))["backlog"] == 0

    # Nobody polls "idle": its ticks let the 60 go; the 30 without a TTL stay in its backlog.
    async def idle_swept() -> bool:
        found = await _subscription(http, "idle")
        return bool(found["expired"] == 60 and found["backlog"] == 30)

    await _until(idle_swept, "the idle subscription's expired messages left its backlog")
    assert sorted(m["payload"] for m in await _drain(http, idle)) == sorted(
        f"keep-{i}" for i in range(30)
    )


async def test_a_topic_policy_ttl_expires_every_message(consume_http: httpx.AsyncClient) -> None:
    http = consume_http
    policies = {"policies": {"message_ttl_s": 1}}
    created = await http.put(f"/v1/topics/{TOPIC}", json=policies)
    assert created.status_code == 201, created.text
    assert created.json()["config"]["policies"]["message_ttl_s"] == 1
    refused = await http.patch(f"/v1/topics/{TOPIC}", json={"policies": {"message_ttl_s": 0}})
    assert refused.status_code == 400
    body = {
        "messages": [{"payload": f"m-{i}"} for i in range(20)]
        + [{"payload": "long", "ttl_ms": 60_000}]  # its own TTL wins over the topic's
    }
    assert (await http.post(f"/v1/topics/{TOPIC}/messages", json=body)).status_code == 200
    await asyncio.sleep(1.3)
    cid = await _attach(http, "late")
    assert [m["payload"] for m in await _drain(http, cid)] == ["long"]
    assert (await _subscription(http, "late"))["expired"] == 20

"""Payloads checked against their topic's schema on produce, over HTTP, on real services:
enforce refuses a batch with one bad message whole (nothing stored), warn stores it all and
counts the violation, none only stamps; every stored record carries the schema id and
version it was checked against, and consumers get them."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

pytestmark = pytest.mark.integration

ORDER = json.dumps(
    {
        "type": "object",
        "properties": {"id": {"type": "integer"}, "item": {"type": "string"}},
        "required": ["id"],
    }
)
# Version 2 (backward compatible): an optional field more.
ORDER_V2 = json.dumps(
    {
        "type": "object",
        "properties": {
            "id": {"type": "integer"},
            "item": {"type": "string"},
            "qty": {"type": "integer"},
        },
        "required": ["id"],
    }
)


async def _setup(http: httpx.AsyncClient, topic: str, policy: str) -> int:
    registered = await http.post(
        "/v1/schemas/orders-value/versions", json={"schema_type": "json_schema", "schema": ORDER}
    )
    assert registered.status_code in (200, 201), registered.text
    bound = await http.put(
        f"/v1/topics/default/{topic}/schema",
        json={"subject": "orders-value", "validation_policy": policy, "payload_validation": True},
    )
    assert bound.status_code == 200, bound.text
    return int(registered.json()["schema_id"])


def _batch(*payloads: str, **extra: Any) -> dict[str, Any]:
    return {"messages": [{"payload": p} for p in payloads], **extra}


async def _violations(http: httpx.AsyncClient, policy: str) -> float:
    text = (await http.get("/metrics")).text
    for line in text.splitlines():
        if line.startswith(f'danube_discovery_schema_violations_total{{policy="{policy}"}}'):
            return float(line.split()[-1])
    return 0.0


async def _consume_all(http: httpx.AsyncClient, topic: str, count: int) -> list[dict[str, Any]]:
    attached = await http.post(
        f"/v1/topics/default/{topic}/subscriptions/check/consumers",
        json={"name": "c", "start": "earliest"},
    )
    assert attached.status_code == 201, attached.text
    cid = attached.json()["consumer_id"]
    got: list[dict[str, Any]] = []
    for _ in range(20):
        polled = await http.get(f"/v1/consumers/{cid}/messages", params={"wait_ms": 200})
        got += polled.json()["messages"]
        if len(got) >= count:
            break
    return got


async def test_enforce_refuses_a_batch_with_one_bad_message_whole(
    consume_http: httpx.AsyncClient,
) -> None:
    http = consume_http
    schema_id = await _setup(http, "enforced", "enforce")
    before = await _violations(http, "enforce")
    refused = await http.post(
        "/v1/topics/default/enforced/messages",
        json=_batch('{"id": 1}', '{"item": "no id"}', '{"id": 3}'),
    )
    assert refused.status_code == 400
    error = refused.json()["error"]
    assert error["code"] == "schema_violation"
    assert error["message"].startswith("messages[1] does not match 'orders-value' version 1")
    assert "'id' is a required property" in error["message"]
    assert await _violations(http, "enforce") == before + 1
    stored = await http.post(
        "/v1/topics/default/enforced/messages", json=_batch('{"id": 1}', '{"id": 2}')
    )
    assert stored.status_code == 200, stored.text
    assert [r["offset"] for r in stored.json()["results"]] == [0, 1]  # nothing of the first
    got = await _consume_all(http, "enforced", 2)
    assert [(m["offset"], m["schema_id"], m["schema_version"]) for m in got] == [
        (0, schema_id, 1),
        (1, schema_id, 1),
    ]


async def test_warn_stores_all_and_counts_the_violation(consume_http: httpx.AsyncClient) -> None:
    http = consume_http
    schema_id = await _setup(http, "warned", "warn")
    before = await _violations(http, "warn")
    stored = await http.post(
        "/v1/topics/default/warned/messages", json=_batch('{"id": 1}', "not json", '{"id": 3}')
    )
    assert stored.status_code == 200, stored.text
    assert [r["offset"] for r in stored.json()["results"]] == [0, 1, 2]
    assert await _violations(http, "warn") == before + 1
    got = await _consume_all(http, "warned", 3)
    assert [m["payload"] for m in got] == ['{"id": 1}', "not json", '{"id": 3}']
    assert {(m["schema_id"], m["schema_version"]) for m in got} == {(schema_id, 1)}


async def test_none_stamps_and_a_pinned_version_is_kept(consume_http: httpx.AsyncClient) -> None:
    http = consume_http
    schema_id = await _setup(http, "stamped", "none")
    v2 = await http.post(
        "/v1/schemas/orders-value/versions",
        json={"schema_type": "json_schema", "schema": ORDER_V2},
    )
    assert v2.json()["version"] == 2, v2.text
    latest = await http.post("/v1/topics/default/stamped/messages", json=_batch("anything"))
    pinned = await http.post(
        "/v1/topics/default/stamped/messages", json=_batch('{"id": 5}', schema_version=1)
    )
    unknown = await http.post(
        "/v1/topics/default/stamped/messages", json=_batch('{"id": 6}', schema_version=9)
    )
    assert (latest.status_code, pinned.status_code) == (200, 200)
    assert (unknown.status_code, unknown.json()["error"]["code"]) == (400, "schema_not_found")
    got = await _consume_all(http, "stamped", 2)
    assert [(m["payload"], m["schema_id"], m["schema_version"]) for m in got] == [
        ("anything", schema_id, 2),
        ('{"id": 5}', schema_id, 1),
    ]


async def test_a_topic_without_schema_stores_no_stamp(consume_http: httpx.AsyncClient) -> None:
    http = consume_http
    stored = await http.post("/v1/topics/default/free/messages", json=_batch("x", schema_version=3))
    assert stored.status_code == 200
    (got,) = await _consume_all(http, "free", 1)
    assert (got["schema_id"], got["schema_version"]) == (None, None)

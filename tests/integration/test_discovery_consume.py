"""The discovery consume HTTP API (attach, long-poll, ack, nack, detach) on real NATS and
etcd with ingest, dispatcher and discovery in-process: order, payload encodings, acks across
consumers, exclusive refusal, delayed redelivery and the 400/404 answers."""

from __future__ import annotations

import asyncio
import base64
from typing import Any

import httpx
import pytest

pytestmark = pytest.mark.integration

BINARY = bytes([0xFF, 0x00, 0xFE, 0x80])


def _error(response: httpx.Response) -> tuple[int, str]:
    return response.status_code, response.json()["error"]["code"]


async def _attach(http: httpx.AsyncClient, path: str, **body: Any) -> str:
    response = await http.post(f"/v1/topics/{path}/consumers", json={"name": "c", **body})
    assert response.status_code == 201, response.text
    cid: str = response.json()["consumer_id"]
    return cid


async def _poll_until(http: httpx.AsyncClient, cid: str, count: int) -> list[dict[str, Any]]:
    got: list[dict[str, Any]] = []
    async with asyncio.timeout(15):
        while len(got) < count:
            response = await http.get(
                f"/v1/consumers/{cid}/messages", params={"max": count - len(got), "wait_ms": 500}
            )
            assert response.status_code == 200, response.text
            got += response.json()["messages"]
    return got


def _refs(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{"partition": m["partition"], "offset": m["offset"]} for m in messages]


async def test_attach_produce_poll_ack_and_a_new_consumer_gets_only_unacked(
    consume_http: httpx.AsyncClient,
) -> None:
    assert (
        await consume_http.put("/v1/topics/default/orders", json={"partitions": 2})
    ).status_code == 201
    cid = await _attach(
        consume_http, "default/orders/subscriptions/s", type="shared", start="earliest"
    )
    assert cid.startswith("default.orders.s.")
    messages = [
        {"payload": f"k{i % 2}-{i}", "key": f"k{i % 2}", "attributes": {"i": str(i)}}
        for i in range(6)
    ]
    messages.append({"payload": base64.b64encode(BINARY).decode(), "encoding": "base64"})
    produced = await consume_http.post(
        "/v1/topics/default/orders/messages", json={"messages": messages, "producer": "p1"}
    )
    assert produced.status_code == 200, produced.text
    results = produced.json()["results"]

    got = await _poll_until(consume_http, cid, len(messages))
    by_position = {(m["partition"], m["offset"]): m for m in got}
    assert len(by_position) == len(messages)
    for sent, result in zip(messages, results, strict=True):
        out = by_position[(result["partition"], result["offset"])]
        assert (out["payload"], out["encoding"]) == (sent["payload"], sent.get("encoding", "utf8"))
        assert out["key"] == sent.get("key")
        assert out["attributes"] == sent.get("attributes", {})
        assert (out["producer"], out["redelivery_count"]) == ("p1", 0)
        assert out["publish_time_ms"] > 0
    # In offset order within each partition.
    for partition in {m["partition"] for m in got}:
        offsets = [m["offset"] for m in got if m["partition"] == partition]
        assert offsets == sorted(offsets)

    acked, unacked = got[:4], got[4:]
    response = await consume_http.post(f"/v1/consumers/{cid}/ack", json={"messages": _refs(acked)})
    assert response.status_code == 204, response.text
    assert (await consume_http.delete(f"/v1/consumers/{cid}")).status_code == 204

    again = await _attach(consume_http, "default/orders/subscriptions/s", type="shared")
    regot = await _poll_until(consume_http, again, len(unacked))
    assert sorted(_key(m) for m in regot) == sorted(_key(m) for m in unacked)
    nothing = await consume_http.get(f"/v1/consumers/{again}/messages", params={"wait_ms": 300})
    assert nothing.json() == {"messages": []}


def _key(message: dict[str, Any]) -> tuple[str, int]:
    return message["partition"], message["offset"]


async def test_exclusive_second_attach_is_refused(consume_http: httpx.AsyncClient) -> None:
    first = await _attach(consume_http, "default/excl/subscriptions/s", type="exclusive")
    second = await consume_http.post(
        "/v1/topics/default/excl/subscriptions/s/consumers",
        json={"name": "other", "type": "exclusive"},
    )
    assert _error(second) == (409, "subscription_taken")
    assert (await consume_http.delete(f"/v1/consumers/{first}")).status_code == 204
    await _attach(consume_http, "default/excl/subscriptions/s", type="exclusive")


async def test_nack_with_delay_redelivers_with_count_one(consume_http: httpx.AsyncClient) -> None:
    cid = await _attach(consume_http, "default/retry/subscriptions/s", start="earliest")
    body = {"messages": [{"payload": "again"}]}
    assert (
        await consume_http.post("/v1/topics/default/retry/messages", json=body)
    ).status_code == 200
    (first,) = await _poll_until(consume_http, cid, 1)
    assert (first["payload"], first["redelivery_count"]) == ("again", 0)
    assert first["partition"] == "/default/retry"
    for partition in ("/default/other", "retry", "/default/retry-part-0x"):
        wrong = {"messages": [{"partition": partition, "offset": 0}]}
        refused = await consume_http.post(f"/v1/consumers/{cid}/ack", json=wrong)
        assert _error(refused) == (400, "invalid_partition"), partition
    nacked = await consume_http.post(
        f"/v1/consumers/{cid}/nack", json={"messages": _refs([first]), "delay_ms": 200}
    )
    assert nacked.status_code == 204, nacked.text
    (redelivered,) = await _poll_until(consume_http, cid, 1)
    assert _key(redelivered) == _key(first)
    assert (redelivered["payload"], redelivered["redelivery_count"]) == ("again", 1)


BAD_IDS = [
    "nodots",
    "a.b.c",
    "a.b.c.d.e",
    "a.b.c.",
    "a b.t.s.x",
    "default.t-part-0.s.abc",
    "d.t.s.x!",
]


async def test_a_malformed_consumer_id_is_400(consume_http: httpx.AsyncClient) -> None:
    refs = {"messages": [{"partition": "/default/t", "offset": 0}]}
    for cid in BAD_IDS:
        expected = (400, "invalid_consumer_id")
        assert _error(await consume_http.get(f"/v1/consumers/{cid}/messages")) == expected, cid
        assert _error(await consume_http.post(f"/v1/consumers/{cid}/ack", json=refs)) == expected, (
            cid
        )
        assert (
            _error(await consume_http.post(f"/v1/consumers/{cid}/nack", json=refs)) == expected
        ), cid
        assert _error(await consume_http.delete(f"/v1/consumers/{cid}")) == expected, cid


async def test_an_unknown_consumer_is_404(consume_http: httpx.AsyncClient) -> None:
    cid = await _attach(consume_http, "default/known/subscriptions/s")
    unknown = cid.rsplit(".", 1)[0] + ".0123456789abcdef"
    got = await consume_http.get(f"/v1/consumers/{unknown}/messages", params={"wait_ms": 0})
    assert _error(got) == (404, "consumer_not_found")
    refs = {"messages": [{"partition": "/default/known", "offset": 0}]}
    assert _error(await consume_http.post(f"/v1/consumers/{unknown}/ack", json=refs)) == (
        404,
        "consumer_not_found",
    )
    assert (await consume_http.delete(f"/v1/consumers/{cid}")).status_code == 204
    detached = await consume_http.get(f"/v1/consumers/{cid}/messages", params={"wait_ms": 0})
    assert _error(detached) == (404, "consumer_not_found")


async def test_poll_limits_out_of_range_are_400(consume_http: httpx.AsyncClient) -> None:
    bad: list[dict[str, Any]] = [
        {"max": 0},
        {"max": 1001},
        {"wait_ms": -1},
        {"wait_ms": 30_001},
        {"max": "x"},
    ]
    for params in bad:
        got = await consume_http.get("/v1/consumers/default.t.s.abc/messages", params=params)
        assert _error(got) == (400, "invalid_request"), params


async def test_bad_attach_bodies_are_400(consume_http: httpx.AsyncClient) -> None:
    path = "/v1/topics/default/t/subscriptions/s/consumers"
    assert _error(await consume_http.post(path, json={"name": "c", "type": "nope"}))[0] == 400
    assert (
        _error(await consume_http.post(path, json={"name": "c", "start": {"offset": -1}}))[0] == 400
    )
    assert _error(await consume_http.post(path, json={"name": ""}))[0] == 400
    bad_sub = "/v1/topics/default/t/subscriptions/a.b/consumers"
    assert _error(await consume_http.post(bad_sub, json={"name": "c"})) == (400, "invalid_name")

"""The read-only routes the admin console polls (peek, topic stats, placement) and the
console's files, on real NATS and etcd with ingest, dispatcher and discovery in-process:
peek reads the newest messages without moving any cursor, bounds its count, previews binary
as base64; stats count messages and bytes and report the subscriptions' backlog as the
listing does; the page is served with its security headers; with security off, whoami and
can allow everything (so the page shows every button)."""

from __future__ import annotations

import asyncio
import base64

import httpx
import pytest

from danube.security import Permission

pytestmark = pytest.mark.integration


async def _produce(http: httpx.AsyncClient, path: str, messages: list[dict[str, str]]) -> None:
    response = await http.post(f"/v1/topics/{path}/messages", json={"messages": messages})
    assert response.status_code == 200, response.text


async def test_peek_reads_the_newest_messages_and_moves_no_cursor(
    consume_http: httpx.AsyncClient,
) -> None:
    http = consume_http
    assert (await http.put("/v1/topics/default/peeked", json={"partitions": 2})).status_code == 201
    attach = await http.post(
        "/v1/topics/default/peeked/subscriptions/s/consumers",
        json={"name": "c", "type": "shared", "start": "earliest"},
    )
    assert attach.status_code == 201, attach.text
    await _produce(http, "default/peeked", [{"payload": f"m{i}"} for i in range(12)])
    binary = bytes([0xFF, 0x00, 0xFE])
    await _produce(
        http,
        "default/peeked",
        [{"payload": base64.b64encode(binary).decode(), "encoding": "base64", "key": "k"}],
    )

    peek = await http.get("/v1/topics/default/peeked/peek", params={"count": 5})
    assert peek.status_code == 200, peek.text
    doc = peek.json()
    assert doc["unavailable"] == []
    assert len(doc["messages"]) == 5
    newest = doc["messages"][0]
    assert (newest["encoding"], newest["key"], newest["size_bytes"]) == ("base64", "k", 3)
    assert base64.b64decode(newest["payload"]) == binary
    # One request's messages share a publish time: the newest by offset, over partitions.
    assert {m["payload"] for m in doc["messages"][1:]} == {"m11", "m10", "m9", "m8"}

    everything = (await http.get("/v1/topics/default/peeked/peek", params={"count": 100})).json()
    assert len(everything["messages"]) == 13
    for partition in ("/default/peeked-part-0", "/default/peeked-part-1"):
        offsets = sorted(m["offset"] for m in everything["messages"] if m["partition"] == partition)
        assert offsets == list(range(len(offsets)))

    # Read-only: the subscription's backlog is still every message.
    subs = (await http.get("/v1/topics/default/peeked/subscriptions")).json()
    assert subs["subscriptions"][0]["backlog"] == 13

    for bad in ({"count": 0}, {"count": 101}, {"count": "x"}):
        response = await http.get("/v1/topics/default/peeked/peek", params=bad)
        assert response.status_code == 400, bad
    assert (await http.get("/v1/topics/default/nothing/peek")).status_code == 404


async def test_peek_of_a_topic_never_produced_to_is_empty(
    consume_http: httpx.AsyncClient,
) -> None:
    # Created through the API: its partition is placed at once, and answers with nothing.
    assert (await consume_http.put("/v1/topics/default/quiet")).status_code == 201
    doc = (await consume_http.get("/v1/topics/default/quiet/peek")).json()
    assert (doc["messages"], doc["unavailable"]) == ([], [])
    # Created by a subscription: nobody owns its partition until a first produce, shown as
    # not answering rather than failing.
    attach = await consume_http.post(
        "/v1/topics/default/unowned/subscriptions/s/consumers",
        json={"name": "c", "type": "exclusive"},
    )
    assert attach.status_code == 201, attach.text
    doc = (await consume_http.get("/v1/topics/default/unowned/peek")).json()
    assert (doc["messages"], doc["unavailable"]) == ([], ["/default/unowned"])


async def test_stats_count_messages_bytes_and_backlog(consume_http: httpx.AsyncClient) -> None:
    http = consume_http
    attach = await http.post(
        "/v1/topics/default/counted/subscriptions/s/consumers",
        json={"name": "c", "type": "exclusive", "start": "earliest"},
    )
    assert attach.status_code == 201, attach.text
    first = (await http.get("/v1/topics/default/counted/stats")).json()
    await _produce(http, "default/counted", [{"payload": "x" * 100} for _ in range(4)])
    second = (await http.get("/v1/topics/default/counted/stats")).json()
    assert second["messages"] - (first["messages"] or 0) == 4
    assert second["bytes_written"] - (first["bytes_written"] or 0) >= 400
    assert second["time_ms"] >= first["time_ms"]
    assert second["subscriptions"] == 1
    listed = (await http.get("/v1/topics/default/counted/subscriptions")).json()
    assert second["backlog"] == listed["subscriptions"][0]["backlog"] == 4
    assert second["partitions"][0]["leader"] == "ingest-1"
    assert (await http.get("/v1/topics/default/none/stats")).status_code == 404


async def test_placement_counts_partitions_per_ingest_node(
    consume_http: httpx.AsyncClient,
) -> None:
    await _produce(consume_http, "default/placed", [{"payload": "a"}])
    async with asyncio.timeout(10):
        while True:
            doc = (await consume_http.get("/v1/console/placement")).json()
            if doc["nodes"] and doc["nodes"][0]["leader_of"] >= 1:
                break
            await asyncio.sleep(0.1)
    assert doc["nodes"][0]["node_id"] == "ingest-1"
    assert doc["nodes"][0]["replica_of"] == doc["partitions"] >= 1
    assert (doc["under_replicated"], doc["without_leader"], doc["truncated"]) == (0, 0, False)


async def test_console_files_are_served_with_their_security_headers(
    consume_http: httpx.AsyncClient,
) -> None:
    for path in ("/console", "/console/"):
        page = await consume_http.get(path)
        assert page.status_code == 200
        assert page.headers["content-type"].startswith("text/html")
        assert "/console/static/app.js" in page.text
        assert "default-src 'none'" in page.headers["content-security-policy"]
    script = await consume_http.get("/console/static/app.js")
    assert script.status_code == 200
    assert script.headers["content-type"].startswith("text/javascript")
    assert "Authorization" in script.text
    assert (await consume_http.get("/console/static/nope.js")).status_code == 404
    # No page may load from elsewhere (the console works offline).
    for name in ("app.js", "app.css"):
        text = (await consume_http.get(f"/console/static/{name}")).text
        assert "http://" not in text.replace("http://www.w3.org/2000/svg", "")
        assert "https://" not in text
    # The console is no API: not in the OpenAPI.
    paths = (await consume_http.get("/openapi.json")).json()["paths"]
    assert not any(p.startswith("/console") for p in paths)
    assert "/v1/topics/{ns}/{topic}/peek" in paths


async def test_whoami_with_security_off_allows_everything(consume_http: httpx.AsyncClient) -> None:
    # The console shows every page and button when security is off: the server says so.
    doc = (await consume_http.get("/v1/security/whoami?namespace=default&topic=t")).json()
    assert doc["security_enabled"] is False
    assert doc["principal"] == "anonymous"
    assert (doc["scope"], doc["resource"]) == ("topic", "/default/t")
    assert doc["permissions"] == [p.value for p in Permission]
    assert doc["grants"] == []
    can = (await consume_http.get("/v1/security/can?permission=ManageCluster")).json()
    assert can["allowed"] is True
    assert can["reason"] == "security off"

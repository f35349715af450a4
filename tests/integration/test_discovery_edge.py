"""The discovery API's edge on real NATS and etcd with ingest, dispatcher and discovery
in-process (issue 14, items 6-8): strict JSON types and bounds, the codes of bodies that do
not parse or are not JSON, Allow on 405, the OpenAPI's name patterns, the Host check, seek
of a non-reliable subscription, acks of messages not in flight, a stream's window across ack
timeouts, and an attach right after a delete fenced an idle subscription."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
import pytest
from websockets.asyncio.client import ClientConnection, connect

from tests.integration.conftest import ConsumeMesh

pytestmark = pytest.mark.integration

BIG = 2**64


def _error(response: httpx.Response) -> tuple[int, str]:
    return response.status_code, response.json()["error"]["code"]


async def _attach(http: httpx.AsyncClient, topic: str, **body: Any) -> str:
    response = await http.post(
        f"/v1/topics/default/{topic}/subscriptions/s/consumers", json={"name": "c"} | body
    )
    assert response.status_code == 201, response.text
    cid: str = response.json()["consumer_id"]
    return cid


async def _produce(http: httpx.AsyncClient, topic: str, count: int) -> None:
    body = {"messages": [{"payload": f"m{i}"} for i in range(count)]}
    response = await http.post(f"/v1/topics/default/{topic}/messages", json=body)
    assert response.status_code == 200, response.text


@asynccontextmanager
async def _stream(http: httpx.AsyncClient, cid: str) -> AsyncIterator[ClientConnection]:
    base = str(http.base_url).rstrip("/").replace("http://", "ws://", 1)
    async with connect(f"{base}/v1/consumers/{cid}/stream", proxy=None, close_timeout=2) as ws:
        yield ws


async def _frames_for(ws: ClientConnection, seconds: float) -> list[dict[str, Any]]:
    """Every frame that arrives within ``seconds``."""
    frames: list[dict[str, Any]] = []
    deadline = time.monotonic() + seconds
    while (left := deadline - time.monotonic()) > 0:
        try:
            async with asyncio.timeout(left):
                text = await ws.recv()
        except TimeoutError:
            break
        frames.append(json.loads(text))
    return frames


async def test_a_bool_or_a_string_is_not_an_integer(consume_http: httpx.AsyncClient) -> None:
    # Was: {"partitions": true} created a topic with 1 partition.
    for partitions in (True, "2", 1.0):
        response = await consume_http.put(
            "/v1/topics/default/strict", json={"partitions": partitions}
        )
        assert _error(response) == (400, "invalid_request"), response.text
        assert response.json()["error"]["message"].startswith("body.partitions:")
    assert _error(await consume_http.get("/v1/topics/default/strict")) == (404, "topic_not_found")
    response = await consume_http.post(
        "/v1/topics/default/strict/subscriptions/s/consumers",
        json={"name": "c", "start": {"offset": False}},
    )
    assert _error(response) == (400, "invalid_request"), response.text
    cid = await _attach(consume_http, "strict")
    async with _stream(consume_http, cid) as ws:
        await ws.send(json.dumps({"type": "flow", "credits": "10"}))  # a string is no count
        frame = json.loads(await ws.recv())
        assert frame["error"]["code"] == "invalid_frame", frame
        with pytest.raises(Exception):  # noqa: B017, PT011 (closed: the next recv raises)
            await ws.recv()
        assert ws.close_code == 1008


async def test_integers_past_their_range_are_400_naming_the_field(
    consume_http: httpx.AsyncClient,
) -> None:
    # Was: a plain-text 500 (the etcd encoding refused the integer), and unknown_field for
    # a timestamp past 64 bits.
    cases: list[tuple[str, str, dict[str, Any], str]] = [
        (
            "PUT",
            "/v1/namespaces/big",
            {"retention": {"time_minutes": BIG}},
            "retention.time_minutes",
        ),
        ("PUT", "/v1/namespaces/big", {"retention": {"size_mb": 2**80}}, "retention.size_mb"),
        (
            "PUT",
            "/v1/topics/default/big",
            {"retention": {"time_minutes": BIG}},
            "retention.time_minutes",
        ),
        ("PUT", "/v1/namespaces/big", {"max_topics": BIG}, "max_topics"),
        (
            "POST",
            "/v1/topics/default/big/subscriptions/s/consumers",
            {"name": "c", "start": {"timestamp_ms": BIG}},
            "start.timestamp_ms",
        ),
        (
            "POST",
            "/v1/topics/default/big/subscriptions/s/consumers",
            {"name": "c", "start": {"offset": 2**63}},
            "start.offset",
        ),
    ]
    for method, path, body, field in cases:
        response = await consume_http.request(method, path, json=body)
        assert _error(response) == (400, "invalid_request"), (path, body, response.text)
        assert response.json()["error"]["message"].startswith(f"body.{field}:"), response.text
    assert _error(await consume_http.get("/v1/namespaces/big")) == (404, "namespace_not_found")
    assert _error(await consume_http.get("/v1/topics/default/big")) == (404, "topic_not_found")
    cid = await _attach(consume_http, "big2")
    response = await consume_http.post(
        f"/v1/consumers/{cid}/ack",
        json={"messages": [{"partition": "/default/big2", "offset": BIG}]},
    )
    assert _error(response) == (400, "invalid_request")
    assert response.json()["error"]["message"].startswith("body.messages.0.offset:")


async def test_bodies_that_do_not_parse_are_invalid_json(consume_http: httpx.AsyncClient) -> None:
    # Was: 400 http_error, a code the docs do not have.
    headers = {"content-type": "application/json"}
    bodies = {
        b'{"partitions": "\xff\xfe"}': "UTF-8",
        b"[" * 10_000 + b"]" * 10_000: "nested too deeply",
        b'{"partitions": 1': "",
    }
    for body, said in bodies.items():
        response = await consume_http.put("/v1/topics/default/parse", content=body, headers=headers)
        assert _error(response) == (400, "invalid_json"), response.text
        assert said in response.json()["error"]["message"]
    assert _error(await consume_http.get("/v1/topics/default/parse")) == (404, "topic_not_found")


async def test_a_body_not_sent_as_json_is_415_saying_so(consume_http: httpx.AsyncClient) -> None:
    # Was: 400 "body: Input should be a valid dictionary or object" (no word of the type).
    body = b'{"partitions": 1}'
    for headers in ({"content-type": "text/plain"}, {}):
        response = await consume_http.put("/v1/topics/default/typed", content=body, headers=headers)
        assert _error(response) == (415, "unsupported_media_type"), response.text
        assert "Content-Type: application/json" in response.json()["error"]["message"]
    # An optional body may be left out, whatever the type says.
    response = await consume_http.put(
        "/v1/topics/default/typed", headers={"content-type": "text/plain"}
    )
    assert response.status_code == 201, response.text


async def test_405_answers_allow_every_method_of_the_path(consume_http: httpx.AsyncClient) -> None:
    # Was: no Allow header.
    expected = {
        "/v1/namespaces/default": "DELETE, GET, PATCH, PUT",
        "/v1/topics/default/t": "DELETE, GET, PATCH, PUT",
        "/v1/consumers/default.t.s.x/ack": "POST",
        "/healthz": "GET",
    }
    for path, allow in expected.items():
        response = await consume_http.request("TRACE", path)
        assert _error(response) == (405, "method_not_allowed"), response.text
        assert response.headers["allow"] == allow, path


async def test_the_openapi_carries_the_name_and_consumer_id_patterns(
    consume_http: httpx.AsyncClient,
) -> None:
    spec = (await consume_http.get("/openapi.json")).json()
    params = {
        p["name"]: p["schema"]
        for op in spec["paths"]["/v1/topics/{ns}/{topic}/subscriptions/{sub}/consumers"].values()
        for p in op["parameters"]
    }
    assert params["ns"]["pattern"] == params["sub"]["pattern"] == "^[A-Za-z0-9_-]+$"
    assert params["ns"]["maxLength"] == 255
    assert "-part-" in params["topic"]["pattern"]
    cid = spec["paths"]["/v1/consumers/{cid}/messages"]["get"]["parameters"][0]["schema"]
    assert cid["pattern"].count("\\.") == 3
    answers = [set(op["responses"]) for path in spec["paths"].values() for op in path.values()]
    assert all("422" not in codes and "400" in codes for codes in answers)


async def test_a_host_not_allowed_is_refused(consume_http: httpx.AsyncClient) -> None:
    # Was: any Host served (a DNS-rebinding page could drive the local API).
    port = consume_http.base_url.port
    for host in ("evil.example", f"evil.example:{port}", "127.0.0.2"):
        response = await consume_http.get("/v1/namespaces", headers={"host": host})
        assert _error(response) == (400, "host_not_allowed"), host
        assert "discovery.allowed_hosts" in response.json()["error"]["message"]
    for host in ("localhost", f"localhost:{port}", f"127.0.0.1:{port}", f"[::1]:{port}"):
        response = await consume_http.get("/v1/namespaces", headers={"host": host})
        assert response.status_code == 200, host
    # Probes and scrapers reach a node by any name.
    assert (await consume_http.get("/healthz", headers={"host": "10.0.0.7"})).status_code == 200
    cid = await _attach(consume_http, "hosts")
    upgrade = {
        "connection": "Upgrade",
        "upgrade": "websocket",
        "sec-websocket-version": "13",
        "sec-websocket-key": "dGhlIHNhbXBsZSBub25jZQ==",
    }
    response = await consume_http.get(
        f"/v1/consumers/{cid}/stream", headers={**upgrade, "host": "evil.example"}
    )
    assert response.status_code == 403  # refused before it opens
    async with _stream(consume_http, cid) as ws:  # from an allowed host it opens
        await ws.send(json.dumps({"type": "flow", "credits": 1}))


async def test_a_seek_of_a_non_reliable_subscription_is_400(
    consume_http: httpx.AsyncClient,
) -> None:
    # Was: 500 unsupported_operation.
    response = await consume_http.put("/v1/topics/default/fast", json={"dispatch": "non_reliable"})
    assert response.status_code == 201, response.text
    await _attach(consume_http, "fast")
    response = await consume_http.post(
        "/v1/topics/default/fast/subscriptions/s/seek", json={"position": "earliest"}
    )
    assert _error(response) == (400, "unsupported_operation"), response.text


async def test_an_ack_answers_the_messages_that_were_not_in_flight(
    consume_http: httpx.AsyncClient,
) -> None:
    # Was: 204 whatever was acked, and acks of messages never delivered silently ignored.
    await consume_http.put("/v1/topics/default/acks", json={"partitions": 2})
    cid = await _attach(consume_http, "acks", start="earliest", type="shared")
    await _produce(consume_http, "acks", 6)
    polled: list[dict[str, Any]] = []
    async with asyncio.timeout(10):
        while not polled:
            response = await consume_http.get(f"/v1/consumers/{cid}/messages", params={"max": 1})
            polled = response.json()["messages"]
    got = polled[0]
    part = got["partition"]
    never = [{"partition": part, "offset": 99}, {"partition": "/default/acks-part-7", "offset": 0}]
    body = {"messages": [{"partition": part, "offset": got["offset"]}, *never]}
    response = await consume_http.post(f"/v1/consumers/{cid}/ack", json=body)
    assert response.status_code == 200, response.text
    assert response.json() == {"not_in_flight": never}
    # Acking again what was acked is fine: nothing to tell.
    again = {"messages": [{"partition": part, "offset": got["offset"]}]}
    assert (await consume_http.post(f"/v1/consumers/{cid}/ack", json=again)).status_code == 204
    # Over a stream, the same news comes as an error frame, and the stream goes on.
    async with _stream(consume_http, cid) as ws:
        await ws.send(json.dumps({"type": "ack", "messages": never}))
        frame = json.loads(await ws.recv())
        assert frame["error"]["code"] == "not_in_flight", frame
        assert "acks-part-7@0" in frame["error"]["message"]
        await ws.send(json.dumps({"type": "flow", "credits": 1}))
        assert json.loads(await ws.recv())["type"] == "message"


async def test_a_stream_that_never_acks_gets_no_more_than_its_window(
    consume_mesh: ConsumeMesh,
) -> None:
    # Was: after the ack timeout the taken-back messages left the window, so a consumer
    # that never acked was pushed a new window of fresh messages every ack timeout.
    window, ack_timeout_s = 20, 1.0
    async with consume_mesh(ack_timeout_s=ack_timeout_s, max_unacked_per_consumer=window) as http:
        cid = await _attach(http, "window", start="earliest")
        await _produce(http, "window", 3 * window)
        async with _stream(http, cid) as ws:
            await ws.send(json.dumps({"type": "flow", "credits": 5 * window}))
            # Long enough for two ack timeouts and their redeliveries (backoff 0.1-0.2 s).
            frames = await _frames_for(ws, 2 * ack_timeout_s + 2.0)
    messages = [f for f in frames if f["type"] == "message"]
    assert {m["offset"] for m in messages} == set(range(window)), sorted(
        m["offset"] for m in messages
    )
    assert max(m["redelivery_count"] for m in messages) >= 1  # they did come again


async def test_an_attach_right_after_a_delete_fenced_an_idle_subscription_is_served(
    consume_http: httpx.AsyncClient,
) -> None:
    # Was: 503 not_owner after discovery.produce_timeout_s: the dispatcher that had claimed
    # the subscription (a poll of an unknown consumer) kept answering from a fenced claim.
    assert (await consume_http.put("/v1/topics/default/gone", json={})).status_code == 201
    response = await consume_http.get(
        "/v1/consumers/default.gone.s.x/messages", params={"wait_ms": 0}
    )
    assert _error(response) == (404, "consumer_not_found")
    assert (await consume_http.delete("/v1/topics/default/gone")).status_code == 204
    started = time.monotonic()
    await _attach(consume_http, "gone")
    assert time.monotonic() - started < 5.0

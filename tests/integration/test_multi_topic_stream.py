"""Many topics in one subscription over HTTP (WebSocket GET /v1/namespaces/{ns}/subscriptions/
{sub}/stream, docs/http-api.md "Consume many topics") on real NATS and etcd with ingest,
dispatcher and discovery in-process: a regex and a list, topics created later joined within 10 s
(measured), deliveries of several topics each naming its topic, acks and nacks going to their
own topic, a bad regex refused (4400), the topic limit (4400 / 4409 / an error frame), the
consumers detached when the socket closes, a deleted topic left (room for another), a deep
backlog not holding back another topic (binary delivery batches), refusals at the open, and RBAC
(a pattern skips topics the principal may not read, a list naming one is refused)."""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import httpx
import pytest
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed
from websockets.typing import Subprotocol

from danube.discovery import app as discovery_app
from danube.dispatcher import app as dispatcher_app
from danube.frame import decode_record
from danube.ingest import app as ingest_app
from danube.runtime.service import run_in_process
from danube.wire import delivery
from tests.integration.conftest import MeshSettings
from tests.integration.test_security_api import ADMIN, secured_mesh
from tests.readiness import until_ready

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

FRAME_TIMEOUT_S = 10.0
JOIN_WITHIN_S = 10.0  # the bound on joining a topic created later
QUIET_S = 0.5  # "no more frames" means none within this long
SETTLE_TIMEOUT_S = 10.0


def _url(base: str, ns: str, sub: str, **query: str) -> str:
    ws = base.rstrip("/").replace("http://", "ws://", 1)
    return f"{ws}/v1/namespaces/{ns}/subscriptions/{sub}/stream?{urlencode(query)}"


@asynccontextmanager
async def _stream(
    http: httpx.AsyncClient, headers: dict[str, str] | None = None, **query: str
) -> AsyncIterator[ClientConnection]:
    url = _url(str(http.base_url), "default", "s", **({"name": "c"} | query))
    async with connect(url, proxy=None, close_timeout=2, additional_headers=headers) as ws:
        yield ws


async def _send(ws: ClientConnection, **frame: Any) -> None:
    await ws.send(json.dumps(frame))


async def _frame(ws: ClientConnection, timeout_s: float = FRAME_TIMEOUT_S) -> dict[str, Any]:
    async with asyncio.timeout(timeout_s):
        text = await ws.recv()
    assert isinstance(text, str), text
    frame: dict[str, Any] = json.loads(text)
    return frame


async def _messages(
    ws: ClientConnection, count: int, timeout_s: float = FRAME_TIMEOUT_S
) -> list[dict[str, Any]]:
    frames = [await _frame(ws, timeout_s) for _ in range(count)]
    assert [f["type"] for f in frames] == ["message"] * count, frames
    return frames


async def _quiet(ws: ClientConnection) -> None:
    try:
        async with asyncio.timeout(QUIET_S):
            frame = await ws.recv()
    except TimeoutError:
        return
    raise AssertionError(f"expected no frame, got {frame!r}")


async def _ended(ws: ClientConnection) -> tuple[str, int]:
    """The code of the error frame that ends the stream, and the close code after it."""
    frame = await _frame(ws)
    assert frame["type"] == "error", frame
    with pytest.raises(ConnectionClosed) as closed:
        async with asyncio.timeout(FRAME_TIMEOUT_S):
            await ws.recv()
    assert closed.value.rcvd is not None, "closed without a close frame"
    return frame["error"]["code"], closed.value.rcvd.code


async def _create(
    http: httpx.AsyncClient, topic: str, partitions: int = 0, headers: dict[str, str] | None = None
) -> None:
    body = {"partitions": partitions}
    answer = await http.put(f"/v1/topics/default/{topic}", json=body, headers=headers)
    assert answer.status_code == 201, answer.text


async def _produce(
    http: httpx.AsyncClient, topic: str, *payloads: str, headers: dict[str, str] | None = None
) -> None:
    body = {"messages": [{"payload": p} for p in payloads]}
    answer = await http.post(f"/v1/topics/default/{topic}/messages", json=body, headers=headers)
    assert answer.status_code == 200, answer.text


async def _subscription(http: httpx.AsyncClient, topic: str) -> dict[str, Any]:
    answer = await http.get(f"/v1/topics/default/{topic}/subscriptions")
    assert answer.status_code == 200, answer.text
    (sub,) = [s for s in answer.json()["subscriptions"] if s["name"] == "s"]
    return dict(sub)


async def _until(check: Any, what: str) -> None:
    """Wait (polling, bounded) until ``await check()`` is true."""
    deadline = time.monotonic() + SETTLE_TIMEOUT_S
    while not await check():
        assert time.monotonic() < deadline, f"not within {SETTLE_TIMEOUT_S} s: {what}"
        await asyncio.sleep(0.1)


async def _joined_gauge(http: httpx.AsyncClient) -> float:
    """danube_discovery_stream_topics_joined as /metrics answers it."""
    text = (await http.get("/metrics")).text
    (value,) = re.findall(r"^danube_discovery_stream_topics_joined (\S+)$", text, re.M)
    return float(value)


def _refs(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{"partition": m["partition"], "offset": m["offset"]} for m in messages]


async def test_a_pattern_stream_joins_a_topic_created_later_and_acks_go_to_each_topic(
    consume_http: httpx.AsyncClient,
) -> None:
    http = consume_http
    for name in ("mt-a", "mt-b", "other"):
        await _create(http, name)
    async with _stream(http, topics_pattern="(") as ws:
        assert await _ended(ws) == ("invalid_pattern", 4400)
    async with _stream(http, topics_pattern="mt-.*", type="shared", start="earliest") as ws:
        await _send(ws, type="flow", credits=100)
        await _produce(http, "mt-a", "a1")
        await _produce(http, "other", "o1")
        await _produce(http, "mt-b", "b1")
        first = await _messages(ws, 2)
        assert {(m["topic"], m["partition"], m["payload"]) for m in first} == {
            ("/default/mt-a", "/default/mt-a", "a1"),
            ("/default/mt-b", "/default/mt-b", "b1"),
        }
        # Created after the stream opened, then produced to at once: read from its start.
        created = time.monotonic()
        await _create(http, "mt-late", partitions=2)
        await _produce(http, "mt-late", "late1", "late2")
        late = await _messages(ws, 2, timeout_s=JOIN_WITHIN_S + 5)
        joined_s = time.monotonic() - created
        assert sorted(m["payload"] for m in late) == ["late1", "late2"]
        assert {m["topic"] for m in late} == {"/default/mt-late"}
        assert {m["partition"].rsplit("-part-", 1)[0] for m in late} == {"/default/mt-late"}
        assert joined_s < JOIN_WITHIN_S, joined_s
        await _quiet(ws)  # "other" never joins

        # One ack frame naming three topics: each ref goes to its own topic's consumer.
        await _send(ws, type="ack", messages=_refs(first + late))
        for topic in ("mt-a", "mt-b", "mt-late"):

            async def acked(topic: str = topic) -> bool:
                return bool((await _subscription(http, topic))["backlog"] == 0)

            await _until(acked, f"{topic} acked")
        # A ref of a topic the stream does not read is refused; the stream goes on.
        await _send(ws, type="ack", messages=[{"partition": "/default/other", "offset": 0}])
        frame = await _frame(ws)
        assert (frame["type"], frame["error"]["code"]) == ("error", "invalid_partition")
        assert len((await _subscription(http, "mt-a"))["consumers"]) == 1
        assert await _joined_gauge(http) == 3
        print(f"\nmany-topics stream: a topic created later was read {joined_s:.2f} s after")

    async def detached() -> bool:
        subs = [await _subscription(http, t) for t in ("mt-a", "mt-b", "mt-late")]
        return all(not s["consumers"] for s in subs)

    await _until(detached, "the stream's consumers detached when it closed")
    assert await _joined_gauge(http) == 0


async def test_a_list_stream_waits_for_a_named_topic_and_nacks_go_to_their_topic(
    consume_http: httpx.AsyncClient,
) -> None:
    http = consume_http
    await _create(http, "listed-1")
    await _create(http, "unlisted")
    async with _stream(http, topics="listed-1,listed-2", start="earliest") as ws:
        await _send(ws, type="flow", credits=10)
        await _create(http, "listed-2")
        await _produce(http, "listed-2", "two")
        await _produce(http, "listed-1", "one")
        await _produce(http, "unlisted", "no")
        got = await _messages(ws, 2, timeout_s=JOIN_WITHIN_S + 5)
        by_topic = {m["topic"]: m for m in got}
        assert {t: m["payload"] for t, m in by_topic.items()} == {
            "/default/listed-1": "one",
            "/default/listed-2": "two",
        }
        # A nack comes back from its own topic, once more; the other is acked.
        await _send(ws, type="nack", messages=_refs([by_topic["/default/listed-2"]]))
        await _send(ws, type="ack", messages=_refs([by_topic["/default/listed-1"]]))
        (again,) = await _messages(ws, 1)
        assert (again["topic"], again["payload"], again["redelivery_count"]) == (
            "/default/listed-2",
            "two",
            1,
        )
        await _quiet(ws)


@asynccontextmanager
async def _small_mesh(mesh_settings: MeshSettings) -> AsyncIterator[httpx.AsyncClient]:
    """The consume mesh with streams of at most 2 topics, refreshed every 0.5 s."""
    settings = mesh_settings()
    discovery = settings.discovery.model_copy(
        update={"stream_topics_max": 2, "stream_topics_refresh_s": 0.5}
    )
    settings = settings.model_copy(update={"discovery": discovery})
    base_url = f"http://127.0.0.1:{settings.discovery.port}"
    async with (
        run_in_process(ingest_app.serve, settings, "ingest-1", must_stop_cleanly=True),
        run_in_process(dispatcher_app.serve, settings, "disp-1", must_stop_cleanly=True),
        run_in_process(discovery_app.serve, settings, "disc-1", must_stop_cleanly=True) as task,
        httpx.AsyncClient(base_url=base_url, timeout=30) as http,
    ):
        await until_ready(http, task)
        yield http


async def test_the_topic_limit_refuses_a_stream_or_tells_of_a_topic_left_out(
    mesh_settings: MeshSettings,
) -> None:
    async with _small_mesh(mesh_settings) as http:
        for name in ("lim-a", "lim-b"):
            await _create(http, name)
        async with _stream(http, topics="lim-a,lim-b,lim-c") as ws:
            assert await _ended(ws) == ("invalid_request", 4400)
        async with _stream(http, topics_pattern="lim-.*", start="earliest") as ws:
            await _send(ws, type="flow", credits=10)
            await _create(http, "lim-c")  # a third match: told, not joined
            frame = await _frame(ws)
            assert (frame["type"], frame["error"]["code"]) == ("error", "too_many_topics")
            assert "lim-c" in frame["error"]["message"]
            await _produce(http, "lim-c", "c")
            await _produce(http, "lim-a", "a")
            (only,) = await _messages(ws, 1)
            assert only["topic"] == "/default/lim-a"
            await _quiet(ws)
            # lim-a deleted: the stream leaves it, which makes room for lim-c, read from its
            # start; a ref of lim-a is no longer the stream's.
            answer = await http.delete("/v1/topics/default/lim-a")
            assert answer.status_code == 204, answer.text
            (late,) = await _messages(ws, 1)
            assert (late["topic"], late["payload"]) == ("/default/lim-c", "c")
            await _send(ws, type="ack", messages=_refs([only]))
            frame = await _frame(ws)
            assert (frame["type"], frame["error"]["code"]) == ("error", "invalid_partition")
        await _create(http, "lim-d")
        async with _stream(http, topics_pattern="lim-.*") as ws:  # 3 match now
            assert await _ended(ws) == ("too_many_topics", 4409)


async def test_a_pattern_skips_topics_the_principal_may_not_read_and_a_list_is_refused(
    mesh_settings: MeshSettings, tmp_path: Path
) -> None:
    async with secured_mesh(mesh_settings, tmp_path) as mesh, mesh.client(ADMIN) as root:
        http = mesh.http
        admin = mesh.auth(ADMIN)
        for name in ("sec-a", "sec-b"):
            await _create(http, name, headers=admin)
        await root.security.create_role("reader", ["Consume"])
        await root.security.create_binding(
            "app-a", principal="app", roles=["reader"], scope="topic", resource="/default/sec-a"
        )
        app = mesh.auth("app")

        async def bound() -> bool:
            query = "permission=Consume&namespace=default&topic=sec-a"
            answer = await http.get(f"/v1/security/can?{query}", headers=app)
            return bool(answer.json()["allowed"])

        await _until(bound, "the binding seen by discovery")
        async with _stream(http, app, topics="sec-a,sec-b") as ws:
            assert await _ended(ws) == ("permission_denied", 4403)
        async with _stream(http, app, topics="sec-a,sec-not-yet") as ws:  # not created yet
            assert await _ended(ws) == ("permission_denied", 4403)
        async with _stream(http, topics_pattern="sec-.*") as ws:  # no token
            assert await _ended(ws) == ("unauthenticated", 4401)
        async with _stream(http, app, topics_pattern="sec-.*", start="earliest") as ws:
            await _send(ws, type="flow", credits=10)
            await _produce(http, "sec-b", "secret", headers=admin)
            await _produce(http, "sec-a", "public", headers=admin)
            (only,) = await _messages(ws, 1)
            assert (only["topic"], only["payload"]) == ("/default/sec-a", "public")
            await _quiet(ws)


async def test_a_deep_backlog_does_not_hold_back_another_topic_and_frames_come_binary(
    consume_http: httpx.AsyncClient,
) -> None:
    """2000 messages wait on one topic, 5 on another: with 100 credits at a time (acked and
    granted again as they come), the 5 come among the first 200, not after the 2000."""
    http = consume_http
    await _create(http, "fair-deep")
    await _create(http, "fair-quiet")
    await _produce(http, "fair-deep", *(f"d{i}" for i in range(2000)))
    await _produce(http, "fair-quiet", *(f"q{i}" for i in range(5)))
    url = _url(str(http.base_url), "default", "s", name="c", topics_pattern="fair-.*")
    url += "&start=earliest"
    seen: list[tuple[str, str]] = []  # (partition, payload) in arrival order
    async with connect(
        url, proxy=None, close_timeout=2, subprotocols=[Subprotocol(delivery.SUBPROTOCOL)]
    ) as ws:
        assert ws.subprotocol == delivery.SUBPROTOCOL
        await _send(ws, type="flow", credits=100)
        while sum(p == "/default/fair-quiet" for p, _ in seen) < 5 and len(seen) < 2005:
            async with asyncio.timeout(FRAME_TIMEOUT_S):
                body = await ws.recv()
            assert isinstance(body, bytes), body
            batch = delivery.decode_batch(body)
            assert len({m.partition for m in batch}) == 1  # one topic's poll a batch
            seen += [(m.partition, decode_record(m.record).payload.decode()) for m in batch]
            refs = [{"partition": m.partition, "offset": m.offset} for m in batch]
            await _send(ws, type="ack", messages=refs)
            await _send(ws, type="flow", credits=len(batch))
    quiet = [i for i, (p, _) in enumerate(seen) if p == "/default/fair-quiet"]
    assert [seen[i][1] for i in quiet] == [f"q{i}" for i in range(5)]
    assert quiet[-1] < 200, quiet
    deep = [payload for p, payload in seen if p == "/default/fair-deep"]
    assert deep == [f"d{i}" for i in range(len(deep))]  # in offset order
    print(f"\nmany-topics stream: the 5 quiet messages came at positions {quiet}")


async def test_refusals_at_the_open(consume_http: httpx.AsyncClient) -> None:
    http = consume_http
    cases: list[tuple[dict[str, str], str, int]] = [
        ({"topics": "a", "bogus": "1"}, "unknown_field", 4400),
        ({"topics": "a", "topics_pattern": "a"}, "invalid_request", 4400),
        ({"topics": "a", "type": "sometimes"}, "invalid_request", 4400),
        ({"topics": "a,b.c"}, "invalid_name", 4400),
        ({"topics_pattern": "x" * 513}, "invalid_pattern", 4400),
    ]
    for query, code, close in cases:
        async with _stream(http, None, **query) as ws:
            assert await _ended(ws) == (code, close), query
    url = _url(str(http.base_url), "nowhere", "s", name="c", topics_pattern=".*")
    async with connect(url, proxy=None, close_timeout=2) as ws:
        assert await _ended(ws) == ("namespace_not_found", 4404)
    # An exclusive subscription taken on one topic refuses the stream; nothing stays attached.
    await _create(http, "taken-a")
    await _create(http, "taken-b")
    answer = await http.post(
        "/v1/topics/default/taken-b/subscriptions/s/consumers", json={"name": "other"}
    )
    assert answer.status_code == 201, answer.text
    async with _stream(http, topics_pattern="taken-.*") as ws:
        assert await _ended(ws) == ("subscription_taken", 4409)

    async def none_left() -> bool:
        return not (await _subscription(http, "taken-a"))["consumers"]

    await _until(none_left, "the consumer attached on taken-a detached")

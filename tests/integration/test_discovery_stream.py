"""The consumer stream (WebSocket GET /v1/consumers/{id}/stream) on real NATS and etcd with
ingest, dispatcher and discovery in-process: credits bound the push, acks and nacks over the
socket, a closed socket keeps its consumer, and bad frames or consumers end the stream with
an error frame and a close code."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any

import httpx
import pytest
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed

pytestmark = pytest.mark.integration

FRAME_TIMEOUT_S = 10.0
QUIET_S = 0.5  # "no more frames" means none within this long


@asynccontextmanager
async def _stream(http: httpx.AsyncClient, cid: str) -> AsyncIterator[ClientConnection]:
    base = str(http.base_url).rstrip("/").replace("http://", "ws://", 1)
    async with connect(f"{base}/v1/consumers/{cid}/stream", proxy=None, close_timeout=2) as ws:
        yield ws


async def _attach(http: httpx.AsyncClient, topic: str, **body: Any) -> str:
    response = await http.post(
        f"/v1/topics/default/{topic}/subscriptions/s/consumers", json={"name": "c", **body}
    )
    assert response.status_code == 201, response.text
    cid: str = response.json()["consumer_id"]
    return cid


async def _produce(http: httpx.AsyncClient, topic: str, payloads: list[str]) -> None:
    body = {"messages": [{"payload": p} for p in payloads], "producer": "p1"}
    response = await http.post(f"/v1/topics/default/{topic}/messages", json=body)
    assert response.status_code == 200, response.text
    offsets = [r["offset"] for r in response.json()["results"]]
    assert offsets == sorted(offsets), offsets


async def _send(ws: ClientConnection, **frame: Any) -> None:
    await ws.send(json.dumps(frame))


async def _frame(ws: ClientConnection) -> dict[str, Any]:
    async with asyncio.timeout(FRAME_TIMEOUT_S):
        text = await ws.recv()
    assert isinstance(text, str), text
    frame: dict[str, Any] = json.loads(text)
    return frame


async def _messages(ws: ClientConnection, count: int) -> list[dict[str, Any]]:
    frames = [await _frame(ws) for _ in range(count)]
    assert [f["type"] for f in frames] == ["message"] * count, frames
    return frames


async def _quiet(ws: ClientConnection) -> None:
    """Nothing arrives within QUIET_S (cancelling recv loses nothing)."""
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
    assert set(frame["error"]) == {"code", "message"}, frame
    with pytest.raises(ConnectionClosed) as closed:
        async with asyncio.timeout(FRAME_TIMEOUT_S):
            await ws.recv()
    assert closed.value.rcvd is not None, "closed without a close frame"
    return frame["error"]["code"], closed.value.rcvd.code


def _refs(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{"partition": m["partition"], "offset": m["offset"]} for m in messages]


async def test_credits_bound_the_push_and_more_credits_bring_the_rest_in_order(
    consume_http: httpx.AsyncClient,
) -> None:
    payloads = [f"m{i}" for i in range(12)]
    await _produce(consume_http, "flow", payloads)
    cid = await _attach(consume_http, "flow", start="earliest")
    async with _stream(consume_http, cid) as ws:
        await _quiet(ws)  # no credits yet: nothing
        await _send(ws, type="flow", credits=5)
        first = await _messages(ws, 5)
        await _quiet(ws)  # the 6th waits for a credit
        await _send(ws, type="flow", credits=3)
        second = await _messages(ws, 3)
        await _quiet(ws)
        await _send(ws, type="flow", credits=100)
        rest = await _messages(ws, 4)
        await _quiet(ws)  # 96 credits left, nothing more to send

    got = first + second + rest
    assert [m["offset"] for m in got] == list(range(12))
    assert [m["payload"] for m in got] == payloads
    assert got[0] == {
        "type": "message",
        "partition": "/default/flow",
        "offset": 0,
        "payload": "m0",
        "encoding": "utf8",
        "key": None,
        "attributes": {},
        "publish_time_ms": got[0]["publish_time_ms"],
        "producer": "p1",
        "redelivery_count": 0,
        "schema_id": None,
        "schema_version": None,
    }
    assert got[0]["publish_time_ms"] > 0


async def test_acks_over_the_socket_are_not_delivered_again(
    consume_http: httpx.AsyncClient,
) -> None:
    await _produce(consume_http, "acked", [f"a{i}" for i in range(6)])
    cid = await _attach(consume_http, "acked", type="shared", start="earliest")
    async with _stream(consume_http, cid) as ws:
        await _send(ws, type="flow", credits=6)
        got = await _messages(ws, 6)
        acked, unacked = got[:4], got[4:]
        await _send(ws, type="ack", messages=_refs(acked))
        # Frames are handled in order, each ack answered by the dispatcher before the next
        # frame is read: the error frame of this bad ack says the good one is done.
        await _send(ws, type="ack", messages=[{"partition": "/default/other", "offset": 0}])
        error = await _frame(ws)
        assert (error["type"], error["error"]["code"]) == ("error", "invalid_partition")

    assert (await consume_http.delete(f"/v1/consumers/{cid}")).status_code == 204
    again = await _attach(consume_http, "acked", type="shared")
    async with _stream(consume_http, again) as ws:
        await _send(ws, type="flow", credits=10)
        regot = await _messages(ws, 2)
        await _quiet(ws)
    assert [(m["offset"], m["payload"]) for m in regot] == [
        (m["offset"], m["payload"]) for m in unacked
    ]


async def test_nack_over_the_socket_redelivers_with_count_one(
    consume_http: httpx.AsyncClient,
) -> None:
    await _produce(consume_http, "retry", ["again", "next"])
    cid = await _attach(consume_http, "retry", start="earliest")
    async with _stream(consume_http, cid) as ws:
        await _send(ws, type="flow", credits=1)
        (first,) = await _messages(ws, 1)
        assert (first["offset"], first["payload"], first["redelivery_count"]) == (0, "again", 0)
        # Due at once, and due redeliveries go before fresh messages.
        await _send(ws, type="nack", messages=_refs([first]))
        await _send(ws, type="flow", credits=1)
        (redelivered,) = await _messages(ws, 1)
        assert (redelivered["partition"], redelivered["offset"]) == ("/default/retry", 0)
        assert (redelivered["payload"], redelivered["redelivery_count"]) == ("again", 1)
        await _quiet(ws)  # the credit went to the redelivery; "next" waits for another

        # Delayed: the fresh message comes first, the redelivery once due.
        await _send(ws, type="nack", messages=_refs([redelivered]), delay_ms=300)
        await _send(ws, type="flow", credits=2)
        following, again = await _messages(ws, 2)
        assert (following["offset"], following["payload"], following["redelivery_count"]) == (
            1,
            "next",
            0,
        )
        assert (again["offset"], again["payload"], again["redelivery_count"]) == (0, "again", 2)


async def test_a_non_reliable_topic_streams_too(consume_http: httpx.AsyncClient) -> None:
    created = await consume_http.put("/v1/topics/default/live", json={"dispatch": "non_reliable"})
    assert created.status_code == 201, created.text
    cid = await _attach(consume_http, "live")
    async with _stream(consume_http, cid) as ws:
        await _send(ws, type="flow", credits=2)
        await _produce(consume_http, "live", ["n0", "n1", "n2"])
        got = await _messages(ws, 2)
        await _quiet(ws)  # n2 waits in the consumer's buffer for a credit
    assert [m["payload"] for m in got] == ["n0", "n1"]


async def test_closing_the_socket_keeps_the_consumer(consume_http: httpx.AsyncClient) -> None:
    await _produce(consume_http, "keep", ["k0", "k1", "k2"])
    cid = await _attach(consume_http, "keep", start="earliest")
    async with _stream(consume_http, cid) as ws:
        await _send(ws, type="flow", credits=1)
        (first,) = await _messages(ws, 1)
    async with _stream(consume_http, cid) as ws:  # the same consumer, credits start at 0
        await _quiet(ws)
        await _send(ws, type="flow", credits=1)
        (second,) = await _messages(ws, 1)
    polled = await consume_http.get(f"/v1/consumers/{cid}/messages", params={"wait_ms": 2000})
    assert polled.status_code == 200, polled.text
    assert [(m["offset"], m["payload"]) for m in [first, second, *polled.json()["messages"]]] == [
        (0, "k0"),
        (1, "k1"),
        (2, "k2"),
    ]


async def test_a_stream_without_credits_keeps_its_consumer_alive(
    consume_mesh: Callable[..., AbstractAsyncContextManager[httpx.AsyncClient]],
) -> None:
    async with consume_mesh(consumer_session_timeout_s=1.0) as http:
        streamed = await _attach(http, "idle", type="shared")
        polled = await _attach(http, "idle", type="shared")
        async with _stream(http, streamed) as ws:
            await asyncio.sleep(2.5)  # idle, no credits: only the keep-alive speaks for it
            # The consumer that only long-polls expired meanwhile: the timeout is real.
            gone = await http.get(f"/v1/consumers/{polled}/messages", params={"wait_ms": 0})
            assert (gone.status_code, gone.json()["error"]["code"]) == (404, "consumer_not_found")
            await _produce(http, "idle", ["late"])
            await _send(ws, type="flow", credits=1)
            (message,) = await _messages(ws, 1)
            assert message["payload"] == "late"


MALFORMED: list[tuple[str | bytes, str]] = [
    ("not json", "invalid_json"),
    ("[1, 2]", "invalid_frame"),
    ('{"credits": 1}', "invalid_frame"),
    ('{"type": "subscribe"}', "invalid_frame"),
    ('{"type": "flow"}', "invalid_frame"),
    ('{"type": "flow", "credits": 0}', "invalid_frame"),
    ('{"type": "flow", "credits": 10001}', "invalid_frame"),
    ('{"type": "flow", "credits": "five"}', "invalid_frame"),
    ('{"type": "flow", "credits": 1, "window": 2}', "unknown_field"),
    ('{"type": "ack", "messages": []}', "invalid_frame"),
    ('{"type": "nack", "messages": [{"partition": "/default/bad"}]}', "invalid_frame"),
    (
        '{"type": "nack", "messages": [{"partition": "/default/bad", "offset": -1}]}',
        "invalid_frame",
    ),
    (b'{"type": "flow", "credits": 1}', "invalid_frame"),
]


async def test_malformed_frames_get_an_error_frame_and_close_1008(
    consume_http: httpx.AsyncClient,
) -> None:
    await _produce(consume_http, "bad", ["b0"])
    cid = await _attach(consume_http, "bad", start="earliest")
    for frame, code in MALFORMED:
        async with _stream(consume_http, cid) as ws:
            await ws.send(frame)
            assert await _ended(ws) == (code, 1008), frame

    async with _stream(consume_http, cid) as ws:  # over the frame size limit: 1009, no frame
        await ws.send('{"type": "ack", "messages": [], "pad": "' + "x" * 1024 * 1024 + '"}')
        with pytest.raises(ConnectionClosed) as closed:
            async with asyncio.timeout(FRAME_TIMEOUT_S):
                await ws.recv()
        assert closed.value.rcvd is not None
        assert closed.value.rcvd.code == 1009

    # Credits outstanding are bounded too (on a topic with nothing to send).
    empty = await _attach(consume_http, "bad-empty")
    async with _stream(consume_http, empty) as ws:
        await _send(ws, type="flow", credits=10_000)
        await _send(ws, type="flow", credits=1)
        assert await _ended(ws) == ("too_many_credits", 1008)


async def test_bad_ack_refs_get_an_error_frame_and_the_stream_goes_on(
    consume_http: httpx.AsyncClient,
) -> None:
    await _produce(consume_http, "goes-on", ["g0"])
    cid = await _attach(consume_http, "goes-on", start="earliest")
    async with _stream(consume_http, cid) as ws:
        for partition in ("/default/other", "goes-on", "/default/goes-on-part-0x"):
            await _send(ws, type="ack", messages=[{"partition": partition, "offset": 0}])
            error = await _frame(ws)
            assert (error["type"], error["error"]["code"]) == ("error", "invalid_partition")
        await _send(ws, type="flow", credits=1)
        (message,) = await _messages(ws, 1)
        assert (message["offset"], message["payload"]) == (0, "g0")


async def test_unknown_detached_or_malformed_consumers_end_the_stream(
    consume_http: httpx.AsyncClient,
) -> None:
    cid = await _attach(consume_http, "who")
    unknown = cid.rsplit(".", 1)[0] + ".0123456789abcdef"
    async with _stream(consume_http, unknown) as ws:
        assert await _ended(ws) == ("consumer_not_found", 4404)
    async with _stream(consume_http, "nodots") as ws:
        assert await _ended(ws) == ("invalid_consumer_id", 4400)

    # Detached while streaming: the waiting poll finds it gone.
    async with _stream(consume_http, cid) as ws:
        await _send(ws, type="flow", credits=1)
        await _quiet(ws)  # the pump is polling now
        assert (await consume_http.delete(f"/v1/consumers/{cid}")).status_code == 204
        assert await _ended(ws) == ("consumer_not_found", 4404)
    async with _stream(consume_http, cid) as ws:
        assert await _ended(ws) == ("consumer_not_found", 4404)

"""Binary delivery (delivery batches of frames as the WAL holds them) on real NATS and etcd
with ingest, dispatcher and discovery in-process: a long poll with ``Accept:
application/x-danube-frames`` and the ``danube.frames.v1`` stream carry many messages per
answer with their contents, offsets and order; a nack brings a message again; stream credits
bound what is pushed; a frame damaged on the way is found by the SDK and comes again."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import orjson
import pytest
from websockets.asyncio.client import connect
from websockets.typing import Subprotocol

from danube.client import AsyncDanubeClient, ReceivedMessage
from danube.frame import decode_record, verify_frame
from danube.wire import delivery

pytestmark = pytest.mark.integration

TIMEOUT_S = 10.0


async def _produce(http: httpx.AsyncClient, topic: str, payloads: list[str]) -> list[int]:
    body = {"messages": [{"payload": p} for p in payloads], "producer": "p1"}
    response = await http.post(f"/v1/topics/default/{topic}/messages", json=body)
    assert response.status_code == 200, response.text
    return [r["offset"] for r in response.json()["results"]]


async def _attach(http: httpx.AsyncClient, topic: str) -> str:
    response = await http.post(
        f"/v1/topics/default/{topic}/subscriptions/s/consumers",
        json={"name": "c", "start": "earliest"},
    )
    assert response.status_code == 201, response.text
    cid: str = response.json()["consumer_id"]
    return cid


async def _poll(
    http: httpx.AsyncClient, cid: str, **params: Any
) -> list[delivery.DeliveredMessage]:
    response = await http.get(
        f"/v1/consumers/{cid}/messages",
        params={"wait_ms": 2000, **params},
        headers={"accept": delivery.MEDIA_TYPE},
    )
    assert response.status_code == 200, response.text
    assert response.headers["content-type"] == delivery.MEDIA_TYPE
    return delivery.decode_batch(response.content)


def _payloads(messages: list[delivery.DeliveredMessage]) -> list[str]:
    return [decode_record(verify_frame(m.frame)).payload.decode() for m in messages]


async def test_long_poll_batches_frames_and_a_nack_brings_one_again(
    consume_http: httpx.AsyncClient,
) -> None:
    http = consume_http
    payloads = [f"m{i}" for i in range(20)]
    offsets = await _produce(http, "frames-poll", payloads)
    cid = await _attach(http, "frames-poll")
    got: list[delivery.DeliveredMessage] = []
    async with asyncio.timeout(TIMEOUT_S):
        while len(got) < 20:
            got += await _poll(http, cid, max=100)
    assert [m.offset for m in got] == offsets
    assert _payloads(got) == payloads
    assert {m.partition for m in got} == {"/default/frames-poll"}
    assert {m.redelivery_count for m in got} == {0}
    # JSON stays the default, and names the same messages.
    nack = {"messages": [{"partition": got[3].partition, "offset": got[3].offset}]}
    assert (await http.post(f"/v1/consumers/{cid}/nack", json=nack)).status_code == 204
    again = await _poll(http, cid, max=100)
    assert [(m.offset, m.redelivery_count) for m in again] == [(offsets[3], 1)]
    assert _payloads(again) == ["m3"]


async def test_stream_pushes_batches_within_the_credits(consume_http: httpx.AsyncClient) -> None:
    http = consume_http
    payloads = [f"s{i}" for i in range(12)]
    offsets = await _produce(http, "frames-ws", payloads)
    cid = await _attach(http, "frames-ws")
    base = str(http.base_url).rstrip("/").replace("http://", "ws://", 1)
    async with connect(
        f"{base}/v1/consumers/{cid}/stream",
        proxy=None,
        close_timeout=2,
        subprotocols=[Subprotocol(delivery.SUBPROTOCOL)],
    ) as ws:
        assert ws.subprotocol == delivery.SUBPROTOCOL
        await ws.send(orjson.dumps({"type": "flow", "credits": 5}).decode())
        got: list[delivery.DeliveredMessage] = []
        async with asyncio.timeout(TIMEOUT_S):
            while len(got) < 5:
                raw = await ws.recv()
                assert isinstance(raw, bytes)
                got += delivery.decode_batch(raw)
        with pytest.raises(TimeoutError):  # no credit left: nothing more comes
            async with asyncio.timeout(0.5):
                await ws.recv()
        assert [m.offset for m in got] == offsets[:5]
        await ws.send(orjson.dumps({"type": "flow", "credits": 100}).decode())
        async with asyncio.timeout(TIMEOUT_S):
            while len(got) < 12:
                raw = await ws.recv()
                assert isinstance(raw, bytes)
                got += delivery.decode_batch(raw)
    assert [m.offset for m in got] == offsets
    assert _payloads(got) == payloads


@pytest.fixture
def damage_once(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Flips a bit in the last record of the first batch discovery passes on: what a frame
    damaged between the WAL read and the client looks like. Yields the offsets damaged."""
    real = delivery.rename_partitions
    damaged: list[int] = []

    def rename(body: bytes | memoryview, names: Any) -> bytes:
        out = real(body, names)
        if damaged:
            return out
        messages = delivery.decode_batch(out)
        damaged.append(messages[-1].offset)
        flipped = bytearray(out)
        flipped[-1] ^= 0x01
        return bytes(flipped)

    monkeypatch.setattr(delivery, "rename_partitions", rename)
    return damaged


@pytest.mark.parametrize("mode", ["stream", "poll"])
async def test_the_sdk_finds_a_damaged_frame_and_gets_it_again(
    consume_http: httpx.AsyncClient, damage_once: list[int], mode: str
) -> None:
    http = consume_http
    topic = f"frames-sdk-{mode}"
    payloads = [f"d{i}" for i in range(4)]
    offsets = await _produce(http, topic, payloads)
    async with AsyncDanubeClient(str(http.base_url)) as client:
        consumer = client.consumer(f"/default/{topic}", "s", start="earliest", mode=mode)
        async with consumer:
            got: list[ReceivedMessage] = []
            async with asyncio.timeout(TIMEOUT_S):
                while len(got) < 4:
                    message = await consumer.receive()
                    message.ack()
                    got.append(message)
            assert consumer.frames_corrupt == 1
    assert damage_once == [offsets[-1]]
    assert sorted((m.offset, m.payload.decode()) for m in got) == list(
        zip(offsets, payloads, strict=True)
    )
    assert [m.redelivery_count for m in got if m.offset == offsets[-1]] == [1]

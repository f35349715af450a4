"""Delayed messages handed early to the SDK's consumers (docs/policies.md, "Delayed
delivery"): on one shared subscription an SDK consumer, which holds (streamed from the
owner's door, or long-polled through discovery), and an HTTP consumer that does not. Each
delayed message reaches the application no earlier than its time; the SDK kept those it was
given early; the HTTP consumer is never answered a message before its time."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import httpx
import pytest

from danube.client import AsyncDanubeClient, deliver_after

pytestmark = pytest.mark.integration

DELAY_MS = 1500
COUNT = 60


def _now_ms() -> int:
    return int(time.time() * 1000)


async def _plain_consumer(
    http: httpx.AsyncClient, topic: str, got: list[tuple[int, dict[str, Any]]], done: asyncio.Event
) -> None:
    """An HTTP consumer that does not hold: short polls, each answered batch acked."""
    answer = await http.post(
        f"/v1/topics/{topic}/subscriptions/s/consumers",
        json={"name": "plain", "type": "shared", "start": "earliest"},
    )
    assert answer.status_code == 201, answer.text
    cid = answer.json()["consumer_id"]
    while not done.is_set():
        polled = await http.get(f"/v1/consumers/{cid}/messages", params={"wait_ms": 100})
        assert polled.status_code == 200, polled.text
        arrived = _now_ms()
        batch = polled.json()["messages"]
        got += [(arrived, m) for m in batch]
        refs = [{"partition": m["partition"], "offset": m["offset"]} for m in batch]
        if refs:
            await http.post(f"/v1/consumers/{cid}/ack", json={"messages": refs})


@pytest.mark.parametrize(("mode", "direct"), [("stream", True), ("poll", False)])
async def test_the_sdk_keeps_what_it_is_given_early_and_a_plain_consumer_gets_nothing_early(
    consume_http: httpx.AsyncClient, mode: str, direct: bool
) -> None:
    http = consume_http
    topic = f"default/held-{mode}"
    assert (await http.put(f"/v1/topics/{topic}")).status_code == 201
    plain: list[tuple[int, dict[str, Any]]] = []
    done = asyncio.Event()
    async with (
        AsyncDanubeClient(str(http.base_url)) as client,
        client.consumer(
            "/" + topic, "s", name="sdk", type="shared", start="earliest", mode=mode, direct=direct
        ) as consumer,
    ):
        plain_task = asyncio.create_task(_plain_consumer(http, topic, plain, done))
        async with client.producer("/" + topic) as producer:
            for i in range(COUNT):
                await producer.send(f"m{i}", attributes=deliver_after(DELAY_MS))
            await producer.flush()
        seen: dict[int, int] = {}
        received = 0
        deadline = time.monotonic() + 20
        while received + len(plain) < COUNT:
            assert time.monotonic() < deadline, (received, len(plain))
            try:
                message = await consumer.receive(timeout_s=0.2)
            except TimeoutError:
                continue
            due = message.publish_time_ms + DELAY_MS
            seen[message.offset] = _now_ms() - due
            received += 1
            message.ack()
        held = consumer.delayed_held
        done.set()
        await plain_task
    late = [(arrived - (m["publish_time_ms"] + DELAY_MS)) for arrived, m in plain]
    assert min(late, default=0) >= 0, f"the plain consumer got one {-min(late)} ms early"
    assert min(seen.values()) >= 0, f"the SDK gave one {-min(seen.values())} ms early"
    assert max(seen.values()) < 500, f"the SDK gave one {max(seen.values())} ms late"
    # Handed early to the one that holds: most, if not all, went to the SDK and were kept.
    assert received > COUNT // 2, (received, len(plain))
    assert held == received

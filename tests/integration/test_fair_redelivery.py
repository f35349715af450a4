"""Fair redelivery on real NATS and etcd (ingest, dispatcher, discovery in-process): on one
shared subscription a WebSocket consumer with 10 000 credits that never acks and a long-poll
consumer that acks; the acking one gets every message within 2 x the ack timeout of its
production, the silent one is detached (error frame, close code, metric), nothing is lost;
and the SDK's receive() tells a detached consumer why."""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed

from danube.client import AsyncConsumer, AsyncDanubeClient, NotFoundError
from danube.config import DanubeSettings
from danube.discovery import app as discovery_app
from danube.dispatcher import app as dispatcher_app
from danube.ingest import app as ingest_app
from danube.runtime.service import run_in_process
from tests.integration.conftest import MeshSettings
from tests.readiness import until_ready

pytestmark = pytest.mark.integration

TOPIC = "fair"
SUB = "/v1/topics/default/fair/subscriptions/s"
ACK_TIMEOUT_S = 1.0
DETACH_TIMEOUTS = 3
BATCHES = 24  # of BATCH_MESSAGES, one every BATCH_EVERY_S: 6 s of production
BATCH_MESSAGES = 15
BATCH_EVERY_S = 0.25
TOTAL = BATCHES * BATCH_MESSAGES
DETACHED_METRIC = "danube_dispatcher_slow_consumers_detached_total"


def _settings(base: DanubeSettings) -> DanubeSettings:
    dispatcher = base.dispatcher.model_copy(
        update={
            "ack_timeout_s": ACK_TIMEOUT_S,
            "max_unacked_per_consumer": 1000,
            "slow_consumer_detach_timeouts": DETACH_TIMEOUTS,
            "slow_consumer_window_min": 10,
        }
    )
    return base.model_copy(update={"dispatcher": dispatcher})


@asynccontextmanager
async def _mesh(settings: DanubeSettings) -> AsyncIterator[httpx.AsyncClient]:
    base_url = f"http://127.0.0.1:{settings.discovery.port}"
    async with (
        run_in_process(ingest_app.serve, settings, "ingest-1", must_stop_cleanly=True),
        run_in_process(dispatcher_app.serve, settings, "disp-1", must_stop_cleanly=True),
        run_in_process(discovery_app.serve, settings, "disc-1", must_stop_cleanly=True) as task,
        httpx.AsyncClient(base_url=base_url, timeout=30) as client,
    ):
        await until_ready(client, task)
        yield client


async def _attach(http: httpx.AsyncClient, name: str) -> str:
    body = {
        "name": name,
        "type": "shared",
        "start": "earliest",
        # A short backoff: a timed-out message is due 0.1 s after its timeout.
        "failure_policy": {
            "ack_timeout_ms": int(ACK_TIMEOUT_S * 1000),
            "max_redeliveries": 100,
            "backoff": {"kind": "fixed", "base_ms": 100, "max_ms": 100},
        },
    }
    response = await http.post(f"{SUB}/consumers", json=body)
    assert response.status_code == 201, response.text
    cid: str = response.json()["consumer_id"]
    return cid


async def _metric(http: httpx.AsyncClient, port: int, name: str) -> float:
    response = await http.get(f"http://127.0.0.1:{port}/metrics")
    assert response.status_code == 200, response.text
    found = re.search(rf"^{name} ([0-9.e+]+)$", response.text, re.MULTILINE)
    return float(found.group(1)) if found else 0.0


@dataclass
class Silent:
    """What the WebSocket consumer that never acks saw."""

    messages: list[tuple[int, int]] = field(default_factory=list)  # (offset, redelivery count)
    error: dict[str, Any] | None = None
    close_code: int | None = None


async def _silent(ws: ClientConnection, seen: Silent) -> None:
    await ws.send(json.dumps({"type": "flow", "credits": 10_000}))
    try:
        while True:
            frame = json.loads(await ws.recv())
            if frame["type"] == "message":
                seen.messages.append((frame["offset"], frame["redelivery_count"]))
            else:
                seen.error = frame["error"]
    except ConnectionClosed as closed:
        seen.close_code = closed.rcvd.code if closed.rcvd is not None else None


async def _acker(
    http: httpx.AsyncClient,
    cid: str,
    got: dict[int, tuple[float, str, int]],
    done: asyncio.Event,
    stop: asyncio.Event,
) -> None:
    """Long-polls and acks at once; ``got``: offset -> (first receipt, payload, count);
    ``done`` once TOTAL distinct offsets came."""
    while not stop.is_set():
        response = await http.get(
            f"/v1/consumers/{cid}/messages", params={"max": 100, "wait_ms": 200}
        )
        assert response.status_code == 200, response.text
        messages = response.json()["messages"]
        now = time.monotonic()
        for m in messages:
            got.setdefault(m["offset"], (now, m["payload"], m["redelivery_count"]))
        if messages:
            refs = [{"partition": m["partition"], "offset": m["offset"]} for m in messages]
            acked = await http.post(f"/v1/consumers/{cid}/ack", json={"messages": refs})
            assert acked.status_code == 204, acked.text
        if len(got) >= TOTAL:
            done.set()


async def _produce(http: httpx.AsyncClient, produced: dict[int, tuple[float, str]]) -> None:
    for batch in range(BATCHES):
        payloads = [f"b{batch}-m{i}" for i in range(BATCH_MESSAGES)]
        sent = time.monotonic()  # before the request: the delay measured is never less
        body = {"messages": [{"payload": p} for p in payloads], "producer": "p"}
        response = await http.post(f"/v1/topics/default/{TOPIC}/messages", json=body)
        assert response.status_code == 200, response.text
        for result, payload in zip(response.json()["results"], payloads, strict=True):
            produced[result["offset"]] = (sent, payload)
        await asyncio.sleep(BATCH_EVERY_S)


async def test_a_consumer_that_never_acks_no_longer_starves_one_that_acks(
    mesh_settings: MeshSettings,
) -> None:
    settings = _settings(mesh_settings())
    metrics_port = settings.dispatcher.metrics_port
    async with _mesh(settings) as http:
        detached_before = await _metric(http, metrics_port, DETACHED_METRIC)
        # The topic exists before the first attach, so "earliest" is its offset 0.
        created = await http.put(f"/v1/topics/default/{TOPIC}", json={"partitions": 0})
        assert created.status_code in (200, 201), created.text
        silent_id = await _attach(http, "silent")
        acker_id = await _attach(http, "acker")
        silent = Silent()
        got: dict[int, tuple[float, str, int]] = {}
        produced: dict[int, tuple[float, str]] = {}
        done, stop = asyncio.Event(), asyncio.Event()
        ws_url = str(http.base_url).replace("http://", "ws://", 1).rstrip("/")
        async with connect(
            f"{ws_url}/v1/consumers/{silent_id}/stream", proxy=None, close_timeout=2
        ) as ws:
            silent_task = asyncio.create_task(_silent(ws, silent))
            acker_task = asyncio.create_task(_acker(http, acker_id, got, done, stop))
            await asyncio.sleep(0.3)  # both are polling before the first message
            await _produce(http, produced)
            async with asyncio.timeout(4 * ACK_TIMEOUT_S):
                await done.wait()
            stop.set()
            await acker_task
            async with asyncio.timeout(10):
                await silent_task

        # The silent one was given messages (the case is real) and was detached for them.
        assert silent.messages, "the silent consumer was never given anything"
        assert silent.error is not None, silent
        assert silent.error["code"] == "consumer_detached", silent
        assert f"{DETACH_TIMEOUTS} times in a row" in silent.error["message"]
        assert silent.close_code == 4410
        detached = await _metric(http, metrics_port, DETACHED_METRIC)
        assert detached - detached_before == 1
        polled = await http.get(f"/v1/consumers/{silent_id}/messages", params={"wait_ms": 0})
        assert polled.status_code == 410, polled.text
        assert polled.json()["error"]["code"] == "consumer_detached"

        # Everything produced reached the acking one, intact, each within 2 x the ack timeout.
        assert len(produced) == TOTAL
        assert {o: p for o, (_, p, _) in got.items()} == {o: p for o, (_, p) in produced.items()}
        delays = {o: got[o][0] - produced[o][0] for o in produced}
        worst = max(delays, key=lambda o: delays[o])
        assert delays[worst] <= 2 * ACK_TIMEOUT_S, (worst, delays[worst], got[worst])
        # Some came to it after timing out at the silent one: redelivered elsewhere.
        taken_over = [o for o, (_, _, count) in got.items() if count > 0]
        assert taken_over, "no redelivery reached the acking consumer"
        assert set(taken_over) <= {o for o, _ in silent.messages}

        # Nothing lost: the subscription's backlog is 0 (every offset acked and stored).
        listing = await http.get(f"/v1/topics/default/{TOPIC}/subscriptions")
        assert listing.status_code == 200, listing.text
        (sub,) = listing.json()["subscriptions"]
        assert sub["backlog"] == 0, sub
        print(
            f"\nfair redelivery: {len(produced)} messages, silent given {len(silent.messages)} "
            f"({len(set(o for o, _ in silent.messages))} offsets), acker took over "
            f"{len(taken_over)}; worst delay {delays[worst]:.3f} s "
            f"(limit {2 * ACK_TIMEOUT_S:.1f} s)"
        )


async def _drain_until_it_fails(consumer: AsyncConsumer) -> None:
    """Take messages and never ack them until ``receive()`` raises (15 s at most)."""
    async with asyncio.timeout(15):
        while True:
            await consumer.receive(10.0)


async def test_the_sdk_tells_a_consumer_it_detached_why(mesh_settings: MeshSettings) -> None:
    """An SDK stream consumer whose application takes messages and never acks: its
    ``receive()`` ends with ``consumer_detached`` (and it does not attach again by itself),
    while an SDK poll consumer that acks gets every message."""
    settings = _settings(mesh_settings())
    topic = "/default/fair-sdk"
    policy = {
        "ack_timeout_ms": int(ACK_TIMEOUT_S * 1000),
        "backoff": {"kind": "fixed", "base_ms": 100, "max_ms": 100},
    }
    total = 160
    async with _mesh(settings) as http, AsyncDanubeClient(str(http.base_url)) as client:
        common: dict[str, Any] = {"type": "shared", "start": "earliest", "failure_policy": policy}
        async with client.producer(topic) as producer:
            await producer.send_and_wait("first")  # the topic exists: "earliest" is offset 0
            silent = client.consumer(topic, "s", name="silent", **common)
            acker = client.consumer(topic, "s", name="acker", mode="poll", **common)
            async with silent, acker:
                acked: set[int] = set()

                async def ack_all() -> None:
                    while len(acked) < total:
                        message = await acker.receive(10.0)
                        message.ack()
                        acked.add(message.offset)

                acking = asyncio.create_task(ack_all())
                for i in range(1, total):
                    await producer.send(f"m{i}")
                    await asyncio.sleep(4.0 / total)  # over 4 s: several ack timeouts
                await producer.flush()
                with pytest.raises(NotFoundError) as ended:
                    await _drain_until_it_fails(silent)
                assert ended.value.code == "consumer_detached"
                assert ended.value.status == 410
                assert "times in a row" in ended.value.message
                async with asyncio.timeout(10):
                    await acking
                await acker.flush_acks()
    assert acked == set(range(total))

"""Taking over from a killed dispatcher without waiting out its lease: two dispatchers with a
10 s lease, a shared subscription whose consumer receives and acks while a producer goes on.
SIGKILL of the owner; the other dispatcher finds the owner's door refusing connections, ends
its lease and serves within 1.5 s (waiting out the lease: 7 to 10 s). Two consumers:

- sdk: the SDK streams from the owner's door; the broken connection sends it back through
  discovery, which claims (measured ~0.1 s);
- proxy: HTTP polls and acks through discovery, one of which is in flight in discovery's
  bus request at the kill; discovery drops it once the owner is found gone (~0.6 s; it
  waited for the request's deadline before: 2.05 s measured with a poll, 10 s an ack).

Every acknowledged message is delivered. (That a frozen owner's lease is left alone, and the
rest of the rule: tests/integration/test_gone_door.py.)"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from danube.client import AsyncDanubeClient
from danube.up import ProcessSpec, ServerProcess

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

TOPIC = "takeover"
SUB = "s"
PARTITIONS = 2
LEASE_TTL_S = 10
TAKEOVER_S_MAX = 1.5
ENV = {"DANUBE_DISPATCHER__LEASE_TTL_S": str(LEASE_TTL_S)}
_SERVED = re.compile(r'^danube_dispatcher_subscriptions\{dispatch="reliable"\} (\S+)$', re.M)
_ENDED = re.compile(r"^danube_dispatcher_dead_owner_leases_ended_total (\S+)$", re.M)


Received = dict[tuple[str, int], float]  # (partition, offset) -> when first received


async def _consume_sdk(url: str, received: Received, done: asyncio.Event) -> None:
    """The SDK's consumer: frames from the owner's door; when its dispatcher dies, the SDK
    attaches again through discovery (which claims). Each message acked as it comes."""
    async with (
        AsyncDanubeClient(url) as client,
        client.consumer(
            f"/default/{TOPIC}", SUB, name="c", type="shared", start="earliest"
        ) as consumer,
    ):
        while not done.is_set():
            try:
                message = await consumer.receive(timeout_s=0.2)
            except TimeoutError:
                continue
            received.setdefault((message.partition, message.offset), time.monotonic())
            message.ack()


async def _consume_proxy(url: str, received: Received, done: asyncio.Event) -> None:
    """A consumer of the proxy path (HTTP through discovery, as the official clients' gRPC
    through discovery): short polls, each answered ack awaited. A kill finds a poll or an
    ack in flight in discovery's bus request."""
    path = f"/v1/topics/default/{TOPIC}/subscriptions/{SUB}/consumers"
    attach = {"name": "c", "type": "shared", "start": "earliest"}
    async with httpx.AsyncClient(base_url=url, timeout=30) as http:
        consumer = ""
        while not done.is_set():
            if not consumer:
                answer = await http.post(path, json=attach)
                assert answer.status_code in (201, 503), answer.text  # 503: moving
                consumer = answer.json()["consumer_id"] if answer.status_code == 201 else ""
                continue
            polled = await http.get(
                f"/v1/consumers/{consumer}/messages", params={"max": 100, "wait_ms": 100}
            )
            if polled.status_code in (404, 503):  # the new owner does not know it; moving
                consumer = ""
                continue
            assert polled.status_code == 200, polled.text
            refs = [
                {"partition": m["partition"], "offset": m["offset"]}
                for m in polled.json()["messages"]
            ]
            for ref in refs:
                received.setdefault((ref["partition"], ref["offset"]), time.monotonic())
            if refs:
                ack = await http.post(f"/v1/consumers/{consumer}/ack", json={"messages": refs})
                assert ack.status_code in (204, 404, 503), ack.text  # not stored: comes again


async def _produce(
    http: httpx.AsyncClient, acked: dict[tuple[str, int], float], done: asyncio.Event
) -> None:
    """Ten messages every 100 ms; each acknowledged one's (partition, offset), with when its
    produce was sent (sent after a kill: only a new owner can deliver it)."""
    n = 0
    while not done.is_set():
        body = {"messages": [{"payload": f"m{n + i}"} for i in range(10)]}
        n += 10
        sent = time.monotonic()
        response = await http.post(f"/v1/topics/default/{TOPIC}/messages", json=body)
        assert response.status_code == 200, response.text
        acked.update({(r["partition"], r["offset"]): sent for r in response.json()["results"]})
        await asyncio.sleep(0.1)


def _metric(pattern: re.Pattern[str], process: ServerProcess) -> float:
    text = httpx.get(f"http://127.0.0.1:{process.spec.port}/metrics", timeout=10).text
    found = pattern.search(text)
    return float(found.group(1)) if found else 0.0


@pytest.mark.parametrize("consume", ["sdk", "proxy"])
async def test_a_killed_owner_s_subscription_is_served_again_long_before_its_lease_ends(
    consume: str,
    tmp_path: Path,
    spec_for: Callable[..., ProcessSpec],
    services: Callable[..., ServerProcess],
) -> None:
    services("ingest", "ingest-0")
    discovery = services("discovery", "discovery-0")
    dispatchers = [
        ServerProcess(spec_for("dispatcher", f"dispatcher-{n}", **ENV), tmp_path / f"d{n}.log")
        for n in (0, 1)
    ]
    for process in dispatchers:
        process.start()
    url = f"http://127.0.0.1:{discovery.spec.port}"
    received: Received = {}
    acked: dict[tuple[str, int], float] = {}  # -> when its produce was sent
    done, stop_producing = asyncio.Event(), asyncio.Event()
    try:
        async with httpx.AsyncClient(base_url=url, timeout=30) as http:
            topic = await http.put(f"/v1/topics/default/{TOPIC}", json={"partitions": PARTITIONS})
            assert topic.status_code in (200, 201), topic.text
            consuming = _consume_sdk if consume == "sdk" else _consume_proxy
            consumer = asyncio.create_task(consuming(url, received, done))
            producer = asyncio.create_task(_produce(http, acked, stop_producing))
            async with asyncio.timeout(30):
                while len(received) < 100:  # noqa: ASYNC110
                    await asyncio.sleep(0.05)
            served = [await asyncio.to_thread(_metric, _SERVED, p) for p in dispatchers]
            assert sorted(served) == [0, 1], served
            owner, other = dispatchers[served.index(1)], dispatchers[served.index(0)]

            owner.kill()  # SIGKILL: its lease lives on in etcd for up to 10 s
            killed = time.monotonic()
            # Served again: a message produced after the kill arrived (only the new owner
            # can have delivered it).
            async with asyncio.timeout(LEASE_TTL_S + 10):
                while not any(at > killed for ref, at in acked.items() if ref in received):
                    await asyncio.sleep(0.02)
                    assert not consumer.done(), consumer
            takeover_s = min(
                received[r] for r, at in acked.items() if at > killed and r in received
            )
            takeover_s -= killed
            ended = await asyncio.to_thread(_metric, _ENDED, other)

            stop_producing.set()
            await producer
            async with asyncio.timeout(30):
                while not acked.keys() <= received.keys():
                    await asyncio.sleep(0.05)
                    assert not consumer.done(), consumer
            done.set()
            await consumer
    finally:
        done.set()
        stop_producing.set()
        for process in dispatchers:
            process.stop()

    print(f"\ntakeover ({consume}): served again {takeover_s * 1000:.0f} ms after the SIGKILL")
    assert ended == 1  # the survivor ended the killed one's lease: it did not wait it out
    assert takeover_s < TAKEOVER_S_MAX, f"served again {takeover_s:.1f} s after the kill"

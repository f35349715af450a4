"""At-least-once under dispatcher crashes: 50k numbered messages are produced over HTTP while a
consumer polls and acks; the dispatcher is killed with SIGKILL twice and restarted. The consumer
sees every offset, first deliveries in offset order per partition, and no message again whose
ack was answered before the poll that brought it back."""

from __future__ import annotations

import asyncio
import os
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest

from danube.up import ProcessSpec, ServerProcess

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

MESSAGES = int(os.environ.get("DANUBE_TEST_CRASH_MESSAGES", "50000"))
PARTITIONS = 2
BATCH = 250
KILL_AT = (MESSAGES // 4, MESSAGES // 2)  # deliveries seen when each SIGKILL happens
TOPIC = "crash"
SUB = "s"


@dataclass
class Seen:
    """What the consumer saw: every delivery in order, and the acks answered with 204."""

    deliveries: list[tuple[str, int, str, int]] = field(default_factory=list)
    acked: set[tuple[str, int]] = field(default_factory=set)
    # Deliveries of a message whose ack had been answered before the poll was sent.
    acked_then_delivered: list[tuple[str, int]] = field(default_factory=list)
    reattached: int = 0


async def _produce(http: httpx.AsyncClient, produced: dict[tuple[str, int], str]) -> None:
    for first in range(0, MESSAGES, BATCH):
        body = {
            "messages": [{"payload": f"n-{n}"} for n in range(first, min(first + BATCH, MESSAGES))]
        }
        response = await http.post(f"/v1/topics/default/{TOPIC}/messages", json=body)
        assert response.status_code == 200, response.text
        results = response.json()["results"]
        for message, result in zip(body["messages"], results, strict=True):
            produced[(result["partition"], result["offset"])] = message["payload"]


async def _attach(http: httpx.AsyncClient, seen: Seen) -> str:
    path = f"/v1/topics/default/{TOPIC}/subscriptions/{SUB}/consumers"
    async with asyncio.timeout(60):
        while True:
            body = {"name": "c", "type": "exclusive", "start": "earliest"}
            response = await http.post(path, json=body)
            if response.status_code == 201:
                seen.reattached += 1
                consumer_id: str = response.json()["consumer_id"]
                return consumer_id
            # 503 while no dispatcher runs; 409 until the killed one's consumer is forgotten
            assert response.status_code in (409, 503), response.text
            await asyncio.sleep(0.2)


async def _consume(http: httpx.AsyncClient, seen: Seen, done: asyncio.Event) -> None:
    consumer = await _attach(http, seen)
    while not done.is_set():
        acked_before = set(seen.acked)
        response = await http.get(
            f"/v1/consumers/{consumer}/messages", params={"max": 500, "wait_ms": 500}
        )
        if response.status_code != 200:  # the dispatcher died: it forgot this consumer
            assert response.status_code in (404, 503), response.text
            consumer = await _attach(http, seen)
            continue
        messages = response.json()["messages"]
        for m in messages:
            ref = (m["partition"], m["offset"])
            seen.deliveries.append((*ref, m["payload"], m["redelivery_count"]))
            if ref in acked_before:
                seen.acked_then_delivered.append(ref)
        if not messages:
            continue
        refs = [{"partition": m["partition"], "offset": m["offset"]} for m in messages]
        response = await http.post(f"/v1/consumers/{consumer}/ack", json={"messages": refs})
        if response.status_code == 204:
            seen.acked.update((r["partition"], r["offset"]) for r in refs)
        else:  # not known to be stored: these may (and should) come again
            assert response.status_code in (404, 503), response.text


async def test_dispatcher_sigkill_twice_delivers_every_offset_and_redelivers_only_unacked(
    tmp_path: Path,
    spec_for: Callable[..., ProcessSpec],
    services: Callable[..., ServerProcess],
) -> None:
    services("ingest", "ingest-0")
    discovery = services("discovery", "discovery-0")
    dispatcher_spec = spec_for("dispatcher", "dispatcher-0")
    dispatchers = [ServerProcess(dispatcher_spec, tmp_path / "dispatcher-0.log")]
    dispatchers[0].start()
    produced: dict[tuple[str, int], str] = {}
    seen = Seen()
    done = asyncio.Event()
    base_url = f"http://127.0.0.1:{discovery.spec.port}"
    try:
        async with httpx.AsyncClient(base_url=base_url, timeout=60) as http:
            topic = await http.put(f"/v1/topics/default/{TOPIC}", json={"partitions": PARTITIONS})
            assert topic.status_code in (200, 201), topic.text
            consumer = asyncio.create_task(_consume(http, seen, done))
            producer = asyncio.create_task(_produce(http, produced))
            for threshold in KILL_AT:
                async with asyncio.timeout(120):
                    while len(seen.deliveries) < threshold:
                        await asyncio.sleep(0.01)
                        assert not consumer.done(), consumer
                dispatchers[-1].kill()  # SIGKILL
                # The same node on a fresh port: the killed one's port may be taken by now.
                restarted = ServerProcess(
                    spec_for("dispatcher", "dispatcher-0"),
                    tmp_path / f"dispatcher-{len(dispatchers)}.log",
                )
                dispatchers.append(restarted)
                await asyncio.to_thread(restarted.start)
            await producer
            async with asyncio.timeout(120):
                while {(p, o) for p, o, _, _ in seen.deliveries} != produced.keys():
                    await asyncio.sleep(0.05)
                    assert not consumer.done(), consumer
            done.set()
            await consumer
    finally:
        done.set()
        for process in dispatchers:
            process.stop()

    assert len(produced) == MESSAGES
    assert seen.reattached == 1 + len(KILL_AT)  # the consumer really lost its dispatcher
    # Every delivery carries the payload that was produced at that offset.
    for partition, offset, payload, _ in seen.deliveries:
        assert produced[(partition, offset)] == payload, (partition, offset)
    # First deliveries of each partition come in offset order, and cover every offset.
    first_seen: dict[str, list[int]] = defaultdict(list)
    known: set[tuple[str, int]] = set()
    for partition, offset, _, _ in seen.deliveries:
        if (partition, offset) not in known:
            known.add((partition, offset))
            first_seen[partition].append(offset)
    assert len(first_seen) == PARTITIONS
    for partition, offsets in first_seen.items():
        expected = sorted(o for p, o in produced if p == partition)
        assert offsets == expected, f"{partition}: first deliveries out of order or missing"
    # Duplicates are only of messages whose ack was not answered before they came again.
    assert seen.acked_then_delivered == []
    duplicates = len(seen.deliveries) - len(known)
    print(f"deliveries {len(seen.deliveries)}, duplicates {duplicates}")

"""Delayed delivery through the whole mesh, across a dispatcher SIGKILL: thousands of
messages produced over HTTP with ``deliver_at_ms`` spread over a few seconds (and some not
delayed) on a shared subscription, the dispatcher's memory for them at its least (most go to
spill files); the dispatcher is killed while most are still waiting (the listing counts
them) and a new one takes over. Every message is delivered, none before its time, those due once the
new dispatcher serves within 50 ms of it, the others as soon as it serves; the messages not
delayed are not held back. The bad inputs of the HTTP fields are refused."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
from delayedrun import now_ms, produce_delayed, sample_loop, until_arrived

from danube.up import ProcessSpec, ServerProcess

pytestmark = [pytest.mark.e2e, pytest.mark.solo, pytest.mark.timeout(120)]

TOPIC = "delayed"
SUB = "s"
PARTITIONS = 2
DELAYED = 3000
PLAIN = 300
DELAY_S = (1.5, 12.0)  # spread of the delivery times after the produce starts
KILL_AFTER_S = 2.5  # into the run: most messages are still waiting
LATE_MS_MAX = 50
STALL_MS_MAX = 250


@dataclass
class Seen:
    # (partition, offset) -> wall-clock ms each delivery arrived, in order
    arrivals: dict[tuple[str, int], list[int]] = field(default_factory=dict)
    reattached: int = 0
    served_again_ms: int | None = None  # the first delivery by the new dispatcher
    attached: asyncio.Event = field(default_factory=asyncio.Event)


async def _attach(http: httpx.AsyncClient, seen: Seen) -> str:
    path = f"/v1/topics/default/{TOPIC}/subscriptions/{SUB}/consumers"
    async with asyncio.timeout(60):
        while True:
            body = {"name": "c", "type": "shared", "start": "earliest"}
            response = await http.post(path, json=body)
            if response.status_code == 201:
                seen.reattached += 1
                seen.attached.set()
                consumer_id: str = response.json()["consumer_id"]
                return consumer_id
            assert response.status_code in (409, 503), response.text  # no dispatcher yet
            await asyncio.sleep(0.1)


async def _consume(http: httpx.AsyncClient, seen: Seen, done: asyncio.Event) -> None:
    consumer = await _attach(http, seen)
    acks: list[asyncio.Task[None]] = []
    while not done.is_set():
        response = await http.get(
            f"/v1/consumers/{consumer}/messages", params={"max": 1000, "wait_ms": 500}
        )
        arrived_ms = now_ms()
        if response.status_code != 200:  # the dispatcher died: it forgot this consumer
            assert response.status_code in (404, 503), response.text
            consumer = await _attach(http, seen)
            continue
        messages = response.json()["messages"]
        if messages and seen.reattached > 1 and seen.served_again_ms is None:
            seen.served_again_ms = arrived_ms
        for m in messages:
            seen.arrivals.setdefault((m["partition"], m["offset"]), []).append(arrived_ms)
        if messages:  # acked in the background, as the SDK does: the next poll goes now
            refs = [{"partition": m["partition"], "offset": m["offset"]} for m in messages]
            acks.append(asyncio.create_task(_ack(http, consumer, refs)))
    await asyncio.gather(*acks, return_exceptions=True)


async def _ack(http: httpx.AsyncClient, consumer: str, refs: list[dict[str, Any]]) -> None:
    response = await http.post(f"/v1/consumers/{consumer}/ack", json={"messages": refs})
    assert response.status_code in (204, 404, 503), response.text  # 404/503: a killed owner


async def _refusals(http: httpx.AsyncClient) -> None:
    path = f"/v1/topics/default/{TOPIC}/messages"
    far = now_ms() + 11 * 86_400_000
    for bad in (
        {"payload": "x", "deliver_after_ms": -1},
        {"payload": "x", "deliver_at_ms": -5},
        {"payload": "x", "deliver_at_ms": now_ms() + 1000, "deliver_after_ms": 1000},
        {"payload": "x", "deliver_at_ms": far},
        {"payload": "x", "deliver_after_ms": 11 * 86_400_000},
    ):
        response = await http.post(path, json={"messages": [bad]})
        assert response.status_code == 400, (bad, response.text)
        assert response.json()["error"]["code"] == "invalid_request", response.text


async def test_delayed_messages_come_at_their_time_across_a_dispatcher_sigkill(
    tmp_path: Path,
    spec_for: Callable[..., ProcessSpec],
    services: Callable[..., ServerProcess],
) -> None:
    services("ingest", "ingest-0")
    discovery = services("discovery", "discovery-0")
    lease = {
        "DANUBE_DISPATCHER__LEASE_TTL_S": "2",  # the killed one's claim goes soon
        # The least memory allowed (64 KiB): most delayed messages go to spill files.
        "DANUBE_DISPATCHER__DELAYED_MEMORY_BYTES_MAX": "65536",
        "DANUBE_DISPATCHER__DELAYED_SPILL_DIR": str(tmp_path / "spill"),
    }
    first = ServerProcess(spec_for("dispatcher", "dispatcher-0", **lease), tmp_path / "d0.log")
    first.start()
    dispatchers = [first]
    seen = Seen()
    done = asyncio.Event()
    lags: list[tuple[int, int]] = []  # (when, ms): how late this process's own 10 ms ticks ran
    observer = asyncio.create_task(sample_loop(lags, done))
    try:
        async with httpx.AsyncClient(
            base_url=f"http://127.0.0.1:{discovery.spec.port}", timeout=60
        ) as http:
            topic = await http.put(f"/v1/topics/default/{TOPIC}", json={"partitions": PARTITIONS})
            assert topic.status_code in (200, 201), topic.text
            await _refusals(http)
            consumer = asyncio.create_task(_consume(http, seen, done))
            async with asyncio.timeout(30):
                await seen.attached.wait()
            started_ms = now_ms()
            due = await produce_delayed(
                http, TOPIC, started_ms, delayed=DELAYED, plain=PLAIN, delay_s=DELAY_S, seed=34
            )
            produced_s = (now_ms() - started_ms) / 1000
            assert produced_s < KILL_AFTER_S, f"producing took {produced_s:.1f} s"
            await asyncio.sleep(KILL_AFTER_S - produced_s)
            listed = (await http.get(f"/v1/topics/default/{TOPIC}/subscriptions")).json()
            held = listed["subscriptions"][0]["delayed"]
            assert DELAYED // 2 < held <= DELAYED, held  # most are still waiting
            spilled = list((tmp_path / "spill").glob("*/*.dly"))
            assert spilled, "nothing went to spill files"
            dispatchers[-1].kill()  # SIGKILL
            killed_ms = now_ms()
            second = ServerProcess(
                spec_for("dispatcher", "dispatcher-1", **lease), tmp_path / "d1.log"
            )
            dispatchers.append(second)
            await asyncio.to_thread(second.start)
            await until_arrived(due.keys(), seen.arrivals, consumer)
            done.set()
            await consumer
    finally:
        done.set()
        await observer
        for process in dispatchers:
            process.stop()

    assert seen.reattached == 2  # the consumer really lost its dispatcher
    assert seen.served_again_ms is not None
    early = [(ref, at) for ref, at in due.items() if at is not None and seen.arrivals[ref][0] < at]
    assert early == [], f"{len(early)} delivered before their time"
    plain = [seen.arrivals[ref][0] - started_ms for ref, at in due.items() if at is None]
    before_kill = [ms for ms in plain if ms + started_ms < killed_ms]
    assert before_kill, "the messages not delayed waited for the delayed ones"
    # Due once the new dispatcher served (half a second after its first delivery): on time.
    settled_ms = seen.served_again_ms + 500
    late = sorted(
        seen.arrivals[ref][0] - at for ref, at in due.items() if at is not None and at >= settled_ms
    )
    assert len(late) > DELAYED // 4, "too few messages due after the takeover to judge"
    waited = sorted(
        seen.arrivals[ref][0] - at
        for ref, at in due.items()
        if at is not None and killed_ms <= at < settled_ms
    )
    stalled = max((lag for at, lag in lags if at >= settled_ms), default=0)  # judged ones due
    duplicates = sum(len(times) - 1 for times in seen.arrivals.values())
    print(
        f"killed at {killed_ms - started_ms} ms, served again at "
        f"{seen.served_again_ms - started_ms} ms; due after: {len(late)}, lateness ms "
        f"p50 {late[len(late) // 2]} p99 {late[len(late) * 99 // 100]} max {late[-1]}; "
        f"due during the takeover: {len(waited)}, late by at most {max(waited, default=0)} ms; "
        f"duplicates {duplicates}; this process stalled {stalled} ms at most"
    )
    # On time: nine in ten within 50 ms of their time (the consumer's poll included, through
    # discovery); the rest by a stall of the 2-core machine (four processes). Marked solo:
    # beside another test's mesh or Spark job, CI measured p50 30 to 33 ms, which is that
    # neighbour's share of the cores; alone p50 11, p99 24 ms.
    assert late[len(late) * 9 // 10] <= LATE_MS_MAX, f"p90 late by {late[len(late) * 9 // 10]}"
    # The longest lateness, beyond what this process (the observer) stalled itself: a stall of
    # the whole machine delays the observer's poll as much as the dispatcher (a CI run saw a
    # max of 274 ms with p50 4 ms; quiet runs 32 to 66 ms, also with two busy loops beside).
    assert late[-1] <= STALL_MS_MAX + stalled, f"late by {late[-1]} ms, stalled {stalled}"
    # What fell due while nobody served came as soon as the new dispatcher served.
    for ref, at in due.items():
        if at is not None and at < settled_ms:
            assert seen.arrivals[ref][0] <= max(at, seen.served_again_ms) + 1000, ref

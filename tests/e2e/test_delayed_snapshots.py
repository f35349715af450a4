"""Delay snapshots through the whole mesh: thousands of delayed messages on a shared
subscription are sealed into snapshots in object storage (a directory both dispatchers
share); the dispatcher is killed with SIGKILL, one snapshot object is torn (cut short) on
disk, and a new dispatcher takes over: it loads the snapshots and reads from the log only
what none holds (the torn one's range, and the tail past the last seal, here none), counted
by its metrics; every message is delivered, none before its time. Of those due once it
serves, the ones from intact snapshots come within 50 ms of their time (nine in ten); the
torn snapshot's (a whole partition here) within the time to find it torn and read them again
(a second at most)."""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from danube.up import ProcessSpec, ServerProcess

pytestmark = [pytest.mark.e2e, pytest.mark.solo, pytest.mark.timeout(120)]

TOPIC = "snapped"
SUB = "s"
PARTITIONS = 2
DELAYED = 3000
BATCH = 500
DELAY_S = (8.0, 18.0)  # delivery times after the produce starts: after the kill
SEALED_WAIT_S = 3.5  # seal interval (1 s) + the cursor write holding the chain (1 s) + room
LATE_MS_MAX = 50
STALL_MS_MAX = 500  # the stall after the takeover, below
REREAD_MS_MAX = 1000


def _quantile(values: list[int], q: float) -> int:
    return values[min(int(len(values) * q), len(values) - 1)]


def _stats(values: list[int]) -> str:
    return (
        f"n {len(values)}, lateness ms p50 {_quantile(values, 0.5)} "
        f"p90 {_quantile(values, 0.9)} p99 {_quantile(values, 0.99)} max {values[-1]}"
    )


def _now_ms() -> int:
    return int(time.time() * 1000)


async def _attach(http: httpx.AsyncClient) -> str:
    path = f"/v1/topics/default/{TOPIC}/subscriptions/{SUB}/consumers"
    async with asyncio.timeout(60):
        while True:
            body = {"name": "c", "type": "shared", "start": "earliest"}
            response = await http.post(path, json=body)
            if response.status_code == 201:
                consumer_id: str = response.json()["consumer_id"]
                return consumer_id
            assert response.status_code in (409, 503), response.text  # no dispatcher yet
            await asyncio.sleep(0.1)


async def _consume(
    http: httpx.AsyncClient, arrivals: dict[tuple[str, int], list[int]], done: asyncio.Event
) -> None:
    consumer = await _attach(http)
    acks: list[asyncio.Task[httpx.Response]] = []
    while not done.is_set():
        response = await http.get(
            f"/v1/consumers/{consumer}/messages", params={"max": 1000, "wait_ms": 500}
        )
        arrived_ms = _now_ms()
        if response.status_code != 200:  # the dispatcher died: it forgot this consumer
            assert response.status_code in (404, 503), response.text
            consumer = await _attach(http)
            continue
        messages = response.json()["messages"]
        for m in messages:
            arrivals.setdefault((m["partition"], m["offset"]), []).append(arrived_ms)
        if messages:
            refs = [{"partition": m["partition"], "offset": m["offset"]} for m in messages]
            path = f"/v1/consumers/{consumer}/ack"
            acks.append(asyncio.create_task(http.post(path, json={"messages": refs})))
    await asyncio.gather(*acks, return_exceptions=True)


async def _produce(http: httpx.AsyncClient, started_ms: int) -> dict[tuple[str, int], int]:
    rng = random.Random(35)
    due: dict[tuple[str, int], int] = {}
    for first in range(0, DELAYED, BATCH):
        wanted = [started_ms + int(rng.uniform(*DELAY_S) * 1000) for _ in range(BATCH)]
        messages: list[dict[str, Any]] = [
            {"payload": f"m{first + i}", "deliver_at_ms": at} for i, at in enumerate(wanted)
        ]
        response = await http.post(
            f"/v1/topics/default/{TOPIC}/messages", json={"messages": messages}
        )
        assert response.status_code == 200, response.text
        for at, result in zip(wanted, response.json()["results"], strict=True):
            due[(result["partition"], result["offset"])] = at
    return due


def _delay_metrics(port: int) -> dict[str, float]:
    text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text
    found: dict[str, float] = {}
    for line in text.splitlines():
        name, _, value = line.partition(" ")
        if name.startswith("danube_dispatcher_delayed"):
            found[name] = float(value)
    return found


async def test_a_new_owner_loads_the_sealed_snapshots_instead_of_reading_the_log(
    tmp_path: Path,
    spec_for: Callable[..., ProcessSpec],
    services: Callable[..., ServerProcess],
) -> None:
    objects = tmp_path / "objects"
    shared = {
        "DANUBE_WAL_CLOUD__CLOUD__BACKEND": "fs",
        "DANUBE_WAL_CLOUD__CLOUD__ROOT": str(objects),
    }
    services("ingest", "ingest-0")
    discovery = services("discovery", "discovery-0")
    own = {
        **shared,
        "DANUBE_DISPATCHER__LEASE_TTL_S": "2",
        "DANUBE_DISPATCHER__DELAYED_SEAL_INTERVAL_S": "1.0",  # off by default
    }
    first = ServerProcess(spec_for("dispatcher", "dispatcher-0", **own), tmp_path / "d0.log")
    first.start()
    dispatchers = [first]
    arrivals: dict[tuple[str, int], list[int]] = {}
    done = asyncio.Event()
    try:
        async with httpx.AsyncClient(
            base_url=f"http://127.0.0.1:{discovery.spec.port}", timeout=60
        ) as http:
            topic = await http.put(f"/v1/topics/default/{TOPIC}", json={"partitions": PARTITIONS})
            assert topic.status_code in (200, 201), topic.text
            consumer = asyncio.create_task(_consume(http, arrivals, done))
            started_ms = _now_ms()
            due = await _produce(http, started_ms)
            await asyncio.sleep(SEALED_WAIT_S)  # sealed, and the chain stored with the cursor
            assert not arrivals, "delivered before its time"
            written = await asyncio.to_thread(_delay_metrics, first.spec.port)
            assert written.get('danube_dispatcher_delayed_snapshots_total{event="written"}', 0)
            first.kill()  # SIGKILL
            killed_ms = _now_ms()
            snapshots = sorted(objects.rglob("*.dly"), key=lambda p: p.stat().st_size)
            assert snapshots, "no snapshot in object storage"
            torn = snapshots[-1]
            torn.write_bytes(torn.read_bytes()[: torn.stat().st_size // 2])  # cut short
            second = ServerProcess(
                spec_for("dispatcher", "dispatcher-1", **own), tmp_path / "d1.log"
            )
            dispatchers.append(second)
            await asyncio.to_thread(second.start)
            async with asyncio.timeout(60):
                while not due.keys() <= arrivals.keys():
                    await asyncio.sleep(0.05)
                    assert not consumer.done(), consumer
            done.set()
            await consumer
            metrics = await asyncio.to_thread(_delay_metrics, second.spec.port)
    finally:
        done.set()
        for process in dispatchers:
            process.stop()

    early = [ref for ref, at in due.items() if arrivals[ref][0] < at]
    assert early == [], f"{len(early)} delivered before their time"
    loaded = metrics.get("danube_dispatcher_delayed_snapshot_loaded_messages_total", 0)
    reread = metrics.get("danube_dispatcher_delayed_reread_frames_total", 0)
    failed = metrics.get('danube_dispatcher_delayed_snapshots_total{event="read_failed"}', 0)
    # The new owner took most from snapshots; it read from the log only the torn one's
    # range (one seal of one partition: at most every frame of it) and nothing past them.
    assert failed >= 1, metrics
    assert loaded > DELAYED // 4, metrics
    assert reread < DELAYED, metrics
    assert loaded + reread >= DELAYED, metrics  # every message came from one or the other
    served_ms = min(times[0] for times in arrivals.values())
    assert served_ms > killed_ms
    judged = {ref: arrivals[ref][0] - at for ref, at in due.items() if at >= served_ms + 500}
    assert len(judged) > DELAYED // 4, "too few messages due after the takeover to judge"
    # The torn snapshot's partition came from the log again (read when the snapshot failed
    # to load, as its first messages fell due); the other from intact snapshots.
    reread_part = torn.parent.name
    intact = sorted(ms for (p, _), ms in judged.items() if not p.endswith(reread_part))
    read_again = sorted(ms for (p, _), ms in judged.items() if p.endswith(reread_part))
    assert intact, judged
    assert read_again, judged
    duplicates = sum(len(times) - 1 for times in arrivals.values())
    print(
        f"loaded {loaded:.0f} from snapshots, read {reread:.0f} frames again, "
        f"{failed:.0f} snapshot(s) failed; due after: from snapshots {_stats(intact)}; "
        f"read again {_stats(read_again)}; duplicates {duplicates}"
    )
    # From intact snapshots: on time, nine in ten within 50 ms. The tail: when the first
    # snapshots fall due, the new owner stalls every delivery (both partitions alike, the
    # intact one's and the one read again) for up to 130-420 ms; p99 measured 32-143 ms
    # alone, 288 once in CI. Not the filing of the frames read again (filed in slices of
    # 100 in an experiment: the same tail); loading the snapshot due first is the suspect.
    assert _quantile(intact, 0.9) <= LATE_MS_MAX, _stats(intact)
    assert _quantile(intact, 0.99) <= STALL_MS_MAX, _stats(intact)
    # Read again: the damage costs only its own range, the time to find the snapshot torn
    # and read its 1 500 frames from the log.
    assert read_again[-1] <= REREAD_MS_MAX, _stats(read_again)

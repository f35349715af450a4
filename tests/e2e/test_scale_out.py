"""Scale-out and drain with the whole mesh of real processes: 24 factor-1 partitions on one
ingest node under a producer at ~2 000 msg/s and a consumer; two nodes join and the
controller's balancer spreads the partitions (8 ± 2 each) by live moves; then one node is
drained with `danube admin nodes drain` and ends up with nothing. The history checker
judges every acknowledged and delivered message; produce latency and consumer stalls are
measured and printed."""

from __future__ import annotations

import asyncio
import itertools
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest

from danube.config import MetadataConfig
from danube.meta import MetaStore
from danube.meta import keys as meta_keys
from danube.meta.records import Owner
from danube.up import ProcessSpec, ServerProcess
from tests.history import History

# Solo (Makefile): it asserts the mesh's stalls (no consumer gap of 1 s, no produce request of
# 2 s) through live moves. Beside another mesh on the same two cores it failed twice (a 1.03 s
# gap in a rehearsal; CI at stop 51); alone or beside two CPU hogs its gap is 0.30-0.40 s.
pytestmark = [pytest.mark.e2e, pytest.mark.solo, pytest.mark.timeout(400)]

TOPIC = "elastic"
PARTITIONS = 24
RATE_MSG_S = 2000
BATCH = 100
SUB = "s"
FAST = {
    "DANUBE_INGEST__LEASE_TTL_S": "3",
    "DANUBE_INGEST__PREFERRED_LEADER_SETTLE_S": "0.5",
}
DISCOVERY = {
    "DANUBE_DISCOVERY__BALANCE_INTERVAL_S": "2",
    "DANUBE_DISCOVERY__BALANCE_MOVES_MAX": "4",
}


@dataclass
class Load:
    history: History = field(default_factory=History)
    latencies_s: list[tuple[float, float]] = field(default_factory=list)  # (sent at, took)
    delivered_at: list[float] = field(default_factory=list)
    sent: int = 0
    errors: Counter[str] = field(default_factory=Counter)


async def _produce(http: httpx.AsyncClient, load: Load, stop: asyncio.Event) -> None:
    """~RATE_MSG_S messages a second in batches, paced; each batch retried until stored."""
    loop = asyncio.get_running_loop()
    period_s = BATCH / RATE_MSG_S
    next_at = loop.time()
    while not stop.is_set():
        ids = [f"m{load.sent + i}" for i in range(BATCH)]
        load.sent += BATCH
        body = {"messages": [{"payload": i} for i in ids]}
        started = loop.time()
        while True:
            response = await http.post(f"/v1/topics/default/{TOPIC}/messages", json=body)
            if response.status_code == 200:
                break
            load.errors[str(response.status_code)] += 1
            for msg_id in ids:
                load.history.produced(msg_id, acked=False)
            assert response.status_code in (429, 503), response.text
            await asyncio.sleep(0.02)
        load.latencies_s.append((started, loop.time() - started))
        for msg_id, result in zip(ids, response.json()["results"], strict=True):
            load.history.produced(
                msg_id, partition=result["partition"], offset=result["offset"], acked=True
            )
        next_at += period_s
        await asyncio.sleep(max(0.0, next_at - loop.time()))


async def _consume(http: httpx.AsyncClient, load: Load, stop: asyncio.Event) -> None:
    path = f"/v1/topics/default/{TOPIC}/subscriptions/{SUB}/consumers"
    response = await http.post(path, json={"name": "c", "type": "exclusive", "start": "earliest"})
    assert response.status_code == 201, response.text
    consumer = response.json()["consumer_id"]
    loop = asyncio.get_running_loop()
    while not stop.is_set():
        response = await http.get(
            f"/v1/consumers/{consumer}/messages", params={"max": 1000, "wait_ms": 200}
        )
        assert response.status_code == 200, response.text
        messages = response.json()["messages"]
        if not messages:
            continue
        load.delivered_at.append(loop.time())
        for m in messages:
            load.history.delivered(m["payload"], partition=m["partition"], offset=m["offset"])
        refs = [{"partition": m["partition"], "offset": m["offset"]} for m in messages]
        ack = await http.post(f"/v1/consumers/{consumer}/ack", json={"messages": refs})
        assert ack.status_code == 204, ack.text


async def _leaders(store: MetaStore) -> Counter[str]:
    counts: Counter[str] = Counter()
    for kv in await store.range(meta_keys.partitions_prefix("default")):
        if kv.key.endswith("/owner"):
            counts[Owner.model_validate_json(kv.value).node_id] += 1
    return counts


PAUSE = "danube_ingest_leader_transfer_pause_seconds"


def _metric(url: str, name: str) -> float:
    """The sum of a metric's samples named exactly ``name`` (every label set)."""
    total = 0.0
    for line in httpx.get(url, timeout=5).text.splitlines():
        if line.startswith(name) and line[len(name) : len(name) + 1] in (" ", "{"):
            total += float(line.rsplit(" ", 1)[1])
    return total


def _p(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def test_scale_out_then_drain_under_load(
    tmp_path: Path,
    spec_for: Callable[..., ProcessSpec],
    services: Callable[..., ServerProcess],
    etcd_endpoint: str,
    meta_prefix: str,
) -> None:
    nodes = [services("ingest", "ingest-0", **FAST)]
    discovery = services("discovery", "discovery-0", **DISCOVERY)
    services("dispatcher", "dispatcher-0")
    store = await MetaStore.connect(MetadataConfig(etcd_endpoint=etcd_endpoint, prefix=meta_prefix))
    load = Load()
    stop = asyncio.Event()
    consumed = asyncio.Event()
    base_url = f"http://127.0.0.1:{discovery.spec.port}"
    try:
        async with httpx.AsyncClient(base_url=base_url, timeout=30) as http:
            made = await http.put(f"/v1/topics/default/{TOPIC}", json={"partitions": PARTITIONS})
            assert made.status_code in (200, 201), made.text
            consumer = asyncio.create_task(_consume(http, load, consumed))
            producer = asyncio.create_task(_produce(http, load, stop))
            # Creation places the partitions at best within PLACE_TIMEOUT_S (1 s; a loaded
            # machine leaves some to their first produce, danube.discovery.produce): every
            # one led by ingest-0 before the others join.
            async with asyncio.timeout(10):
                while True:
                    if (await _leaders(store)) == {"ingest-0": PARTITIONS}:
                        break
                    await asyncio.sleep(0.1)
            await asyncio.sleep(3.0)
            joined = asyncio.get_running_loop().time()
            # Started off the loop: a blocking start would stall the producer and consumer.
            nodes += await asyncio.gather(
                *(
                    asyncio.to_thread(services, "ingest", n, **FAST)
                    for n in ("ingest-1", "ingest-2")
                )
            )
            async with asyncio.timeout(120):
                while True:
                    counts = await _leaders(store)
                    if sum(counts.values()) == PARTITIONS and all(
                        6 <= counts[n] <= 10 for n in ("ingest-0", "ingest-1", "ingest-2")
                    ):
                        break
                    assert not producer.done()
                    assert not consumer.done()
                    await asyncio.sleep(0.2)
            balanced_s = asyncio.get_running_loop().time() - joined
            window = [t for s, t in load.latencies_s if s >= joined]
            print(
                f"scale-out 1 -> 3 nodes, 24 partitions, {RATE_MSG_S} msg/s: balanced "
                f"{dict(counts)} in {balanced_s:.1f}s; produce request p50 "
                f"{_p(window, 0.5) * 1000:.1f} ms, p99 {_p(window, 0.99) * 1000:.1f} ms, "
                f"max {max(window) * 1000:.1f} ms over {len(window)} requests"
            )
            # Drain ingest-2: everything it holds moves to the two others.
            drained = await http.post("/v1/nodes/ingest-2/drain")
            assert drained.status_code in (200, 201), drained.text
            drain_started = asyncio.get_running_loop().time()
            async with asyncio.timeout(120):
                while True:
                    counts = await _leaders(store)
                    if counts["ingest-2"] == 0 and sum(counts.values()) == PARTITIONS:
                        break
                    await asyncio.sleep(0.2)
            print(
                f"drain of ingest-2: done in "
                f"{asyncio.get_running_loop().time() - drain_started:.1f}s, leaders {dict(counts)}"
            )
            await asyncio.sleep(1.0)
            stopped = asyncio.get_running_loop().time()
            stop.set()
            await producer
            # Everything acknowledged reaches the consumer.
            acked = {p.msg_id: p for p in load.history.produces if p.acked}
            deadline = asyncio.get_running_loop().time() + 60
            while True:
                missing = acked.keys() - {d.msg_id for d in load.history.deliveries}
                if not missing:
                    break
                if consumer.done():
                    await consumer
                if asyncio.get_running_loop().time() > deadline:
                    where = Counter(str(acked[m].partition) for m in missing)
                    first = min((acked[m].partition or "", acked[m].offset or 0) for m in missing)
                    raise AssertionError(f"never delivered: {dict(where)}; first {first}")
                await asyncio.sleep(0.1)
            consumed.set()
            await consumer
            # Scraped once the load is over, off the loop: six blocking scrapes of the nodes'
            # metrics held this loop, its producer and its consumer, for up to 1.3 s on a
            # loaded machine (CI measured that as a 1.14 s "stall" of the mesh).
            pauses = [
                await asyncio.to_thread(_metric, f"http://127.0.0.1:{n.spec.port}/metrics", name)
                for n in nodes
                for name in (f"{PAUSE}_sum", f"{PAUSE}_count")
            ]
            transfers = sum(pauses[1::2])
            print(
                f"leadership transfers: {transfers:.0f}, mean pause to hand-over written "
                f"{sum(pauses[0::2]) / max(transfers, 1) * 1000:.1f} ms"
            )
    finally:
        stop.set()
        consumed.set()
        await store.close()
    report = load.history.check()
    assert report.ok, report.summary()
    # The consumer's stalls while messages flow: from the nodes joining to the producer's end.
    during = [t for t in load.delivered_at if joined <= t <= stopped]
    gaps = [(b - a, a - joined) for a, b in itertools.pairwise(during)]
    longest_gap, at_s = max(gaps)
    print(
        f"consumer: longest gap between deliveries {longest_gap:.3f}s ({at_s:.1f}s after the "
        f"joins; drain began at {drain_started - joined:.1f}s); produce errors "
        f"{dict(load.errors)}; acknowledged {sum(1 for p in load.history.produces if p.acked)}"
    )
    slowest = sorted(load.latencies_s, key=lambda x: x[1])[-3:]
    print(
        "slowest produce requests (s after the joins: took): "
        + ", ".join(f"{s - joined:.2f}: {t:.3f}s" for s, t in slowest)
    )
    assert longest_gap < 1.0
    assert max(t for _, t in load.latencies_s) < 2.0

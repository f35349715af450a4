"""The mesh with 2 ingest and 2 discovery processes at replication factor 2: leaders spread,
produce through either discovery, an ingest killed with SIGKILL hands leadership over within
the documented time, its restart rejoins every ISR and never makes two leaders, and killing
the controller moves controller leadership."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections import defaultdict
from collections.abc import Callable
from typing import Any

import httpx
import nats
import orjson
import pytest

from danube.up import ServerProcess

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240)]

TOPICS = [(f"t{i}", 3 if i < 4 else 0) for i in range(10)]  # 4 partitioned x 3 + 6 single
REASSIGN_BOUND_S = 3 + 7  # ingest lease TTL (3 s in these tests) + reaction and claim


def _partitions() -> list[str]:
    names = []
    for topic, count in TOPICS:
        names += [f"/default/{topic}-part-{i}" for i in range(count)] or [f"/default/{topic}"]
    return names


def _stats_subject(partition: str) -> str:
    _, ns, topic = partition.split("/")
    base, _, part = topic.rpartition("-part-")
    return f"danube.wal.stats.{ns}.{base}.{part}" if base else f"danube.wal.stats.{ns}.{topic}._"


class Sampler:
    """Asks every partition's stats subject who serves it, again and again, and records any
    moment where two nodes answer for one partition as its unfenced leader. A leader that
    handed leadership over (or lost it) is fenced at once (it acknowledges nothing more) and
    drops its subscriptions a moment later: its answers say ``fenced`` and do not count."""

    def __init__(self, nats_url: str) -> None:
        self.nats_url = nats_url
        self.doubles: list[tuple[str, set[str]]] = []
        self.samples = 0

    async def run(self, stop: asyncio.Event) -> None:
        nc = await nats.connect(self.nats_url)
        try:
            while not stop.is_set():
                await self._sample(nc)
                self.samples += 1
        finally:
            await nc.close()

    async def _sample(self, nc: Any) -> None:
        answers: dict[str, set[str]] = defaultdict(set)
        inbox = nc.new_inbox()

        async def collect(msg: Any) -> None:
            if msg.data:
                stats = orjson.loads(msg.data)
                if not stats["fenced"]:
                    answers[msg.subject.rsplit(".", 1)[1]].add(stats["node_id"])

        sub = await nc.subscribe(f"{inbox}.*", cb=collect)
        partitions = _partitions()
        for index, partition in enumerate(partitions):
            await nc.publish(_stats_subject(partition), b"", reply=f"{inbox}.{index}")
        await nc.flush()
        await asyncio.sleep(0.3)
        await sub.unsubscribe()
        for slot, nodes in answers.items():
            if len(nodes) > 1:
                self.doubles.append((partitions[int(slot)], nodes))


async def _owners(client: httpx.AsyncClient) -> dict[str, str | None]:
    owners: dict[str, str | None] = {}
    for topic, _ in TOPICS:
        response = await client.get(f"/v1/lookup/default/{topic}")
        assert response.status_code == 200, response.text
        for entry in response.json()["partitions"]:
            owner = entry["owner"]
            owners[entry["name"]] = None if owner is None else owner["node_id"]
    return owners


async def _until(condition: Callable[[], Any], timeout_s: float, what: str) -> float:
    started = time.monotonic()
    while True:
        if await condition():
            return time.monotonic() - started
        assert time.monotonic() - started < timeout_s, f"not within {timeout_s}s: {what}"
        await asyncio.sleep(0.1)


async def _produce(client: httpx.AsyncClient, topic: str, count: int) -> list[tuple[str, int]]:
    body = {"messages": [{"payload": f"m{i}", "key": f"k{i}"} for i in range(count)]}
    response = await client.post(f"/v1/topics/default/{topic}/messages", json=body, timeout=20)
    assert response.status_code == 200, response.text
    return [(r["partition"], r["offset"]) for r in response.json()["results"]]


async def test_two_ingest_two_discovery_failover(
    services: Callable[..., ServerProcess], nats_url: str
) -> None:
    replicated = {"DANUBE_INGEST__REPLICATION_FACTOR": "2"}  # a kill moves leadership
    ingest = [services("ingest", f"ingest-{i}", **replicated) for i in range(2)]
    discovery = [services("discovery", f"discovery-{i}") for i in range(2)]
    urls = [f"http://127.0.0.1:{d.spec.port}" for d in discovery]
    clients = [httpx.AsyncClient(base_url=url, timeout=10) for url in urls]
    sampler = Sampler(nats_url)
    stop_sampling = asyncio.Event()
    sampling = asyncio.create_task(sampler.run(stop_sampling))
    answered: dict[str, set[int]] = defaultdict(set)

    def record(results: list[tuple[str, int]]) -> None:
        for partition, offset in results:
            assert offset not in answered[partition], f"{partition}@{offset} answered twice"
            answered[partition].add(offset)

    try:
        for topic, partitions in TOPICS:
            response = await clients[0].put(
                f"/v1/topics/default/{topic}", json={"partitions": partitions}
            )
            assert response.status_code in (200, 201), response.text
        # Partitions are placed (and get a leader) at their first produce.
        for index, (topic, _) in enumerate(TOPICS):
            record(await _produce(clients[index % 2], topic, 20))

        async def all_owned() -> bool:
            owners = await _owners(clients[1])
            return len(owners) == len(_partitions()) and None not in owners.values()

        await _until(all_owned, 30, "every partition owned")
        owners = await _owners(clients[0])
        spread = {node: list(owners.values()).count(node) for node in ("ingest-0", "ingest-1")}
        assert min(spread.values()) >= 1, spread  # leaders on both nodes

        # SIGKILL ingest-1 and keep it down: its partitions move to ingest-0.
        moved = [p for p, node in owners.items() if node == "ingest-1"]
        ingest_pid = ingest[1].pid
        assert ingest_pid is not None
        os.kill(ingest_pid, signal.SIGKILL)
        ingest[1].kill()

        async def moved_over() -> bool:
            now = await _owners(clients[0])
            return all(now[p] == "ingest-0" for p in moved)

        took_s = await _until(moved_over, REASSIGN_BOUND_S + 5, "partitions moved")
        assert took_s <= REASSIGN_BOUND_S, f"reassignment took {took_s:.1f}s"
        print(f"\n{len(moved)} partitions moved off the killed ingest in {took_s:.1f} s")
        for index, (topic, _) in enumerate(TOPICS):
            record(await _produce(clients[index % 2], topic, 20))

        # Restart it: it serves again, and no partition ever has two serving owners.
        ingest[1] = services("ingest", "ingest-1", **replicated)

        async def in_sync_again() -> bool:
            for topic, _ in TOPICS:
                found = (await clients[0].get(f"/v1/topics/default/{topic}")).json()
                for partition in found["partitions"]:
                    if "ingest-1" not in partition["offsets"]["isr"]:
                        return False
            return True

        await _until(in_sync_again, 30, "the restarted ingest back in every ISR")
        for index, (topic, _) in enumerate(TOPICS):
            record(await _produce(clients[index % 2], topic, 20))

        # Kill the controller's discovery: the other takes over leadership.
        leader = (await clients[0].get("/v1/cluster")).json()["controller"]["leader"]
        assert leader in ("discovery-0", "discovery-1")
        dead = 0 if leader == "discovery-0" else 1
        dead_pid = discovery[dead].pid
        assert dead_pid is not None
        os.kill(dead_pid, signal.SIGKILL)
        discovery[dead].kill()
        survivor = clients[1 - dead]

        async def took_over() -> bool:
            cluster = (await survivor.get("/v1/cluster")).json()
            return bool(cluster["controller"]["leader"] == f"discovery-{1 - dead}")

        leader_s = await _until(took_over, 15, "leadership moved")
        print(f"controller leadership moved in {leader_s:.1f} s")
        record(await _produce(survivor, TOPICS[0][0], 20))
    finally:
        stop_sampling.set()
        await sampling
        for client in clients:
            await client.aclose()
    assert sampler.samples > 10
    assert sampler.doubles == [], f"two nodes served one partition: {sampler.doubles[:5]}"

"""Replicated partitions with real ingest processes: contiguous offsets across leader
changes (kill, freeze), node loss with its disk, divergence truncated; every history checked
by tests/history.py."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from danube.bus import TopicName
from danube.config import MetadataConfig
from danube.meta import MetaStore
from danube.runtime import ProcessSpec

from replication import (
    NODE_ENV,
    Cluster,
    Producer,
    connect,
    leader,
    new_leader,
    read_all,
    wait_isr,
)
from tests.history import History

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(400)]

P = TopicName("default", "repl-part-0")


@pytest.fixture
def cluster(tmp_path: Path, spec_for: Callable[..., ProcessSpec]) -> Iterator[Callable[..., Cluster]]:
    made: list[Cluster] = []

    def make(nodes: int, *, factor: int, min_insync: int) -> Cluster:
        env = {
            **NODE_ENV,
            "DANUBE_INGEST__REPLICATION_FACTOR": str(factor),
            "DANUBE_INGEST__MIN_INSYNC_REPLICAS": str(min_insync),
        }
        specs = {f"ingest-{i}": spec_for("ingest", f"ingest-{i}", **env) for i in range(nodes)}
        found = Cluster(specs, tmp_path)
        made.append(found)
        for node in specs:
            found.start(node)
        return found

    yield make
    for found in made:
        found.stop_all()


async def test_leader_sigkill_rounds_factor_3_lose_nothing(
    cluster: Callable[..., Cluster], nats_url: str, etcd_endpoint: str, meta_prefix: str
) -> None:
    nodes = cluster(3, factor=3, min_insync=2)
    history = History()
    bus, client = await connect(nats_url, "repl-test")
    store = await MetaStore.connect(MetadataConfig(etcd_endpoint=etcd_endpoint, prefix=meta_prefix))
    producer = Producer(client, P, history)
    try:
        await producer.send(20)
        state = await wait_isr(store, P, 3)
        assert sorted(state.isr) == sorted(nodes.specs)
        for _ in range(2):
            owner = await leader(store, P)
            stop = asyncio.Event()
            running = asyncio.create_task(producer.run(stop))
            await asyncio.sleep(0.5)
            nodes.kill(owner.node_id)
            await new_leader(store, P, owner.epoch)
            await asyncio.sleep(0.5)
            stop.set()
            await running
            await asyncio.to_thread(nodes.start, owner.node_id)
            await wait_isr(store, P, 3)
        offsets = await read_all(client, P, history)
        report = history.check(expect_contiguous_from={str(P): 0})
        assert report.ok, report.summary()
        assert offsets == list(range(len(offsets)))
        assert len(offsets) >= producer.acked
        print("stalls", producer.stalls)
    finally:
        await store.close()
        await bus.close()

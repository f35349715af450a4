"""Idempotent producers through leader failovers with real ingest processes (factor 3, min in-sync
2): two producers that resend every unanswered batch, the leader killed (SIGKILL) or frozen past
its lease (SIGSTOP) round after round; the log holds exactly the messages the producers were
asked to send, each once (tests/history.py with exactly_once), and after each new leader a
resend of each producer's last batch is recognised with its original offsets. The same with two
SDK producers (idempotent by default) through a discovery process; over HTTP, a resend of the
last request after its leader was killed. And a restarted node (killed: it reads its log;
stopped: it reads its snapshot) still recognises a resend."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from danube.bus import TopicName
from danube.client import AsyncDanubeClient, AsyncProducer
from danube.meta import MetaStore
from danube.up import ServerProcess
from tests.history import History

from replication import Cluster, SequencedProducer, connect, leader, new_leader, read_all, wait_isr

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(400)]

P = TopicName("default", "idem-part-0")
SDK_P = TopicName("default", "idem-sdk-part-0")  # the one partition of /default/idem-sdk


async def _rounds(
    nodes: Cluster, store: MetaStore, nats_url: str, *, rounds: int, freeze: bool
) -> None:
    history = History()
    bus, client = await connect(nats_url, "idem-failover")
    producers = [SequencedProducer(client, P, history, name=name) for name in ("alpha", "beta")]
    try:
        for producer in producers:
            await producer.send_batch()
        await wait_isr(store, P, 3)
        recognised = 0
        for _ in range(rounds):
            owner = await leader(store, P)
            stop = asyncio.Event()
            running = [asyncio.create_task(p.run(stop)) for p in producers]
            await asyncio.sleep(0.3)
            if freeze:
                nodes.freeze(owner.node_id)
            else:
                nodes.kill(owner.node_id)
            elected = await new_leader(store, P, owner.epoch)
            assert elected.node_id != owner.node_id
            await asyncio.sleep(0.3)
            stop.set()
            await asyncio.gather(*running)
            # The new leader answers a resend of what its predecessor (or it) stored last.
            for producer in producers:
                assert producer.last is not None
                reply = await producer.resend_last()
                assert reply.duplicate, f"{producer.name}: last batch stored again"
                assert reply.first_offset == producer.last[1]
                recognised += 1
            if freeze:
                nodes.thaw(owner.node_id)
            else:
                await asyncio.to_thread(nodes.start, owner.node_id)
            await wait_isr(store, P, 3)
        offsets = await read_all(client, P, history)
        report = history.check(expect_contiguous_from={str(P): 0}, exactly_once=True)
        assert report.ok, report.summary()
        sent = sum(p.sent for p in producers)
        assert offsets == list(range(sent)), f"{len(offsets)} stored, {sent} sent"
        resent = sum(p.duplicate_answers for p in producers)
        print(
            f"{rounds} {'freeze' if freeze else 'kill'} rounds: {sent} messages sent and "
            f"stored once; {recognised} deliberate resends and {resent} retries answered as "
            "duplicates"
        )
    finally:
        await bus.close()


# 3 rounds of each in `make test`, 10 in `make bench` (a soak): at the ingest contract and
# through the SDK below alike.
ROUNDS = [pytest.param(10, marks=pytest.mark.soak), 3]


@pytest.mark.parametrize("rounds", ROUNDS)
async def test_leader_sigkill_rounds_two_idempotent_producers_store_each_message_once(
    cluster: Callable[..., Cluster], nats_url: str, store: MetaStore, rounds: int
) -> None:
    nodes = cluster(3, factor=3, min_insync=2)
    await _rounds(nodes, store, nats_url, rounds=rounds, freeze=False)


@pytest.mark.parametrize("rounds", ROUNDS)
async def test_leader_frozen_past_its_lease_two_idempotent_producers_store_each_message_once(
    cluster: Callable[..., Cluster], nats_url: str, store: MetaStore, rounds: int
) -> None:
    nodes = cluster(3, factor=3, min_insync=2)
    await _rounds(nodes, store, nats_url, rounds=rounds, freeze=True)


async def test_a_restarted_node_recognises_a_resend_from_its_log_and_from_its_snapshot(
    cluster: Callable[..., Cluster], nats_url: str, store: MetaStore, tmp_path: Path
) -> None:
    """Factor 1: killed, the node rebuilds its producers' states from the log; stopped
    cleanly, it writes a snapshot at close and rebuilds from it."""
    nodes = cluster(1, factor=1, min_insync=1)
    history = History()
    bus, client = await connect(nats_url, "idem-restart")
    producer = SequencedProducer(client, P, history, name="gamma")
    try:
        for _ in range(50):
            await producer.send_batch()
        assert producer.last is not None
        owner = await leader(store, P)
        for restart in ("kill", "stop"):
            if restart == "kill":
                nodes.kill(owner.node_id)
            else:
                nodes.processes[owner.node_id].stop()
                snapshots = await asyncio.to_thread(
                    lambda: list(tmp_path.rglob("producers-*.snap"))
                )
                assert snapshots, "no snapshot at a clean close"
            await asyncio.to_thread(nodes.start, owner.node_id)
            reply = await producer.resend_last()
            assert reply.duplicate, f"after a {restart}: the last batch stored again"
            assert reply.first_offset == producer.last[1]
            await producer.send_batch()  # and the next sequence goes on
        offsets = await read_all(client, P, history)
        report = history.check(expect_contiguous_from={str(P): 0}, exactly_once=True)
        assert report.ok, report.summary()
        assert offsets == list(range(producer.sent))
    finally:
        await bus.close()


class SdkSender:
    """An SDK producer sending batches of 1..4 numbered messages and waiting for each batch's
    answers (its own retries through failovers included); records them in the history."""

    def __init__(self, producer: AsyncProducer, history: History, name: str) -> None:
        self.producer = producer
        self.history = history
        self.name = name
        self.sent = 0  # messages it was asked to send (each acknowledged in the end)

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            ids = [f"{self.name}-{self.sent + i}" for i in range(1 + self.sent % 4)]
            self.sent += len(ids)
            results = await (await self.producer.send_many([i.encode() for i in ids]))
            for msg_id, result in zip(ids, results, strict=True):
                assert result.partition == str(SDK_P)
                self.history.produced(
                    msg_id, partition=result.partition, offset=result.offset, acked=True
                )


async def _sdk_rounds(
    nodes: Cluster,
    discovery: ServerProcess,
    store: MetaStore,
    nats_url: str,
    *,
    rounds: int,
    freeze: bool,
) -> None:
    history = History()
    bus, client = await connect(nats_url, "idem-sdk")
    url = f"http://127.0.0.1:{discovery.spec.port}"
    sdks = [AsyncDanubeClient(url), AsyncDanubeClient(url)]
    try:
        await sdks[0].admin.create_topic(
            SDK_P.parent, partitions=1, replication_factor=3, min_insync_replicas=2
        )
        producers = [sdk.producer(SDK_P.parent, linger_ms=1) for sdk in sdks]
        senders = [SdkSender(p, history, f"sdk{i}") for i, p in enumerate(producers)]
        await producers[0].send_and_wait(b"warm-up")
        await wait_isr(store, SDK_P, 3)
        for _ in range(rounds):
            owner = await leader(store, SDK_P)
            stop = asyncio.Event()
            running = [asyncio.create_task(s.run(stop)) for s in senders]
            await asyncio.sleep(0.3)
            if freeze:
                nodes.freeze(owner.node_id)
            else:
                nodes.kill(owner.node_id)
            await new_leader(store, SDK_P, owner.epoch)
            await asyncio.sleep(0.3)
            stop.set()
            await asyncio.gather(*running)
            if freeze:
                nodes.thaw(owner.node_id)
            else:
                await asyncio.to_thread(nodes.start, owner.node_id)
            await wait_isr(store, SDK_P, 3)
        for producer in producers:
            await producer.close()
        offsets = await read_all(client, SDK_P, history)
    finally:
        for sdk in sdks:
            await sdk.close()
        await bus.close()
    report = history.check(exactly_once=True)
    assert report.ok, report.summary()
    sent = sum(s.sent for s in senders) + 1  # and the warm-up
    assert offsets == list(range(sent)), f"{len(offsets)} stored, {sent} sent"
    print(f"{rounds} {'freeze' if freeze else 'kill'} rounds, SDK: {sent} sent, stored once")


@pytest.mark.parametrize("rounds", ROUNDS)
@pytest.mark.parametrize("freeze", [False, True], ids=["sigkill", "sigstop"])
async def test_leader_kill_or_freeze_rounds_two_sdk_producers_store_each_message_once(
    cluster: Callable[..., Cluster],
    services: Callable[..., ServerProcess],
    nats_url: str,
    store: MetaStore,
    freeze: bool,
    rounds: int,
) -> None:
    nodes = cluster(3, factor=3, min_insync=2)
    discovery = services("discovery", "discovery-0")
    await _sdk_rounds(nodes, discovery, store, nats_url, rounds=rounds, freeze=freeze)


async def test_an_http_resend_after_its_leader_was_killed_is_recognised(
    cluster: Callable[..., Cluster],
    services: Callable[..., ServerProcess],
    store: MetaStore,
) -> None:
    """The same JSON request (same producer, same sequences) to the partition, before and
    after its leader is killed: the new leader answers the first offsets, duplicate."""
    nodes = cluster(3, factor=3, min_insync=2)
    discovery = services("discovery", "discovery-0")
    path = f"/v1/topics/default/{SDK_P.topic}/messages"
    body = {
        "producer": "curl-1",
        "messages": [{"payload": f"m{i}", "sequence": i} for i in range(3)],
    }
    async with httpx.AsyncClient(
        base_url=f"http://127.0.0.1:{discovery.spec.port}", timeout=30
    ) as http:
        created = await http.put(
            f"/v1/topics/default/{SDK_P.parent.topic}",
            json={"partitions": 1, "replication_factor": 3, "min_insync_replicas": 2},
        )
        assert created.status_code in (200, 201), created.text
        first = await http.post(path, json=body)
        assert first.status_code == 200, first.text
        await wait_isr(store, SDK_P, 3)
        owner = await leader(store, SDK_P)
        nodes.kill(owner.node_id)
        await new_leader(store, SDK_P, owner.epoch)
        again = await http.post(path, json=body)
        assert again.status_code == 200, again.text
        offsets = [r["offset"] for r in first.json()["results"]]
        assert [r["offset"] for r in again.json()["results"]] == offsets == [0, 1, 2]
        assert all(r.get("duplicate") is True for r in again.json()["results"])
        assert not any(r.get("duplicate") for r in first.json()["results"])
        gap = await http.post(
            path, json={"producer": "curl-1", "messages": [{"payload": "x", "sequence": 9}]}
        )
        assert gap.status_code == 409
        assert gap.json()["error"]["code"] == "out_of_order_sequence"

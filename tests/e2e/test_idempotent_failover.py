"""Idempotent producers through leader failovers with real ingest processes (factor 3, min
in-sync 2): two producers that resend every unanswered batch, the leader killed (SIGKILL)
or frozen past its lease (SIGSTOP) round after round; the log holds exactly the messages the
producers were asked to send, each once (tests/history.py with exactly_once), and after each
new leader a resend of each producer's last batch is recognised with its original offsets.
And a restarted node (killed: it reads its log; stopped: it reads its snapshot) still
recognises a resend."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

import pytest

from danube.bus import TopicName
from danube.meta import MetaStore
from tests.history import History

from replication import Cluster, SequencedProducer, connect, leader, new_leader, read_all, wait_isr

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(400)]

P = TopicName("default", "idem-part-0")
KILL_ROUNDS = 10
FREEZE_ROUNDS = 10


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


async def test_leader_sigkill_rounds_two_idempotent_producers_store_each_message_once(
    cluster: Callable[..., Cluster], nats_url: str, store: MetaStore
) -> None:
    nodes = cluster(3, factor=3, min_insync=2)
    await _rounds(nodes, store, nats_url, rounds=KILL_ROUNDS, freeze=False)


async def test_leader_frozen_past_its_lease_two_idempotent_producers_store_each_message_once(
    cluster: Callable[..., Cluster], nats_url: str, store: MetaStore
) -> None:
    nodes = cluster(3, factor=3, min_insync=2)
    await _rounds(nodes, store, nats_url, rounds=FREEZE_ROUNDS, freeze=True)


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

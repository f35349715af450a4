"""Fault: etcd frozen (SIGSTOP) for 4 dispatcher lease TTLs under produce and consume load
(the SDK through discovery, exclusive subscription over two partitions): the dispatcher
serves through it (docs/dispatcher.md, "Through an etcd outage"): no gap between
deliveries over 1 s, every produced message delivered, first deliveries in offset order per
partition, and once etcd is back the subscription is reclaimed (same dispatcher and epoch,
owner key written again) and its stored cursors reach the partitions' ends."""

from __future__ import annotations

import asyncio
import itertools
import os
import signal
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from danube.client import AsyncDanubeClient
from danube.config import MetadataConfig
from danube.meta import MetaStore, TopicName
from danube.meta import keys as meta_keys
from danube.meta.records import Owner, SubscriptionCursor
from danube.up import ServerProcess, etcd_spec, free_port

pytestmark = [pytest.mark.e2e, pytest.mark.fault, pytest.mark.timeout(150)]

LEASE_TTL_S = 2
STALL_S = 4 * LEASE_TTL_S
AFTER_S = 4.0  # load goes on this long after the thaw: the reclaim happens meanwhile
GAP_MAX_S = 1.0  # the must-show: no longer wait between two deliveries, through the stall
CATCH_UP_S = 20.0
PARTITIONS = 2
TOPIC = TopicName("default", "stall-consume")
SUB = "s"


@pytest.fixture
def free_etcd(tmp_path: Path) -> Iterator[ServerProcess]:
    """An etcd of this test's own (it gets frozen)."""
    spec = etcd_spec(data_dir=tmp_path / "etcd", client_port=free_port(), peer_port=free_port())
    process = ServerProcess(spec, tmp_path / "etcd.log")
    process.start()
    yield process
    if process.pid is not None:
        os.kill(process.pid, signal.SIGCONT)
    process.stop()


async def _owner(store: MetaStore) -> tuple[Owner, int]:
    found = await store.get_model_kv(meta_keys.subscription_owner_key(TOPIC, SUB), Owner)
    assert found is not None, "the subscription has no owner"
    return found[0], found[1].mod_revision


def _metric(text: str, name: str) -> float:
    """A sample's value in a /metrics page (0 when absent)."""
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    return 0.0


def _lease_story(process: ServerProcess) -> str:
    """What the service logged about its lease and claims (a failure's context)."""
    words = ("lease", "reclaim", "registered", "claim", "fenced", "failed")
    lines = process.log_path.read_text(errors="replace").splitlines()
    return "\n".join(line[:300] for line in lines if any(w in line for w in words))[-6000:]


async def _stored_cursors(store: MetaStore) -> dict[str, int]:
    found: dict[str, int] = {}
    for partition in TOPIC.partitions(PARTITIONS):
        key = meta_keys.subscription_cursor_key(TOPIC, SUB, partition)
        cursor = await store.get_model(key, SubscriptionCursor)
        found[str(partition)] = -1 if cursor is None else cursor.next_offset
    return found


async def test_etcd_stall_consume_goes_on(
    services: Callable[..., ServerProcess], meta_prefix: str, free_etcd: ServerProcess
) -> None:
    etcd = free_etcd
    assert etcd.pid is not None
    endpoint = f"127.0.0.1:{etcd.spec.port}"
    env = {"DANUBE_WAL_CLOUD__METADATA__ETCD_ENDPOINT": endpoint}
    for kind in ("ingest", "dispatcher", "discovery"):
        env[f"DANUBE_{kind.upper()}__LEASE_TTL_S"] = str(LEASE_TTL_S)
    services("ingest", "ingest-sc", **env)
    dispatcher = services("dispatcher", "dispatcher-sc", **env)
    discovery = services("discovery", "discovery-sc", **env)
    store = await MetaStore.connect(MetadataConfig(etcd_endpoint=endpoint, prefix=meta_prefix))
    sdk = AsyncDanubeClient(f"http://127.0.0.1:{discovery.spec.port}")
    loop = asyncio.get_running_loop()
    produced: dict[tuple[str, int], bytes] = {}
    deliveries: list[tuple[float, str, int, bytes, int]] = []  # (at, partition, offset, ..)
    stop = asyncio.Event()
    try:
        await sdk.admin.create_topic(TOPIC, partitions=PARTITIONS)
        consumer = await sdk.subscribe(
            TOPIC, SUB, name="c", type="exclusive", start="earliest", poll_wait_ms=200
        )

        async def produce() -> None:
            async with sdk.producer(TOPIC, linger_ms=0) as producer:
                number = 0
                while not stop.is_set():
                    payload = f"m{number}".encode()
                    stored = await producer.send_and_wait(payload)
                    produced[(stored.partition, stored.offset)] = payload
                    number += 1
                    await asyncio.sleep(0.01)

        async def consume() -> None:
            while True:
                message = await consumer.receive()
                deliveries.append(
                    (
                        loop.time(),
                        message.partition,
                        message.offset,
                        message.payload,
                        message.redelivery_count,
                    )
                )
                consumer.ack(message)

        producing = asyncio.create_task(produce())
        consuming = asyncio.create_task(consume())
        await asyncio.sleep(2.0)
        before = await _owner(store)
        frozen_at = loop.time()
        os.kill(etcd.pid, signal.SIGSTOP)
        try:
            await asyncio.sleep(STALL_S)
        finally:
            os.kill(etcd.pid, signal.SIGCONT)
        thawed_at = loop.time()
        await asyncio.sleep(AFTER_S)
        stop.set()
        await producing
        expected = dict(produced)
        ends = {str(p): 0 for p in TOPIC.partitions(PARTITIONS)}
        for partition, offset in expected:
            ends[partition] = max(ends[partition], offset + 1)

        async with asyncio.timeout(CATCH_UP_S):  # everything delivered
            while not set(expected) <= {(d[1], d[2]) for d in deliveries}:  # noqa: ASYNC110
                await asyncio.sleep(0.1)
        await consumer.flush_acks()
        async with asyncio.timeout(CATCH_UP_S):  # and acknowledged into the stored cursors
            while await _stored_cursors(store) != ends:  # noqa: ASYNC110 - etcd polled
                await asyncio.sleep(0.2)
        subscriptions = await sdk.admin.subscriptions(TOPIC)
        consuming.cancel()
        async with httpx.AsyncClient() as http:
            url = f"http://127.0.0.1:{dispatcher.spec.port}/metrics"
            metrics_text = (await http.get(url, timeout=5)).text
        after = await _owner(store)

        window = [d for d in deliveries if frozen_at - 1.0 <= d[0] <= thawed_at + AFTER_S]
        gaps = [(b[0] - a[0], a[0] - frozen_at) for a, b in itertools.pairwise(window)]
        longest = max(gaps)
        during = [d for d in deliveries if frozen_at <= d[0] <= thawed_at]
        print(
            f"etcd frozen {STALL_S:.0f}s (dispatcher lease {LEASE_TTL_S}s): {len(expected)} "
            f"produced, {len(deliveries)} deliveries ({len(during)} during the stall, "
            f"{sum(1 for d in deliveries if d[4] > 0)} redeliveries); longest gap between "
            f"deliveries {longest[0]:.3f}s at {longest[1]:+.1f}s from the freeze; owner "
            f"revision {before[1]} -> {after[1]}; "
            f"{_metric(metrics_text, 'danube_dispatcher_leaseless_acks_total'):.0f} acks "
            "answered without the lease"
        )
        assert len(during) > 50, "the consumer went on receiving during the stall"
        assert longest[0] <= GAP_MAX_S, longest
        # Every produced message delivered, with its payload, in offset order per partition
        # (exclusive); a redelivery may come again, never a message out of turn the first time.
        for _, partition, offset, payload, _ in deliveries:
            assert expected.get((partition, offset), payload) == payload
        for partition in ends:
            firsts: list[int] = []
            for _, p, offset, _, _ in deliveries:
                if p == partition and offset not in firsts:
                    firsts.append(offset)
            assert firsts == sorted(firsts), partition
            assert set(range(ends[partition])) <= set(firsts), partition
        # Served through: the same dispatcher and epoch, its owner key written again under a
        # new lease (the old one expired with the stall), and no backlog left.
        assert (after[0].node_id, after[0].epoch) == (before[0].node_id, before[0].epoch)
        assert after[1] > before[1], "the owner key was not written again"
        # ... because it served without its lease and reclaimed the subscription (the
        # epoch alone cannot tell: a fresh claim after the key expired is epoch 1 again).
        reclaims = 'danube_dispatcher_reclaims_total{outcome="reclaimed"}'
        assert _metric(metrics_text, reclaims) == 1, _lease_story(dispatcher)
        assert _metric(metrics_text, 'danube_dispatcher_reclaims_total{outcome="lost"}') == 0
        assert _metric(metrics_text, "danube_dispatcher_leaseless_acks_total") > 0
        assert _metric(metrics_text, "danube_dispatcher_leaseless_seconds") == 0
        (subscription,) = [s for s in subscriptions if s.name == SUB]
        assert subscription.backlog == 0, subscription
    finally:
        stop.set()
        os.kill(etcd.pid, signal.SIGCONT)
        await sdk.close()
        await store.close()

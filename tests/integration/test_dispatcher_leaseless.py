"""A dispatcher without its node lease, on real NATS and etcd with an in-process ingest
(docs/dispatcher.md, "Through an etcd outage"): it serves on (delivers, answers acks from
memory, holds its cursor writes); it stops at once on hearing another dispatcher's newer
claim on the bus; its reclaim under a new lease succeeds when nothing changed (same epoch,
held cursor written) and is refused, dropping the subscription, when another dispatcher
claimed it meanwhile; and a watch that replays the owner key's deletion with the lost lease
after the reclaim leaves the reclaimed subscription served."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

import pytest

from danube.bus import Bus, Subscription, TopicName
from danube.bus.subjects import Kind
from danube.config import DanubeSettings
from danube.dispatcher.node import DispatcherNode
from danube.dispatcher.served import ServedSubscription
from danube.frame import Record, encode_record
from danube.ingest import app as ingest_app
from danube.meta import Lease, MetaStore, Txn, TxnResult, WatchEvent
from danube.meta import keys as meta_keys
from danube.meta.errors import MetaTimeoutError
from danube.meta.records import Owner, SubscriptionCursor
from danube.runtime.service import run_in_process
from danube.wire.dispatcher.client import DispatcherClient
from danube.wire.ingest.client import IngestClient

pytestmark = pytest.mark.integration

TOPIC = TopicName("default", "leaseless")
SUB = "s"
LEASE_TTL_S = 10  # never runs out by itself here: the tests revoke it


@pytest.fixture
def settings(mesh_settings: Callable[..., DanubeSettings]) -> DanubeSettings:
    base = mesh_settings()
    dispatcher = base.dispatcher.model_copy(
        update={"balance_enabled": False, "cursor_flush_interval_s": 0.1}
    )
    return base.model_copy(update={"dispatcher": dispatcher})


@asynccontextmanager
async def _node(
    settings: DanubeSettings, bus: Bus, store: MetaStore, node_id: str
) -> AsyncIterator[tuple[DispatcherNode, Subscription]]:
    """A dispatcher node in this process that hears claim notices, as app.serve wires it."""
    lease = await store.grant_lease(LEASE_TTL_S)
    node = DispatcherNode(settings, node_id=node_id, bus=bus, store=store, lease=lease)
    notices = await bus.subscribe(
        bus.subjects.all_of_kind(Kind.SUBSCRIPTION_CLAIMED), node.on_claim_notice
    )
    try:
        yield node, notices
    finally:
        await notices.unsubscribe()
        await node.close(release=node.lease.alive)
        await node.lease.revoke()


async def _produce(bus: Bus, payloads: list[bytes]) -> None:
    records = [encode_record(Record(payload=p, publish_time_ms=1, producer="t")) for p in payloads]
    await IngestClient(bus).produce(TOPIC, records, timeout_s=10)


async def _poll(client: DispatcherClient, consumer: str, count: int) -> list[tuple[str, int]]:
    got: list[tuple[str, int]] = []
    async with asyncio.timeout(10):
        while len(got) < count:
            batch = await client.poll(TOPIC, SUB, consumer, max=count - len(got), wait_ms=500)
            got += [(m.partition, m.offset) for m in batch]
    return got


async def _serving_leaseless(
    node: DispatcherNode, bus: Bus, client: DispatcherClient
) -> tuple[str, int]:
    """Serve the subscription on ``node``, deliver and ack 3 messages, then lose the lease
    (revoked: its owner key goes, as an expiry would take it); the consumer id and epoch."""
    runtime = await node.ensure_serving(TOPIC, SUB)
    consumer = await client.attach(TOPIC, SUB, "c", type="exclusive", start="earliest")
    await _produce(bus, [b"a", b"b", b"c"])
    assert await client.ack(TOPIC, SUB, consumer, await _poll(client, consumer, 3)) == []
    assert runtime.store.claim is not None
    epoch = runtime.store.claim.epoch
    await node.lease.revoke()
    assert node.leaseless_since is not None
    assert runtime.store.held
    # Serving on: new messages delivered, acks answered at once from memory.
    await _produce(bus, [b"d", b"e"])
    delivered = await _poll(client, consumer, 2)
    assert delivered == [(TOPIC.topic, 3), (TOPIC.topic, 4)]
    async with asyncio.timeout(1.0):
        assert await client.ack(TOPIC, SUB, consumer, delivered) == []
    assert not runtime.failed
    return consumer, epoch


async def _stored_next(store: MetaStore) -> int | None:
    key = meta_keys.subscription_cursor_key(TOPIC, SUB, TOPIC)
    cursor = await store.get_model(key, SubscriptionCursor)
    return None if cursor is None else cursor.next_offset


async def test_a_leaseless_dispatcher_stops_on_hearing_a_newer_claim(
    bus: Bus, store: MetaStore, settings: DanubeSettings
) -> None:
    client = DispatcherClient(bus)
    async with (
        run_in_process(ingest_app.serve, settings, "ingest-a"),
        _node(settings, bus, store, "disp-a") as (a, _),
        _node(settings, bus, store, "disp-b") as (b, _),
    ):
        await _serving_leaseless(a, bus, client)
        runtime_a = a.runtimes()[0]
        # A claims it while A is cut from etcd: A hears the notice and stops at once.
        runtime_b = await b.ensure_serving(TOPIC, SUB)
        async with asyncio.timeout(2.0):
            while (TOPIC, SUB) in a.subscriptions:  # noqa: ASYNC110 - retired by a task
                await asyncio.sleep(0.01)
        assert runtime_a.failed
        assert not runtime_b.failed
        owner = await store.get_model(meta_keys.subscription_owner_key(TOPIC, SUB), Owner)
        assert owner is not None
        assert owner.node_id == "disp-b"
        # B serves from the stored cursor: what A acked without its lease comes again
        # (at-least-once), what A acked with it does not.
        consumer = await client.attach(TOPIC, SUB, "c2", type="exclusive", start="earliest")
        again = await _poll(client, consumer, 2)
        assert again == [(TOPIC.topic, 3), (TOPIC.topic, 4)]


async def test_an_unchanged_subscription_is_reclaimed_at_its_epoch(
    bus: Bus, store: MetaStore, settings: DanubeSettings
) -> None:
    client = DispatcherClient(bus)
    async with (
        run_in_process(ingest_app.serve, settings, "ingest-a"),
        _node(settings, bus, store, "disp-a") as (a, _),
    ):
        consumer, epoch = await _serving_leaseless(a, bus, client)
        assert await _stored_next(store) == 3  # the leaseless acks are held in memory
        lease = await store.grant_lease(LEASE_TTL_S)
        a.lease = lease  # as NodeSession.renewed hands it over (renewed() also spawns this)
        assert await a.reclaim_all(lease) == 1
        assert a.leaseless_since is None
        found = await store.get_model_kv(meta_keys.subscription_owner_key(TOPIC, SUB), Owner)
        assert found is not None
        assert (found[0].node_id, found[0].epoch) == ("disp-a", epoch)
        assert found[1].lease_id == lease.id
        assert await _stored_next(store) == 5  # the held cursor, written fenced
        # And it serves on as before.
        await _produce(bus, [b"f"])
        assert await _poll(client, consumer, 1) == [(TOPIC.topic, 5)]


async def test_a_subscription_claimed_meanwhile_is_not_reclaimed(
    bus: Bus, store: MetaStore, settings: DanubeSettings
) -> None:
    client = DispatcherClient(bus)
    async with (
        run_in_process(ingest_app.serve, settings, "ingest-a"),
        _node(settings, bus, store, "disp-a") as (a, notices),
        _node(settings, bus, store, "disp-b") as (b, _),
    ):
        await notices.unsubscribe()  # A hears no notice (lost on the bus): etcd decides
        await _serving_leaseless(a, bus, client)
        runtime_a = a.runtimes()[0]
        await b.ensure_serving(TOPIC, SUB)  # B claims, then hands it on: the key is gone
        await b.hand_over((TOPIC, SUB), "drain")
        assert await store.get(meta_keys.subscription_owner_key(TOPIC, SUB)) is None
        assert not runtime_a.failed  # it did not hear
        lease = await store.grant_lease(LEASE_TTL_S)
        a.lease = lease
        assert await a.reclaim_all(lease) == 0
        assert runtime_a.failed
        assert await store.get(meta_keys.subscription_owner_key(TOPIC, SUB)) is None


async def test_a_replayed_deletion_older_than_the_reclaim_fences_nothing(
    bus: Bus, store: MetaStore, settings: DanubeSettings
) -> None:
    """After an etcd outage the owner watch resumes where it stopped and may deliver the
    deletion of the owner key (its lease expired) after the reclaim wrote the key again:
    that change is older than the claim and says nothing of it (the e2e etcd stall test
    saw the subscription fail there, and everything delivered during the stall come
    again from the stored cursor)."""
    client = DispatcherClient(bus)
    async with (
        run_in_process(ingest_app.serve, settings, "ingest-a"),
        _node(settings, bus, store, "disp-a") as (a, _),
    ):
        consumer, _ = await _serving_leaseless(a, bus, client)
        deleted_at = await store.ping()  # the owner key went with the revoked lease
        lease = await store.grant_lease(LEASE_TTL_S)
        a.lease = lease
        assert await a.reclaim_all(lease) == 1
        runtime = a.runtimes()[0]
        assert runtime.store.claim is not None
        assert runtime.store.claim.revision > deleted_at
        key = meta_keys.subscription_owner_key(TOPIC, SUB)
        stale = WatchEvent("delete", key, b"", deleted_at, 0, 0)
        a._on_subscription_event(stale)
        assert not runtime.failed
        await _produce(bus, [b"f"])
        assert await _poll(client, consumer, 1) == [(TOPIC.topic, 5)]
        # A deletion after the claim still fences it.
        a._on_subscription_event(
            WatchEvent("delete", key, b"", runtime.store.claim.revision + 1, 0, 0)
        )
        assert runtime.failed


async def _reclaimed_and_serving(
    bus: Bus,
    store: MetaStore,
    node: DispatcherNode,
    runtime: ServedSubscription,
    served: tuple[DispatcherClient, str],
) -> None:
    """A new node lease: the one subscription is reclaimed, its cursor (3) stored fenced,
    and it delivers on from there to ``served`` (the client and its consumer)."""
    client, consumer = served
    lease = await store.grant_lease(LEASE_TTL_S)
    node.lease = lease
    assert await node.reclaim_all(lease) == 1
    assert not runtime.failed
    assert await _stored_next(store) == 3  # the held cursor, written fenced
    await _produce(bus, [b"d"])
    assert await _poll(client, consumer, 1) == [(TOPIC.topic, 3)]


class _LeaseGoesMeanwhile:
    """A subscription's etcd whose node lease runs out while its next transaction is on the
    way (an etcd stall: the request waits, the lease expires, etcd comes back and drops the
    owner key with the lease before it applies the request)."""

    def __init__(self, store: MetaStore, lease: Lease) -> None:
        self.store = store
        self.lease = lease
        self.went = False

    def txn(self) -> Txn:
        return Txn(self)

    async def commit(self, txn: Txn) -> TxnResult:
        if not self.went:
            self.went = True
            await self.lease.revoke()
        return await self.store.commit(txn)


async def test_a_cursor_write_under_way_when_the_lease_goes_is_held_not_fenced(
    bus: Bus, store: MetaStore, settings: DanubeSettings
) -> None:
    """The cursor write's fence (the owner key's revision) fails because the key went with
    the lease while the write waited: that is no other owner, so the subscription serves on
    with the cursor held, and the reclaim writes it (the e2e etcd stall test saw it fail
    there instead, and everything acked during the stall come again)."""
    client = DispatcherClient(bus)
    async with (
        run_in_process(ingest_app.serve, settings, "ingest-a"),
        _node(settings, bus, store, "disp-a") as (a, _),
    ):
        runtime = await a.ensure_serving(TOPIC, SUB)
        consumer = await client.attach(TOPIC, SUB, "c", type="exclusive", start="earliest")
        await _produce(bus, [b"a", b"b", b"c"])
        delivered = await _poll(client, consumer, 3)
        meanwhile = _LeaseGoesMeanwhile(store, a.lease)
        runtime.store.store = meanwhile  # type: ignore[assignment]  # only txn() is used
        assert await client.ack(TOPIC, SUB, consumer, delivered) == []
        async with asyncio.timeout(5.0):
            while not meanwhile.went:  # noqa: ASYNC110 - the next tick's cursor write
                await asyncio.sleep(0.01)
        await asyncio.sleep(0.3)  # the write's answer, and the ticks after it
        assert a.leaseless_since is not None
        assert not runtime.failed
        assert await _stored_next(store) is None or await _stored_next(store) == 0
        runtime.store.store = store
        await _reclaimed_and_serving(bus, store, a, runtime, (client, consumer))


class _AnswerLost:
    """A subscription's etcd that applies the next transaction but whose answer never comes
    (an etcd stall: the request waits past its deadline, etcd comes back and applies it),
    and the node lease runs out right after."""

    def __init__(self, store: MetaStore, lease: Lease) -> None:
        self.store = store
        self.lease = lease
        self.went = False

    def txn(self) -> Txn:
        return Txn(self)

    async def commit(self, txn: Txn) -> TxnResult:
        if self.went:
            return await self.store.commit(txn)
        self.went = True
        result = await self.store.commit(txn)
        assert result.succeeded
        await self.lease.revoke()
        raise MetaTimeoutError("etcd txn: no answer within the deadline")


async def test_a_cursor_write_whose_answer_was_lost_is_ours_at_the_reclaim(
    bus: Bus, store: MetaStore, settings: DanubeSettings
) -> None:
    """The cursor write landed but its answer was lost, and the lease went: the reclaim sees
    the cursor key written after our last known write, and that value is the one we sent,
    so the subscription is reclaimed (the e2e etcd stall test saw it fail as "changed
    meanwhile" instead, and everything acked during the stall come again)."""
    client = DispatcherClient(bus)
    async with (
        run_in_process(ingest_app.serve, settings, "ingest-a"),
        _node(settings, bus, store, "disp-a") as (a, _),
    ):
        runtime = await a.ensure_serving(TOPIC, SUB)
        consumer = await client.attach(TOPIC, SUB, "c", type="exclusive", start="earliest")
        await _produce(bus, [b"a", b"b", b"c"])
        delivered = await _poll(client, consumer, 3)
        lost = _AnswerLost(store, a.lease)
        runtime.store.store = lost  # type: ignore[assignment]  # only txn() is used
        await client.ack(TOPIC, SUB, consumer, delivered)
        async with asyncio.timeout(5.0):
            while not lost.went or a.leaseless_since is None:  # noqa: ASYNC110
                await asyncio.sleep(0.01)
        assert await _stored_next(store) == 3  # it landed
        assert not runtime.failed
        runtime.store.store = store
        await _reclaimed_and_serving(bus, store, a, runtime, (client, consumer))

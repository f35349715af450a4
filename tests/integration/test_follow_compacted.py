"""A watch that must resume from a revision etcd has compacted away (a service cut off from
etcd longer than its compaction window) reads the state again and goes on watching, instead
of asking for the lost revision for ever; the dispatcher's re-read fences what it missed."""

from __future__ import annotations

import asyncio
from typing import cast

import aetcd
import pytest

from danube.bus import Bus, Responder
from danube.config import DanubeSettings
from danube.dispatcher.node import DispatcherNode, _Served
from danube.dispatcher.served import ServedSubscription
from danube.dispatcher.store import OwnerClaim
from danube.meta import MetaStore, WatchEvent, encode_model
from danube.meta import keys as meta_keys
from danube.meta.follow import follow_prefix
from danube.meta.records import Owner
from danube.names import TopicName

pytestmark = pytest.mark.integration

WAIT_S = 10.0


async def _compacted_history(store: MetaStore, etcd_endpoint: str) -> int:
    """Two writes under ``w/``, history compacted up to the second; the first's revision."""
    first = await store.put("w/a", b"1")
    last = await store.put("w/a", b"2")
    host, _, port = etcd_endpoint.rpartition(":")
    async with aetcd.Client(host, int(port)) as raw:
        await raw.compact(last)
    return first


class _Reread:
    """The caller's re-read: the revision it read at, each time it is asked."""

    def __init__(self, store: MetaStore) -> None:
        self.store = store
        self.revisions: list[int] = []
        self.done = asyncio.Event()

    async def __call__(self) -> int:
        revision = await self.store.ping()
        self.revisions.append(revision)
        self.done.set()
        return revision


def _follow(
    store: MetaStore, start: int, reread: _Reread | None
) -> tuple[asyncio.Task[None], asyncio.Queue[WatchEvent]]:
    seen: asyncio.Queue[WatchEvent] = asyncio.Queue()
    task = asyncio.create_task(
        follow_prefix(store, "w/", seen.put_nowait, start_revision=start, on_resync=reread)
    )
    return task, seen


async def test_a_compacted_resume_reads_again_then_watches_on(
    store: MetaStore, etcd_endpoint: str
) -> None:
    first = await _compacted_history(store, etcd_endpoint)
    reread = _Reread(store)
    task, seen = _follow(store, first, reread)
    try:
        await asyncio.wait_for(reread.done.wait(), WAIT_S)
        after = await store.put("w/b", b"3")
        event = await asyncio.wait_for(seen.get(), WAIT_S)
        assert (event.key, event.value, event.mod_revision) == ("w/b", b"3", after)
        assert seen.empty()  # nothing from before the re-read is passed on
        assert len(reread.revisions) == 1
    finally:
        task.cancel()


async def test_without_a_reread_it_watches_on_from_the_compaction(
    store: MetaStore, etcd_endpoint: str
) -> None:
    first = await _compacted_history(store, etcd_endpoint)
    task, seen = _follow(store, first, None)
    try:
        after = await store.put("w/b", b"3")
        got = [await asyncio.wait_for(seen.get(), WAIT_S)]
        while got[-1].mod_revision < after:
            got.append(await asyncio.wait_for(seen.get(), WAIT_S))
        assert (got[-1].key, got[-1].value) == ("w/b", b"3")
    finally:
        task.cancel()


class _Store:
    """The runtime's store as the owner check reads it: claimed under the node's lease."""

    def __init__(self, lease_id: int) -> None:
        self.held = False
        self.claim = OwnerClaim(epoch=1, revision=0, lease_id=lease_id)


class _Runtime:
    """What the node calls on a served subscription's runtime when it fences it."""

    def __init__(self, lease_id: int) -> None:
        self.failed: list[str] = []
        self.store = _Store(lease_id)

    def fail(self, reason: str) -> None:
        self.failed.append(reason)

    def hold_cursors(self, held: bool) -> None:
        self.store.held = held


async def test_the_dispatcher_rereads_its_owner_keys(store: MetaStore) -> None:
    topic = TopicName.parse("/ns/t")
    async with store.lease(10) as lease:
        node = DispatcherNode(
            DanubeSettings(), node_id="d1", bus=cast(Bus, None), store=store, lease=lease
        )
        runtimes = {sub: _Runtime(lease.id) for sub in ("mine", "moved", "gone")}
        for sub, runtime in runtimes.items():
            served = _Served(cast(ServedSubscription, runtime), cast(Responder, None))
            node._served.add((topic, sub), served)
        for sub, owner in (("mine", "d1"), ("moved", "d2")):
            record = Owner(node_id=owner, epoch=1, assigned_ms=0)
            await store.put(meta_keys.subscription_owner_key(topic, sub), encode_model(record))
        written = await store.ping()

        revision = await node.recheck_owners()

        assert revision >= written  # the watch goes on after what was read
        assert runtimes["mine"].failed == []
        assert runtimes["moved"].failed == ["another dispatcher owns it now"]
        assert runtimes["gone"].failed == [
            "its owner key was deleted (the topic or subscription went)"
        ]


async def test_an_owner_key_gone_with_a_lost_lease_is_left_to_the_reclaim(
    store: MetaStore,
) -> None:
    """Without its lease a dispatcher's owner keys expire with it: that delete does not fence
    what it serves (the reclaim decides, docs/dispatcher.md); another owner still does."""
    topic = TopicName.parse("/ns/t")
    async with store.lease(10) as lease:
        node = DispatcherNode(
            DanubeSettings(), node_id="d1", bus=cast(Bus, None), store=store, lease=lease
        )
        runtimes = {sub: _Runtime(lease.id) for sub in ("expired", "moved")}
        for sub, runtime in runtimes.items():
            served = _Served(cast(ServedSubscription, runtime), cast(Responder, None))
            node._served.add((topic, sub), served)
        record = Owner(node_id="d2", epoch=1, assigned_ms=0)
        await store.put(meta_keys.subscription_owner_key(topic, "moved"), encode_model(record))
        await lease.revoke()  # lost: every served runtime holds its cursors
        assert all(runtime.store.held for runtime in runtimes.values())

        await node.recheck_owners()

        assert runtimes["expired"].failed == []
        assert runtimes["moved"].failed == ["another dispatcher owns it now"]

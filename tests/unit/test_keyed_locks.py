"""Per-key locks exclude per key and are forgotten once unused: a node that served many
subscriptions over its life keeps no lock for any it no longer touches."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from danube.aio import KeyedLocks
from danube.config import DanubeSettings
from danube.dispatcher.node import DispatcherNode
from danube.meta import TopicName

pytestmark = pytest.mark.unit


async def test_one_holder_per_key_and_nothing_kept_after() -> None:
    locks: KeyedLocks[str] = KeyedLocks()
    inside: dict[str, int] = {}
    most: dict[str, int] = {}

    async def use(key: str) -> None:
        async with locks.hold(key):
            inside[key] = inside.get(key, 0) + 1
            most[key] = max(most.get(key, 0), inside[key])
            await asyncio.sleep(0)
            inside[key] -= 1

    await asyncio.gather(*(use(k) for k in ["a", "b", "a", "c", "a", "b"]))
    assert most == {"a": 1, "b": 1, "c": 1}
    assert len(locks) == 0


async def test_a_waiter_cancelled_leaves_no_entry_behind() -> None:
    locks: KeyedLocks[str] = KeyedLocks()
    held = asyncio.Event()
    release = asyncio.Event()

    async def holder() -> None:
        async with locks.hold("k"):
            held.set()
            await release.wait()

    async def waiter() -> None:
        async with locks.hold("k"):
            raise AssertionError("never gets the lock: cancelled first")

    first = asyncio.create_task(holder())
    await held.wait()
    second = asyncio.create_task(waiter())
    await asyncio.sleep(0)
    second.cancel()
    await asyncio.wait({second})
    assert len(locks) == 1  # still held by the first
    release.set()
    await first
    assert len(locks) == 0


class _Lease:
    alive = True

    def on_lost(self, callback: Any) -> None:
        return None


async def test_the_dispatcher_node_forgets_the_locks_of_subscriptions_it_let_go() -> None:
    node = DispatcherNode(
        DanubeSettings(),
        node_id="d1",
        bus=None,  # type: ignore[arg-type]
        store=None,  # type: ignore[arg-type]
        lease=_Lease(),  # type: ignore[arg-type]
    )
    for i in range(200):  # retiring a subscription that is not (or no longer) served here
        await node._retire((TopicName("ns", f"t{i}"), "sub"), runtime=None)  # type: ignore[arg-type]
    assert len(node._served.locks) == 0

"""The schema gate's binding cache on the produce path refreshes ahead: a topic in use has
its binding read again in the background before it expires, so no produce waits on etcd."""

from __future__ import annotations

import asyncio

import pytest

from danube.admission import refresh
from danube.admission.refresh import Refresher
from danube.admission.schema_gate import SchemaGate
from danube.meta import TopicName
from tests.fake_clock import Clock, settle

pytestmark = pytest.mark.unit

TOPIC = TopicName("default", "t")


class GatedRegistry:
    """A topic with no schema, told only once the test opens the gate."""

    def __init__(self) -> None:
        self.asked = 0
        self.gate = asyncio.Event()

    async def topic_schema(self, topic: TopicName) -> None:
        self.asked += 1
        await self.gate.wait()


async def test_a_binding_in_use_is_read_again_before_it_expires() -> None:
    registry, clock, refresher = GatedRegistry(), Clock(), Refresher()
    gate = SchemaGate(registry, cache_ttl_s=2.0, refresher=refresher, clock=clock)  # type: ignore[arg-type]
    registry.gate.set()
    assert await gate.admit(TOPIC, [b"x"]) is None
    registry.gate.clear()

    clock.now_s = 1.5  # past half its TTL: answered from the cache, refreshed behind
    hit = asyncio.ensure_future(gate.admit(TOPIC, [b"x"]))
    await asyncio.sleep(0)
    assert hit.done()
    await settle()
    assert (registry.asked, refresher.running) == (2, 1)
    registry.gate.set()
    await settle()
    assert refresher.running == 0

    registry.gate.clear()
    clock.now_s = 2.5  # past the first read's expiry: the refreshed entry answers
    late = asyncio.ensure_future(gate.admit(TOPIC, [b"x"]))
    await asyncio.sleep(0)
    assert late.done()
    assert registry.asked == 2  # before: this produce read etcd inline (and waited here)
    await refresher.close()


async def test_an_expired_binding_answers_stale_when_etcd_stalls(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """etcd frozen: a produce whose binding expired is admitted by the binding known a moment
    ago after STALE_WAIT_S (before: it waited etcd's deadline, then failed the produce)."""
    monkeypatch.setattr(refresh, "STALE_WAIT_S", 0.05)
    registry, clock = GatedRegistry(), Clock()
    gate = SchemaGate(registry, cache_ttl_s=2.0, clock=clock)  # type: ignore[arg-type]
    registry.gate.set()
    assert await gate.admit(TOPIC, [b"x"]) is None
    registry.gate.clear()
    clock.now_s = 5.0
    async with asyncio.timeout(1.0):
        assert await gate.admit(TOPIC, [b"x"]) is None
    assert registry.asked == 2

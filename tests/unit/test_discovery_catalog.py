"""The produce path's topic cache: fresh entries, a stale one while etcd fails, and
refresh-ahead (an entry in use is read again in the background before it expires, so no
produce waits on etcd for it; one not in use still expires)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from danube.admission import refresh
from danube.admission.refresh import Refresher
from danube.discovery.catalog.catalog import Catalog
from danube.meta import TopicName
from danube.meta.errors import MetaUnavailableError
from danube.meta.records import NamespacePolicy, TopicConfig
from tests.fake_clock import Clock, settle

pytestmark = pytest.mark.unit

TOPIC = TopicName("default", "t")


class FlakyStore:
    """Answers ``get_model`` with a config until told etcd is gone."""

    def __init__(self) -> None:
        self.down = False
        self.reads = 0

    async def get_model(self, key: str, model: type[Any]) -> Any:
        self.reads += 1
        if self.down:
            raise MetaUnavailableError("etcd does not answer")
        return TopicConfig(partitions=2, created_ms=1)


async def test_a_stale_config_routes_produces_while_etcd_fails() -> None:
    store = FlakyStore()
    catalog = Catalog(store, cache_ttl_s=0.0)  # type: ignore[arg-type]  # every read misses
    assert (await catalog.cached_topic(TOPIC)) == TopicConfig(partitions=2, created_ms=1)
    store.down = True
    stale = await catalog.cached_topic(TOPIC)
    assert stale == TopicConfig(partitions=2, created_ms=1)
    assert store.reads == 2  # it did ask etcd first
    with pytest.raises(MetaUnavailableError):  # never seen: nothing to fall back on
        await catalog.cached_topic(TopicName("default", "other"))


class GatedStore:
    """Answers ``get_model`` only once the test opens the gate; counts the asks."""

    def __init__(self) -> None:
        self.partitions = 2
        self.asked = 0
        self.gate = asyncio.Event()

    async def get_model(self, key: str, model: type[Any]) -> Any:
        self.asked += 1
        await self.gate.wait()
        if model is NamespacePolicy:
            return NamespacePolicy(created_ms=1)
        return TopicConfig(partitions=self.partitions, created_ms=1)


def _answered(task: asyncio.Task[Any]) -> bool:
    """Whether a cache read finished without waiting on the store (its first step)."""
    return task.done()


async def test_an_entry_in_use_is_read_again_in_the_background_before_it_expires() -> None:
    store, clock, refresher = GatedStore(), Clock(), Refresher()
    catalog = Catalog(store, cache_ttl_s=2.0, refresher=refresher, clock=clock)  # type: ignore[arg-type]
    store.gate.set()
    assert (await catalog.cached_topic(TOPIC)) == TopicConfig(partitions=2, created_ms=1)
    store.gate.clear()  # from here on, a read of etcd waits until the test opens the gate
    store.partitions = 3

    clock.now_s = 1.5  # past half its TTL: served from the cache, a refresh starts
    hit = asyncio.ensure_future(catalog.cached_topic(TOPIC))
    await asyncio.sleep(0)
    assert _answered(hit)
    assert hit.result() == TopicConfig(partitions=2, created_ms=1)
    await settle()
    assert (store.asked, refresher.running) == (2, 1)  # its read waits at the gate
    again = asyncio.ensure_future(catalog.cached_topic(TOPIC))  # one refresh per key
    await asyncio.sleep(0)
    assert _answered(again)
    await settle()
    assert (store.asked, refresher.running) == (2, 1)
    store.gate.set()
    await settle()
    assert refresher.running == 0

    # Past the first read's expiry (2.0) the refreshed entry answers, with no read inline
    # (before: this produce waited on etcd).
    store.gate.clear()
    clock.now_s = 2.5
    late = asyncio.ensure_future(catalog.cached_topic(TOPIC))
    await asyncio.sleep(0)
    assert _answered(late)
    assert late.result() == TopicConfig(partitions=3, created_ms=1)
    await refresher.close()
    late.cancel()


async def test_an_entry_nobody_asks_for_still_expires_and_is_read_inline() -> None:
    store, clock, refresher = GatedStore(), Clock(), Refresher()
    catalog = Catalog(store, cache_ttl_s=2.0, refresher=refresher, clock=clock)  # type: ignore[arg-type]
    store.gate.set()
    await catalog.cached_topic(TOPIC)
    await catalog.cached_namespace("default")
    store.gate.clear()
    store.partitions = 3
    clock.now_s = 2.0  # expired, never asked for in its second half: nothing refreshed it
    read = asyncio.ensure_future(catalog.cached_topic(TOPIC))
    await settle()
    assert not read.done()
    assert refresher.running == 0
    store.gate.set()
    assert (await read) == TopicConfig(partitions=3, created_ms=1)
    assert store.asked == 3
    await refresher.close()


async def test_a_refresh_does_not_replace_an_entry_written_meanwhile() -> None:
    store, clock, refresher = GatedStore(), Clock(), Refresher()
    catalog = Catalog(store, cache_ttl_s=2.0, refresher=refresher, clock=clock)  # type: ignore[arg-type]
    store.gate.set()
    await catalog.cached_topic(TOPIC)
    store.gate.clear()
    clock.now_s = 1.5
    await catalog.cached_topic(TOPIC)  # starts a refresh, which reads 2 partitions
    await settle()
    assert refresher.running == 1
    catalog._remember(TOPIC, TopicConfig(partitions=5, created_ms=1))  # an update here
    store.gate.set()
    await settle()
    assert (await catalog.cached_topic(TOPIC)) == TopicConfig(partitions=5, created_ms=1)
    await refresher.close()


async def test_refreshes_are_bounded_and_end_at_close() -> None:
    refresher = Refresher(max_running=2)
    gate = asyncio.Event()

    async def wait() -> None:
        await gate.wait()

    started = [refresher.start(key, wait) for key in ("a", "a", "b", "c")]
    assert started == [True, False, True, False]  # one per key, at most two at once
    await refresher.close()
    assert refresher.running == 0
    assert not refresher.start("d", wait)  # closed: takes no more


async def test_an_expired_entry_answers_stale_when_etcd_stalls_past_the_stale_wait(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """etcd frozen: a produce whose entries expired waits STALE_WAIT_S per cache, not etcd's
    request deadline per cache (3 of them made a produce wait 15 s in an etcd stall test)."""
    monkeypatch.setattr(refresh, "STALE_WAIT_S", 0.05)
    store, clock = GatedStore(), Clock()
    catalog = Catalog(store, cache_ttl_s=2.0, clock=clock)  # type: ignore[arg-type]
    store.gate.set()
    known = await catalog.cached_topic(TOPIC)
    policy = await catalog.cached_namespace("default")
    store.gate.clear()  # etcd stops answering
    clock.now_s = 5.0
    async with asyncio.timeout(1.0):  # before: it waited for the store for ever
        assert await catalog.cached_topic(TOPIC) == known
        assert await catalog.cached_namespace("default") == policy
    store.gate.set()  # etcd back: the next ask reads it
    store.partitions = 4
    assert await catalog.cached_topic(TOPIC) == TopicConfig(partitions=4, created_ms=1)


async def test_with_nothing_cached_an_etcd_stall_is_waited_out() -> None:
    store, clock = GatedStore(), Clock()
    catalog = Catalog(store, cache_ttl_s=2.0, clock=clock)  # type: ignore[arg-type]
    read = asyncio.ensure_future(catalog.cached_topic(TOPIC))
    await asyncio.sleep(0.1)
    assert not read.done()  # no stale entry to answer: the read decides
    store.gate.set()
    assert (await read) == TopicConfig(partitions=2, created_ms=1)


async def test_an_entry_whose_refresh_is_stuck_answers_stale_at_once_and_refreshes_later(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """etcd frozen while a topic is in use: its refresh-ahead has not answered by the time
    the entry expires, so the produce takes the entry as it was, without the stale wait (a
    produce with three caches expired waited 3-4 s in an etcd stall); once etcd answers,
    the refresh replaces the entry."""
    monkeypatch.setattr(refresh, "STALE_WAIT_S", 10.0)  # would show if it were waited
    store, clock, refresher = GatedStore(), Clock(), Refresher()
    catalog = Catalog(store, cache_ttl_s=2.0, refresher=refresher, clock=clock)  # type: ignore[arg-type]
    store.gate.set()
    known = await catalog.cached_topic(TOPIC)
    store.gate.clear()  # etcd stops answering
    clock.now_s = 1.5  # in use past half its TTL: a refresh starts, and hangs
    assert await catalog.cached_topic(TOPIC) == known
    await settle()
    assert refresher.running == 1
    clock.now_s = 2.5  # expired, its refresh stuck: stale at once
    late = asyncio.ensure_future(catalog.cached_topic(TOPIC))
    await asyncio.sleep(0)
    assert _answered(late)
    assert late.result() == known
    store.partitions = 5
    store.gate.set()  # etcd back: the refresh in flight replaces the entry
    await settle()
    assert refresher.running == 0
    assert await catalog.cached_topic(TOPIC) == TopicConfig(partitions=5, created_ms=1)
    await refresher.close()

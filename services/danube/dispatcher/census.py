"""The counts balancing needs, read from etcd (danube.dispatcher.balance decides on them):
live dispatchers (``nodes/dispatcher/``), drained ones (``drains/dispatcher/``) and the owner
of every owned subscription (``subscriptions/<ns>/<t>/<sub>/owner``)."""

from __future__ import annotations

import asyncio
import math
import time
from collections import Counter
from typing import Any

from danube.aio import awaited_task
from danube.dispatcher.balance import Balancer, Census
from danube.meta import MetaStore
from danube.meta import keys as meta_keys
from danube.meta.records import Owner
from danube.meta.topics import live_nodes


async def read_census(store: MetaStore) -> Census:
    """One count. The subscriptions prefix holds configs and cursors too; only owner keys
    count (a range of it all is what etcd offers without a secondary index)."""
    live = await live_nodes(store, "dispatcher")
    prefix = meta_keys.drains_prefix("dispatcher")
    drained = frozenset(kv.key[len(prefix) :] for kv in await store.range(prefix))
    owned: Counter[str] = Counter()
    for kv in await store.range(meta_keys.SUBSCRIPTIONS_PREFIX):
        if kv.key.endswith("/owner") and meta_keys.parse_subscription_key(kv.key)[2] == "owner":
            owned[Owner.model_validate_json(kv.value).node_id] += 1
    return Census(live=frozenset(live), drained=drained, owned=dict(owned))


class CensusCounts:
    """Counts of the cluster fed to a dispatcher's balancer: one read at a time, shared by
    whoever asks while it runs (the balancing round, and claims refused on an old count,
    which would each read every owner key)."""

    def __init__(self, store: MetaStore, balancer: Balancer[Any], *, timeout_s: float) -> None:
        self._store = store
        self._balancer = balancer
        self._timeout_s = timeout_s
        self._reading: asyncio.Task[Census] | None = None
        self._at = -math.inf  # monotonic, of the last count

    def age_s(self) -> float:
        """How long ago the balancer last observed a count (infinite before the first)."""
        return time.monotonic() - self._at

    def count(self) -> asyncio.Future[Census]:
        """The count under way, or a new one; the balancer observes it when it is read."""
        if self._reading is None or self._reading.done():
            self._reading = awaited_task(self._read(), name="dispatcher census")
        return self._reading

    async def _read(self) -> Census:
        async with asyncio.timeout(self._timeout_s):
            census = await read_census(self._store)
        self._at = time.monotonic()
        self._balancer.observe(census, self._at)
        return census

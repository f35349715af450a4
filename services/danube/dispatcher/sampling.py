"""The per-subscription gauges (backlog, unacked, consumers, delayed), sampled: every
``metrics.sample_interval_s`` each served subscription's stats (the same numbers the admin
API shows: danube.dispatcher.stats) are taken and published under capped labels
(danube.runtime.topic_metrics). Computed here rather than at scrape time because a backlog
needs the partitions' ends from ingest, a bus request the scrape thread cannot make."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable

from danube.dispatcher import metrics
from danube.dispatcher.served import ServedSubscription
from danube.errors import DanubeError
from danube.runtime.topic_metrics import GaugeSnapshot, subscription_labels
from danube.wire.dispatcher.protocol import SubscriptionStats
from danube.wire.limits import total

log = logging.getLogger(__name__)

# One subscription's stats wait at most this (they ask each partition's ingest owner, each
# bounded by WAL_STATS_TIMEOUT_S); a slow one keeps its previous values out of this sample.
STATS_TIMEOUT_S = 3.0

_Row = tuple[tuple[str, ...], float]


class SubscriptionSampler:
    """Publishes the gauges of the subscriptions ``served()`` returns."""

    def __init__(self, served: Callable[[], Iterable[ServedSubscription]]) -> None:
        self._served = served
        self._backlog = GaugeSnapshot(metrics.SUB_BACKLOG)
        self._unacked = GaugeSnapshot(metrics.SUB_UNACKED)
        self._consumers = GaugeSnapshot(metrics.SUB_CONSUMERS)
        self._delayed = GaugeSnapshot(metrics.SUB_DELAYED)

    async def run(self, interval_s: float) -> None:
        """Sample every ``interval_s`` until cancelled."""
        while True:
            await self.sample()
            await asyncio.sleep(interval_s)

    async def sample(self) -> None:
        """One sample of every served subscription."""
        backlog: list[_Row] = []
        unacked: list[_Row] = []
        consumers: list[_Row] = []
        delayed: list[_Row] = []
        for runtime in list(self._served()):
            if runtime.failed or runtime.deleted:
                continue
            stats = await _stats(runtime)
            if stats is None:
                continue
            labels = subscription_labels(runtime.store.topic, runtime.store.sub)
            backlog.append((labels, total(p.backlog for p in stats.partitions)))
            unacked.append((labels, sum(c.unacked for c in stats.consumers)))
            consumers.append((labels, len(stats.consumers)))
            delayed.append((labels, stats.delayed))
        self._backlog.publish(backlog)
        self._unacked.publish(unacked)
        self._consumers.publish(consumers)
        self._delayed.publish(delayed)


async def _stats(runtime: ServedSubscription) -> SubscriptionStats | None:
    try:
        async with asyncio.timeout(STATS_TIMEOUT_S):
            return await runtime.stats()
    except (DanubeError, TimeoutError) as exc:
        # Never attached yet (no machine), being deleted, or slow: nothing to show now.
        log.debug("no stats of %s/%s: %s", runtime.store.topic, runtime.store.sub, exc)
        return None

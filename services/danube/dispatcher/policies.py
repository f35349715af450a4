"""A topic's policies where a dispatcher holds them (docs/policies.md): the number of
subscriptions of a topic and of consumers of a subscription, and the backlog quota of
policy ``evict_oldest`` (a subscription's cursor moved forward so that it keeps at most
the quota unacknowledged).

The quota ``refuse`` is held at the partition's ingest leader instead (the produce is
refused there); eviction is here because the live cursor is here.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Awaitable, Callable, Mapping

from danube.dispatcher import metrics
from danube.dispatcher.delivery import SubscriptionMachine
from danube.dispatcher.events import Seek
from danube.dispatcher.expiring import expiry_for
from danube.dispatcher.store import SubscriptionStore
from danube.meta import MetaError, TopicName
from danube.meta.records import Policies
from danube.meta.topics import read_policies
from danube.wire.dispatcher.errors import PolicyLimitError
from danube.wire.ingest.client import IngestClient
from danube.wire.limits import backlog

log = logging.getLogger(__name__)

# How often a subscription looks at its backlog against an evict_oldest quota (Pulsar's
# backlogQuotaCheckInterval is a minute; a second keeps the backlog close to the quota),
# and how often it reads its topic's policies while they set no such quota (a quota set
# later applies within that long; an etcd read a second for every subscription is not free).
EVICT_CHECK_S = 1.0
EVICT_POLICY_CHECK_S = 10.0
_WAL_TIMEOUT_S = 2.0


async def policies_of(store: SubscriptionStore) -> Policies:
    """The policies in effect for the subscription's topic."""
    return await read_policies(store.store, store.topic)


def check_consumers(policies: Policies, attached: int, where: str) -> None:
    """PolicyLimitError ``too_many_consumers`` when ``attached`` is at the limit."""
    limit = policies.max_consumers_per_subscription
    if limit is not None and attached >= limit:
        metrics.POLICY_REFUSALS.labels("too_many_consumers").inc()
        raise PolicyLimitError(
            f"{where} has {attached} consumers, its max_consumers_per_subscription is {limit}",
            code="too_many_consumers",
        )


class BacklogEviction:
    """Eviction (``evict_oldest``) for one served subscription, whose runtime owns it and runs
    :meth:`run` as one of its tasks. Built with what it needs: the topic's policies, the end
    of a partition's WAL, the partitions read (the runtime's own map: it grows with the
    topic), the machine, and how a move reaches it."""

    def __init__(
        self,
        where: str,
        partitions: Mapping[str, TopicName],
        *,
        read_policies: Callable[[], Awaitable[Policies]],
        ingest: IngestClient,
        machine: Callable[[], SubscriptionMachine],
        move: Callable[[Seek], Awaitable[object]],
    ) -> None:
        self._where = where  # topic/sub, for the logs
        self._partitions = partitions
        self._read_policies = read_policies
        self._ingest = ingest
        self._machine = machine
        self._move = move

    async def run(self) -> None:
        """Every ``EVICT_CHECK_S``, move each partition's cursor forward to keep at most the
        quota unacknowledged, while the topic's backlog quota policy is ``evict_oldest``
        (read every ``EVICT_POLICY_CHECK_S`` while it is not)."""
        wait_s = EVICT_CHECK_S
        while True:
            await asyncio.sleep(wait_s * random.uniform(0.9, 1.1))
            try:
                policies = await self._read_policies()
            except MetaError as exc:
                log.debug("backlog quota: cannot read policies: %s", exc)
                continue
            self._machine().expiry_of = expiry_for(policies.message_ttl_s)  # a change holds
            quota = policies.backlog_quota_messages
            if quota is None or policies.backlog_quota_policy != "evict_oldest":
                wait_s = EVICT_POLICY_CHECK_S
                continue
            wait_s = EVICT_CHECK_S
            for name, partition in self._partitions.items():
                await self._evict(name, partition, quota)

    async def _evict(self, name: str, partition: TopicName, quota: int) -> None:
        try:
            wal = await self._ingest.wal_offsets(partition, timeout_s=_WAL_TIMEOUT_S)
        except Exception as exc:  # no leader right now: looked at again next time
            log.debug("backlog quota: no end of %s: %s", partition, exc)
            return
        end = wal.durable_next
        cursor = self._machine().cursor(name)
        behind = backlog(cursor.next_offset, cursor.acked_beyond, end) or 0
        if behind <= quota:
            return
        before = cursor.next_offset
        target = end - quota
        await self._move(Seek({name: target}, time.monotonic()))
        metrics.BACKLOG_EVICTED.inc(target - before)
        log.warning(
            "%s: backlog of %d over the quota of %d in %s: evicted offsets %d..%d",
            self._where,
            behind,
            quota,
            partition,
            before,
            target - 1,
        )

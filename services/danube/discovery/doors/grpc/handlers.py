"""Discovery's gRPC door (DESIGN §10): Danube's client API (danube.grpc_door.api) over the
instance's services (danube.discovery.core.Services): any topic, stored through the produce
path over the bus (danube.discovery.produce.producer), a topic a producer or consumer names
created or grown to have it.

``TopicLookup`` answers ``Redirect`` to the leader's gRPC door when the topic (or the
partition) exists, has a leader and that leader serves one (``discovery.grpc_redirect``);
else ``Connect`` with ``proxy``, this instance: any instance serves any topic (a topic that
does not exist yet is created by its first producer here). A partitioned topic's own name
is answered ``Connect``: the client asks its partitions, then looks each one up. While etcd
does not answer, the last leader read is named (danube.admission.last_good), else ``Connect``.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

from danube.admission import Admitted
from danube.admission.last_good import LastGood
from danube.admission.sessions import ProducerSessions
from danube.discovery import metrics
from danube.discovery.core import Services
from danube.grpc_door.api import DanubeApi, Lookup
from danube.grpc_door.clients import Clients
from danube.grpc_door.leaders import LeaderDoors
from danube.meta import MetaTimeoutError, MetaUnavailableError, TopicName
from danube.meta.records import Dispatch, TopicConfig

log = logging.getLogger(__name__)


class DiscoveryApi(DanubeApi):
    """Danube's client API on a discovery instance."""

    def __init__(
        self,
        services: Services,
        sessions: ProducerSessions,
        clients: Clients,
        *,
        advertised_url: str,
        leaders: LeaderDoors | None = None,
    ) -> None:
        super().__init__(
            admission=services.admission,
            security=services.security,
            sessions=sessions,
            clients=clients,
            dispatcher=services.dispatcher,
            streams=services.streams,
            advertised_url=advertised_url,
        )
        self.services = services
        self.leaders = leaders  # None: never redirect (discovery.grpc_redirect off)

    async def lookup(self, topic: TopicName) -> Lookup:
        leaders = self.leaders
        if leaders is not None:
            config = await self.cached_topic(topic.parent)
            exists = config is not None and (
                config.partitions == 0
                if topic.partition is None
                else topic.partition < config.partitions
            )
            if exists:
                door = await leader_door(self.services.lookups, topic, leaders.door_of)
                if door is not None:
                    return Lookup.redirect(door)
        # Any instance serves any topic: answer with ourselves, in proxy mode.
        return Lookup.connect(self.advertised_url)

    async def cached_topic(self, topic: TopicName) -> TopicConfig | None:
        return await self.services.catalog.cached_topic(topic)

    async def ensure_topic(self, topic: TopicName, dispatch: Dispatch) -> None:
        await self._ensure_topic(topic, dispatch)

    async def _ensure_topic(self, topic: TopicName, dispatch: Dispatch) -> None:
        """Make ``topic`` exist (auto-creation allowed): a plain topic as asked, a partition
        by creating or growing its topic to have it (Catalog.ensure_topic)."""
        producer = self.services.producer
        config, created = await self.services.catalog.ensure_topic(
            topic, auto_create=producer.limits.auto_create, dispatch=dispatch
        )
        if created:  # placed now: the producer's first message does not claim them
            await producer.place(topic.parent, config.partitions)

    async def store(self, admitted: Admitted, record: bytes, key: str | None) -> None:
        await self.services.producer.store(admitted, [record], [key], dispatch="reliable")


async def leader_door(
    lookups: LastGood[tuple[str, ...], Any],
    topic: TopicName,
    door_of: Callable[[TopicName], Awaitable[str | None]],
) -> str | None:
    """The gRPC door of ``topic``'s leader (``door_of``: read in etcd, LeaderDoors.door_of).
    While etcd does not answer: the last one read (at most ten minutes old), else None (this
    instance serves the topic over the bus meanwhile, as for a client that reaches only
    discovery)."""
    try:
        url, age_s = await lookups.read(("grpc", str(topic)), lambda: door_of(topic))
    except (MetaTimeoutError, MetaUnavailableError) as exc:
        log.info("lookup of %s: etcd does not answer (%s): served here", topic, exc)
        return None
    if age_s is not None:
        metrics.LOOKUPS_FROM_LAST_GOOD.labels("grpc").inc()
        log.info("lookup of %s answered from %.1f s ago: etcd does not answer", topic, age_s)
    assert url is None or isinstance(url, str)
    return url

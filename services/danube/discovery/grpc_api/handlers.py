"""Discovery's gRPC door (DESIGN §10): Danube's client API (danube.grpc_door.api) over the
instance's services (danube.discovery.core.Services): any topic, stored through the produce
path over the bus (danube.discovery.produce), a topic a producer or consumer names created or
grown to have it.

``TopicLookup`` answers ``Redirect`` to the leader's gRPC door when the topic (or the
partition) exists, has a leader and that leader serves one (``discovery.grpc_redirect``);
else ``Connect`` with ``proxy``, this instance: any instance serves any topic (a topic that
does not exist yet is created by its first producer here). A partitioned topic's own name
is answered ``Connect``: the client asks its partitions, then looks each one up.
"""

from __future__ import annotations

import logging

from danube.admission import Admitted
from danube.admission.sessions import ProducerSessions
from danube.discovery.core import Services
from danube.discovery.errors import ConflictError, NotFoundError
from danube.discovery.models import TopicSpec
from danube.grpc_door.api import DanubeApi, Lookup
from danube.grpc_door.clients import Clients
from danube.grpc_door.leaders import LeaderDoors
from danube.meta import TopicName
from danube.meta.records import Dispatch, TopicConfig
from danube.wire import codes

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
        if self.leaders is not None:
            config = await self.cached_topic(topic.parent)
            exists = config is not None and (
                config.partitions == 0
                if topic.partition is None
                else topic.partition < config.partitions
            )
            url = await self.leaders.door_of(topic) if exists else None
            if url is not None:
                return Lookup.redirect(url)
        # Any instance serves any topic: answer with ourselves, in proxy mode.
        return Lookup.connect(self.advertised_url)

    async def cached_topic(self, topic: TopicName) -> TopicConfig | None:
        return await self.services.catalog.cached_topic(topic)

    async def ensure_topic(self, topic: TopicName, dispatch: Dispatch) -> None:
        await self._ensure_topic(topic, dispatch)

    async def _ensure_topic(self, topic: TopicName, dispatch: Dispatch) -> None:
        """Make ``topic`` exist (auto-creation allowed): a plain topic as asked, a partition
        by creating or growing its topic to have it."""
        catalog = self.services.catalog
        base = topic.parent
        config = await catalog.cached_topic(base)
        if config is None:
            if not self.services.producer.limits.auto_create:
                raise NotFoundError(
                    f"topic {base} does not exist and auto-creation is off",
                    code=codes.TOPIC_NOT_FOUND,
                )
            count = 0 if topic.partition is None else topic.partition + 1
            try:
                config, created = await catalog.create_topic(
                    base, TopicSpec(partitions=count, dispatch=dispatch)
                )
                if created:  # placed now: the producer's first message does not claim them
                    await self.services.producer.place(base, config.partitions)
            except ConflictError as exc:  # created meanwhile, with another partition count
                if exc.code != "topic_exists":
                    raise
                config = await catalog.get_topic(base)
        if topic.partition is not None and config.partitions <= topic.partition:
            if not self.services.producer.limits.auto_create:
                raise NotFoundError(f"topic {topic} does not exist", code=codes.TOPIC_NOT_FOUND)
            await catalog.grow_partitions(base, topic.partition + 1)

    async def store(self, admitted: Admitted, record: bytes, key: str | None) -> None:
        await self.services.producer.store(admitted, [record], [key], dispatch="reliable")

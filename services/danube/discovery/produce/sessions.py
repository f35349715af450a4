"""Discovery's producer sessions (docs/producers.md): danube.admission.sessions' sessions,
whose open first makes the topic exist (auto-creation, as discovery's doors do)."""

from __future__ import annotations

from danube.admission.sessions import ProducerSession, ProducerSessions, refusal
from danube.discovery import metrics
from danube.discovery.catalog.catalog import Catalog
from danube.discovery.errors import NotFoundError
from danube.meta import MetaStore, TopicName
from danube.wire import codes

__all__ = ["DiscoverySessions", "ProducerSession", "refusal"]


class DiscoverySessions(ProducerSessions):
    """Producer sessions over discovery's catalog: opening one on a topic that does not
    exist creates it when auto-creation is on."""

    def __init__(
        self, store: MetaStore, catalog: Catalog, *, ttl_s: int, auto_create: bool = True
    ) -> None:
        super().__init__(store, catalog, ttl_s=ttl_s, refusals=metrics.POLICY_REFUSALS)
        self.catalog = catalog
        self.auto_create = auto_create

    async def _ensure_topic(self, topic: TopicName) -> None:
        # A partition (``<t>-part-N``, as Danube's clients name them) exists when its topic
        # has it (the gRPC front door creates or grows the topic before opening a session).
        if topic.partition is not None:
            config = await self.catalog.cached_topic(topic.parent)
            if config is None or topic.partition >= config.partitions:
                raise NotFoundError(f"topic {topic} does not exist", code=codes.TOPIC_NOT_FOUND)
            return
        await self.catalog.ensure_topic(topic, auto_create=self.auto_create)

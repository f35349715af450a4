"""The gRPC door of an ingest node (DESIGN §10, docs/grpc-api.md "Ingest doors"): Danube's
client API (danube.grpc_door) for the partitions this node leads, so the official clients,
redirected here by ``TopicLookup``, produce with no hop through discovery or the bus.

- **ProducerService**: CreateProducer opens a producer session (danube.admission.sessions,
  the same sessions and access modes as discovery's); SendMessage is admitted
  (danube.admission, as the data door) and appended by the partition's handlers
  (danube.ingest.handlers, the data door's append). A partition not led here is refused
  ``UNAVAILABLE`` ``not_leader`` (naming the leader's gRPC door when etcd knows it): the
  client looks it up again, here, and is redirected.
- **Discovery**: TopicLookup answers ``Redirect`` to the leader's gRPC door (this node
  included), else ``Connect`` (proxy) to a discovery instance's, else ``UNAVAILABLE``
  ``no_owner``; TopicPartitions from the topic configs admission caches.
- **ConsumerService**: forwarded to the dispatchers over the bus, as discovery's door does
  (a consumer does not follow the leader: any node's door serves any existing topic).
- **HealthCheck** as discovery's. The schema registry is not served here (discovery's).

Authentication and authorization: the security gate of the node's admission, as the data
door (tokens, and client certificates under ``ingest.tls``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from functools import partial
from typing import Any

from danube.admission import Admitted
from danube.admission.sessions import ProducerSessions
from danube.config import DanubeSettings
from danube.errors import NotFoundError, NotLeaderError, UnavailableError
from danube.frame.batch import FrameBatch
from danube.grpc_door import server as door
from danube.grpc_door.api import DanubeApi, Lookup
from danube.grpc_door.auth import guard
from danube.grpc_door.clients import Clients
from danube.grpc_door.leaders import LeaderDoors
from danube.ingest import metrics
from danube.ingest.door import ADMISSION_COUNTERS, DoorAdmission, Leaders
from danube.ingest.handlers import PartitionHandlers
from danube.meta import TopicName
from danube.meta.records import Dispatch, TopicConfig
from danube.runtime.held import Slots
from danube.runtime.http import advertised_url
from danube.runtime.liveness import subscription_owner_gone
from danube.runtime.service import NodeSession
from danube.tasks import TaskSet
from danube.wire import codes
from danube.wire.dispatcher.client import DispatcherClient
from danube.wire.limits import for_partition

log = logging.getLogger(__name__)

STOP_GRACE_S = 5.0


class IngestApi(DanubeApi):
    """Danube's client API on an ingest node: produce where it leads."""

    def __init__(self, leaders: Leaders, doors: LeaderDoors, **collaborators: Any) -> None:
        super().__init__(**collaborators)
        self.leaders = leaders
        self.doors = doors

    async def lookup(self, topic: TopicName) -> Lookup:
        if self.leaders.leader_of(topic) is not None:
            return Lookup.redirect(self.advertised_url)
        config = await self.cached_topic(topic.parent)
        partitioned_base = topic.partition is None and config is not None and config.partitions
        url = None if config is None or partitioned_base else await self.doors.door_of(topic)
        if url is not None:
            return Lookup.redirect(url)
        # No leader to send it to (a new topic, a base name, a leader not elected yet):
        # discovery serves any topic, and creates a new one.
        discovery = await self.doors.discovery_door()
        if discovery is not None:
            return Lookup.connect(discovery)
        raise UnavailableError(f"{topic} has no leader now; look it up again", code="no_owner")

    async def cached_topic(self, topic: TopicName) -> TopicConfig | None:
        config, _ = await self.admission.policies.effective_policies(topic)
        return config

    async def ensure_topic(self, topic: TopicName, dispatch: Dispatch) -> None:
        await self._leading(topic)

    async def ensure_consumed(self, topic: TopicName) -> None:
        if not await self.topic_exists(topic):
            raise NotFoundError(f"topic {topic} does not exist", code=codes.TOPIC_NOT_FOUND)

    async def serving(self, topic: TopicName) -> None:
        await self._leading(topic)

    async def store(self, admitted: Admitted, record: bytes, key: str | None) -> None:
        handlers = await self._leading(admitted.topic)
        config = admitted.config
        if config is None:
            raise NotFoundError(
                f"topic {admitted.topic} does not exist", code=codes.TOPIC_NOT_FOUND
            )
        limits = for_partition(admitted.policies, config.partitions)
        await handlers.append(FrameBatch.of_records([record]), None, limits)
        metrics.GRPC_MESSAGES.inc()

    async def _leading(self, topic: TopicName) -> PartitionHandlers:
        """The handlers of ``topic`` while this node leads it; else ``not_leader`` naming
        its leader's gRPC door (UNAVAILABLE: Danube's clients look the topic up again)."""
        handlers = self.leaders.leader_of(topic)
        if handlers is not None:
            return handlers
        url = await self.doors.door_of(topic)
        where = f"; its leader's door is {url}" if url is not None else "; look it up again"
        raise NotLeaderError(f"this node does not lead {topic}{where}", leader_url=url)


class GrpcDoor:
    """A gRPC door serving: its listener and the task that forgets idle clients."""

    def __init__(self, server: Any, api: IngestApi, url: str) -> None:
        self.server = server
        self.api = api
        self.url = url
        self._tasks = TaskSet("grpc door")
        self._tasks.spawn(api.forget_idle(), name="grpc-clients")

    async def close(self) -> None:
        """No new calls; calls in flight get a few seconds to finish."""
        await self._tasks.close(timeout_s=STOP_GRACE_S)
        with contextlib.suppress(asyncio.CancelledError):
            await self.server.stop(STOP_GRACE_S)


async def open_grpc_door(
    settings: DanubeSettings,
    leaders: Leaders,
    session: NodeSession,
    admission: DoorAdmission,
) -> GrpcDoor:
    """Listen on ``ingest.grpc_port`` with the section's TLS and the door's limits
    (``admission`` opened first); advertise its URL in the node's registration
    (``NodeRecord.grpc_url``: discovery's lookups redirect there)."""
    ingest = settings.ingest
    server, port = door.listen(
        ingest.host,
        ingest.grpc_port,
        ingest.tls,
        max_message_bytes=ingest.grpc_max_message_bytes,
        max_concurrent_rpcs=ingest.grpc_max_concurrent_rpcs,
    )
    url = ingest.grpc_advertised_url or advertised_url(ingest, port)
    parts = admission.parts
    clients = Clients(limit=ingest.grpc_max_clients, idle_s=ingest.grpc_client_idle_s)
    sessions = ProducerSessions(
        session.store,
        parts.policies,
        ttl_s=settings.discovery.producer_session_ttl_s,
        refusals=ADMISSION_COUNTERS.policy_refusals,
        holders=parts.holders,  # the views admission follows: an open is seen at once
    )
    api = IngestApi(
        leaders,
        LeaderDoors(session.store),
        admission=parts.admission,
        security=parts.security,
        sessions=sessions,
        clients=clients,
        dispatcher=DispatcherClient(
            session.bus,
            timeout_s=ingest.data_timeout_s,
            owner_gone=partial(subscription_owner_gone, session.store),
        ),
        streams=Slots(ingest.grpc_max_streams),
        advertised_url=url,
    )
    check = partial(guard, parts.security, clients)
    handlers = door.method_handlers(api, ingest.data_timeout_s, check)
    per_client = min(ingest.grpc_max_concurrent_rpcs_per_client, ingest.grpc_max_concurrent_rpcs)
    await door.serve(server, handlers, calls_per_client=per_client)
    await session.advertise(grpc_url=url)
    log.info("ingest %s: gRPC door at %s", session.node_id, url)
    return GrpcDoor(server, api, url)

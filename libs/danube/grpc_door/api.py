"""The handlers of Danube's client API (DESIGN §10, docs/grpc-api.md) that every gRPC door
shares: discovery's (any topic, over the bus) and an ingest leader's (the partitions it
leads, appended in place). What differs is a small backend, the abstract methods of
:class:`DanubeApi` a door's subclass fills in:

- :meth:`~DanubeApi.lookup`: what ``TopicLookup`` answers (discovery: itself in proxy mode,
  or the leader's door; an ingest door: the leader's door);
- :meth:`~DanubeApi.cached_topic`: a topic's config (``TopicPartitions``, health checks);
- :meth:`~DanubeApi.ensure_topic`: make a producer's or consumer's topic exist (discovery
  creates or grows it), or refuse it here (an ingest door that does not lead it);
- :meth:`~DanubeApi.store`: append one admitted record.

Everything else — request checks (requests.py), producer sessions and access modes
(danube.admission.sessions), admission (danube.admission), the client tables (clients.py),
the consumer streams over the dispatchers (consumers.py) — is the same code on every door.

Topic names are Danube's: ``/<ns>/<topic>`` or a partition ``/<ns>/<topic>-part-N``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from abc import abstractmethod
from dataclasses import dataclass
from typing import Any

from danube.admission import Admission, Admitted, PayloadMessages
from danube.admission.sessions import ProducerSessions
from danube.errors import BadRequestError, DanubeError, OverLimitError
from danube.frame import InvalidRecordError, Record, encode_record
from danube.grpc_door import requests
from danube.grpc_door.auth import principal_from_call
from danube.grpc_door.clients import Clients, ProducerEntry
from danube.grpc_door.consumers import ConsumerHandlers, Slots
from danube.meta import TopicName
from danube.meta.records import Dispatch, TopicConfig
from danube.names import client_topic
from danube.security.gate import SecurityGate
from danube.wire import DanubeApi_pb2 as pb
from danube.wire.dispatcher.client import DispatcherClient

log = logging.getLogger(__name__)

_SEND_ACTION = "grpc danube.ProducerService/SendMessage"  # in the audit log
REAP_EVERY_S = 2.0  # how often producers and consumers left idle are looked for


@dataclass(frozen=True, slots=True)
class Lookup:
    """A ``TopicLookup`` answer: ``Redirect`` (``proxy`` false: the client talks to
    ``url`` itself), ``Connect`` (``proxy`` true: ``url`` serves the topic over the bus), or
    ``Failed`` (``url`` empty)."""

    response_type: pb.TopicLookupResponse.LookupType
    url: str
    proxy: bool

    @classmethod
    def redirect(cls, url: str) -> Lookup:
        """Talk to the leader's door at ``url``."""
        return cls(pb.TopicLookupResponse.Redirect, url, False)

    @classmethod
    def connect(cls, url: str) -> Lookup:
        """Talk to ``url``, which serves any topic (discovery)."""
        return cls(pb.TopicLookupResponse.Connect, url, True)


class DanubeApi(ConsumerHandlers):
    """The handlers of Discovery, ProducerService, ConsumerService and HealthCheck."""

    def __init__(
        self,
        *,
        admission: Admission,
        security: SecurityGate,
        sessions: ProducerSessions,
        clients: Clients,
        dispatcher: DispatcherClient,
        streams: Slots,
        advertised_url: str,
    ) -> None:
        super().__init__(clients, dispatcher, streams, advertised_url)
        self.admission = admission
        self.security = security
        self.sessions = sessions

    # --- the backend ------------------------------------------------------------------------

    @abstractmethod
    async def lookup(self, topic: TopicName) -> Lookup:
        """Where a client of ``topic`` should go."""

    @abstractmethod
    async def cached_topic(self, topic: TopicName) -> TopicConfig | None:
        """The config of ``topic`` (a topic, not a partition), cached; None if it does not
        exist."""

    @abstractmethod
    async def ensure_topic(self, topic: TopicName, dispatch: Dispatch) -> None:
        """Make ``topic`` exist and be served here, or raise why not."""

    @abstractmethod
    async def store(self, admitted: Admitted, record: bytes, key: str | None) -> None:
        """Append ``record`` (admitted) to its topic."""

    async def serving(self, topic: TopicName) -> None:
        """Raise unless this door takes a produce to ``topic`` (before its admission);
        discovery's takes any."""
        return None

    async def ensure_consumed(self, topic: TopicName) -> None:
        await self.ensure_topic(topic, "reliable")

    # --- Discovery --------------------------------------------------------------------------

    async def topic_lookup(self, request: Any, context: Any) -> Any:
        answer = await self.lookup(client_topic(request.topic))
        return pb.TopicLookupResponse(
            request_id=request.request_id,
            response_type=answer.response_type,
            connect_url=answer.url,
            broker_url=answer.url,
            proxy=answer.proxy,
        )

    async def topic_partitions(self, request: Any, context: Any) -> Any:
        topic = client_topic(request.topic)
        names = [topic]
        if topic.partition is None:
            config = await self.cached_topic(topic)
            if config is not None and config.partitions > 0:
                names = topic.partitions(config.partitions)
        return pb.TopicPartitionsResponse(
            request_id=request.request_id, partitions=[str(n) for n in names]
        )

    async def topic_exists(self, topic: TopicName) -> bool:
        config = await self.cached_topic(topic.parent)
        if config is None:
            return False
        return topic.partition is None or topic.partition < config.partitions

    # --- ProducerService ------------------------------------------------------------------------

    async def create_producer(self, request: Any, context: Any) -> Any:
        topic = client_topic(request.topic_name)
        wanted = requests.producer_open(request)
        name, access_mode = wanted.name, wanted.access_mode
        await self.ensure_topic(topic, requests.dispatch(request))
        session = await self.sessions.open(topic, name, access_mode=access_mode)
        entry = ProducerEntry(self.clients.new_id(), topic, name, access_mode, session.producer_id)
        try:
            self.clients.add_producer(entry)
        except OverLimitError:
            await self.sessions.close(topic, session.producer_id)
            raise
        log.info("gRPC producer %s (%s) on %s", name, access_mode, topic)
        return pb.ProducerResponse(
            request_id=request.request_id, producer_id=entry.id, producer_name=name
        )

    async def send_message(self, request: Any, context: Any) -> Any:
        # Authenticated here, then admitted as on every produce door (the guard leaves this
        # method to its handler: auth.py).
        principal = principal_from_call(context, self.security)
        msg_id = request.msg_id
        topic = client_topic(msg_id.topic_name)
        await self.serving(topic)
        entry = self.clients.producers.get(msg_id.producer_id)
        session_id = None
        if entry is not None and entry.topic == topic:
            entry.last_seen = time.monotonic()
            session_id = entry.session_id
        # Stateless past the entry: a producer this door forgot (a restart, a leader that
        # moved here) still sends, unless the topic has an exclusive producer that is not it.
        admitted = await self.admission.produce(
            principal,
            topic,
            PayloadMessages([request.payload], [request.attributes]),
            producer_id=session_id,
            schema_id=request.schema_id if request.HasField("schema_id") else None,
            schema_version=request.schema_version if request.HasField("schema_version") else None,
            action=_SEND_ACTION,
        )
        key = request.routing_key if request.HasField("routing_key") else None
        stamp = admitted.stamp  # a topic with a schema: checked and stamped (docs/schemas.md)
        try:
            record = encode_record(
                Record(
                    payload=request.payload,
                    publish_time_ms=request.publish_time or int(time.time() * 1000),
                    producer=request.producer_name,
                    key=key,
                    attributes=dict(request.attributes),
                    schema_id=None if stamp is None else stamp.schema_id,
                    schema_version=None if stamp is None else stamp.version,
                )
            )
        except InvalidRecordError as exc:
            raise BadRequestError(str(exc), code="invalid_record") from exc
        await self.store(admitted, record, key)
        return pb.MessageResponse(request_id=request.request_id)

    # --- HealthCheck ------------------------------------------------------------------------------

    async def health_check(self, request: Any, context: Any) -> Any:
        ok = await self._healthy(requests.client_type(request), request.id)
        status = pb.HealthCheckResponse.OK if ok else pb.HealthCheckResponse.CLOSE
        return pb.HealthCheckResponse(status=status)

    async def _healthy(self, client: str, client_id: int) -> bool:
        """OK while the producer or consumer is known here, its topic exists, and (a
        producer) its session holds or (a consumer) it has not ended."""
        if client == "producer":
            producer = self.clients.producers.get(client_id)
            if producer is None:
                return False
            if not await self.topic_exists(producer.topic) or not await self.sessions.keepalive(
                producer.topic, producer.session_id
            ):
                self.clients.producers.pop(client_id, None)
                return False
            producer.last_seen = time.monotonic()
            return True
        return await self.consumer_healthy(client_id)

    # --- the end ---------------------------------------------------------------------------------

    async def forget_idle(self, every_s: float = REAP_EVERY_S) -> None:
        """:meth:`drop_idle` every ``every_s``, until cancelled (a failed round is logged:
        the next one tries again)."""
        while True:
            await asyncio.sleep(every_s)
            try:
                await self.drop_idle()
            except Exception:  # one bad round must not end the door
                log.exception("dropping idle gRPC clients failed")

    async def drop_idle(self) -> None:
        """Forget producers and consumers their clients stopped checking on: close their
        sessions, detach the consumers (their unacked messages go to the others)."""
        producers, consumers = self.clients.idle(time.monotonic())
        for producer in producers:
            try:
                await self.sessions.close(producer.topic, producer.session_id)
            except DanubeError as exc:
                log.debug("closing the session of %s: %s", producer.name, exc)
        for consumer in consumers:
            await self.detach(consumer)
        if producers or consumers:
            log.info("forgot %d idle gRPC producers, %d consumers", len(producers), len(consumers))

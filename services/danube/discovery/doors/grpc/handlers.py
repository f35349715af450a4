"""Danube's client API (DESIGN §10) over the same internals as the HTTP API (the instance's
danube.discovery.core.Services): admission (danube.admission) and the produce
path (danube.discovery.produce.producer), the dispatcher client, the catalog.

Topic names are Danube's: ``/<ns>/<topic>`` or a partition ``/<ns>/<topic>-part-N``.
Danube's clients make one producer or consumer per partition, so a subscription made over
gRPC on a partitioned topic is a subscription of each partition (as in Danube), kept by the
dispatcher like any other; a topic they name by partition is created (or grown) to have it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Sequence
from functools import partial
from typing import Any

from danube.admission import PayloadMessages
from danube.discovery.core import Services
from danube.discovery.doors.grpc import requests
from danube.discovery.doors.grpc.acks import AckBatcher
from danube.discovery.doors.grpc.auth import principal_from_call
from danube.discovery.doors.grpc.clients import Clients, ConsumerEntry, ProducerEntry
from danube.discovery.errors import (
    BadRequestError,
    NotFoundError,
    OverLimitError,
)
from danube.discovery.produce.sessions import ProducerSessions
from danube.errors import DanubeError
from danube.frame import (
    CorruptFrameError,
    InvalidRecordError,
    Record,
    decode_record,
    encode_record,
)
from danube.meta import TopicName
from danube.meta.backoff import backoff_s
from danube.meta.records import Dispatch
from danube.names import client_topic
from danube.wire import DanubeApi_pb2 as pb
from danube.wire import codes
from danube.wire.dispatcher import protocol

log = logging.getLogger(__name__)

# A ReceiveMessages stream polls its dispatcher for at most this many messages at a time,
# waiting at most this long: a batch is written (gRPC flow control: the client's window)
# before the next is asked for, so a stream buffers one batch at most (one poll reply: at
# most a bus message, 1 MiB by default).
RECEIVE_BATCH = 1000
RECEIVE_WAIT_MS = 5_000
_REATTACH_BASE_S = 0.1
_REATTACH_CAP_S = 2.0
_SEND_ACTION = "grpc danube.ProducerService/SendMessage"  # in the audit log


class DanubeApi:
    """The handlers of Discovery, ProducerService, ConsumerService and HealthCheck."""

    def __init__(
        self,
        services: Services,
        sessions: ProducerSessions,
        clients: Clients,
        *,
        advertised_url: str,
    ) -> None:
        self.services = services
        self.sessions = sessions
        self.clients = clients
        self.advertised_url = advertised_url

    # --- Discovery --------------------------------------------------------------------------

    async def topic_lookup(self, request: Any, context: Any) -> Any:
        client_topic(request.topic)
        # Any instance serves any topic: answer with ourselves, in proxy mode.
        return pb.TopicLookupResponse(
            request_id=request.request_id,
            response_type=pb.TopicLookupResponse.Connect,
            connect_url=self.advertised_url,
            broker_url=self.advertised_url,
            proxy=True,
        )

    async def topic_partitions(self, request: Any, context: Any) -> Any:
        topic = client_topic(request.topic)
        names = [topic]
        if topic.partition is None:
            config = await self.services.catalog.cached_topic(topic)
            if config is not None and config.partitions > 0:
                names = topic.partitions(config.partitions)
        return pb.TopicPartitionsResponse(
            request_id=request.request_id, partitions=[str(n) for n in names]
        )

    # --- topics -------------------------------------------------------------------------------

    async def _ensure_topic(self, topic: TopicName, dispatch: Dispatch) -> None:
        """Make ``topic`` exist (auto-creation allowed): a plain topic as asked, a partition
        by creating or growing its topic to have it (Catalog.ensure_topic)."""
        producer = self.services.producer
        config, created = await self.services.catalog.ensure_topic(
            topic, auto_create=producer.limits.auto_create, dispatch=dispatch
        )
        if created:  # placed now: the producer's first message does not claim them
            await producer.place(topic.parent, config.partitions)

    async def _topic_exists(self, topic: TopicName) -> bool:
        config = await self.services.catalog.cached_topic(topic.parent)
        if config is None:
            return False
        return topic.partition is None or topic.partition < config.partitions

    # --- ProducerService ------------------------------------------------------------------------

    async def create_producer(self, request: Any, context: Any) -> Any:
        topic = client_topic(request.topic_name)
        wanted = requests.producer_open(request)
        name, access_mode = wanted.name, wanted.access_mode
        await self._ensure_topic(topic, requests.dispatch(request))
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
        # method to its handler: doors/grpc/auth.py).
        principal = principal_from_call(context, self.services.security)
        msg_id = request.msg_id
        topic = client_topic(msg_id.topic_name)
        entry = self.clients.producers.get(msg_id.producer_id)
        session_id = None
        if entry is not None and entry.topic == topic:
            entry.last_seen = time.monotonic()
            session_id = entry.session_id
        # Stateless past the entry: a producer this instance forgot (a restart) still sends,
        # unless the topic has an exclusive producer that is not it.
        admitted = await self.services.admission.produce(
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
        await self.services.producer.store(admitted, [record], [key], dispatch="reliable")
        return pb.MessageResponse(request_id=request.request_id)

    # --- ConsumerService ------------------------------------------------------------------------

    async def subscribe(self, request: Any, context: Any) -> Any:
        topic = client_topic(request.topic_name)
        requests.subscription(request.subscription)
        wanted = requests.attach(request)
        name, sub_type, filters = wanted.name, wanted.type, tuple(wanted.key_filters)
        await self._ensure_topic(topic, "reliable")
        dispatcher_id = await self._attach(topic, request.subscription, name, sub_type, filters)
        entry = ConsumerEntry(
            self.clients.new_id(),
            topic,
            request.subscription,
            name,
            sub_type,
            filters,
            dispatcher_id,
        )
        entry.acks = AckBatcher(partial(self._send_acks, entry))
        try:
            self.clients.add_consumer(entry)
        except OverLimitError:
            await self._detach(entry)
            raise
        log.info("gRPC consumer %s (%s) on %s/%s", name, sub_type, topic, request.subscription)
        return pb.ConsumerResponse(
            request_id=request.request_id, consumer_id=entry.id, consumer_name=name
        )

    async def _attach(
        self, topic: TopicName, sub: str, name: str, sub_type: str, filters: tuple[str, ...]
    ) -> str:
        return await self.services.dispatcher.attach(
            topic, sub, name, type=sub_type, start="latest", key_filters=filters
        )

    async def _detach(self, entry: ConsumerEntry) -> None:
        try:
            await self.services.dispatcher.detach(
                entry.topic, entry.subscription, entry.dispatcher_id
            )
        except DanubeError as exc:  # gone already, or its dispatcher is: it expires there
            log.debug("detach of %s: %s", entry.name, exc)

    async def receive_messages(self, request: Any, context: Any) -> AsyncIterator[Any]:
        entry = self.clients.consumers.get(request.consumer_id)
        if entry is None or entry.closed is not None:
            raise NotFoundError(
                f"consumer {request.consumer_id} is not known here: subscribe again",
                code=codes.CONSUMER_NOT_FOUND,
            )
        streams = self.services.streams
        if not streams.try_take():
            raise OverLimitError("this instance holds its maximum of consumer streams")
        entry.streams += 1
        try:
            async for message in self._deliveries(entry):
                yield message
        finally:
            entry.streams -= 1
            entry.last_seen = time.monotonic()
            streams.give_back()

    async def _deliveries(self, entry: ConsumerEntry) -> AsyncIterator[Any]:
        dispatcher = self.services.dispatcher
        failures = 0
        while entry.closed is None:
            try:
                polled = await dispatcher.poll(
                    entry.topic,
                    entry.subscription,
                    entry.dispatcher_id,
                    max=RECEIVE_BATCH,
                    wait_ms=RECEIVE_WAIT_MS,
                )
                failures = 0
            except DanubeError as exc:
                failures += 1
                if exc.code == codes.CONSUMER_NOT_FOUND:
                    await self._reattach(entry)  # its dispatcher restarted or it expired
                elif not exc.retriable:
                    entry.closed = exc.message
                    raise
                await asyncio.sleep(
                    backoff_s(failures - 1, base_s=_REATTACH_BASE_S, cap_s=_REATTACH_CAP_S)
                )
                continue
            entry.last_seen = time.monotonic()
            corrupt: list[tuple[str, int]] = []
            for message in polled.messages:
                partition = TopicName(entry.topic.namespace, message.partition)
                try:
                    out = self._stream_message(entry, partition, message)
                except CorruptFrameError as exc:  # damaged on the way: it comes again, read afresh
                    log.warning("%s@%d: %s; nacked", partition, message.offset, exc)
                    corrupt.append((message.partition, message.offset))
                    continue
                self.clients.delivered(partition, entry.subscription, message.offset, entry.id)
                yield out
            if corrupt:
                await self._nack_corrupt(entry, corrupt)

    async def _nack_corrupt(self, entry: ConsumerEntry, refs: list[tuple[str, int]]) -> None:
        try:
            await self.services.dispatcher.nack(
                entry.topic, entry.subscription, entry.dispatcher_id, refs, delay_ms=0
            )
        except DanubeError as exc:  # left unacked: it comes again as any unacked message does
            log.warning("nack of damaged frames of %s: %s", entry.topic, exc)

    async def _reattach(self, entry: ConsumerEntry) -> None:
        try:
            entry.dispatcher_id = await self._attach(
                entry.topic, entry.subscription, entry.name, entry.type, entry.key_filters
            )
            log.info(
                "gRPC consumer %s attached again to %s/%s",
                entry.name,
                entry.topic,
                entry.subscription,
            )
        except DanubeError as exc:
            if not exc.retriable:  # e.g. another consumer took the exclusive subscription
                entry.closed = exc.message
                raise

    def _stream_message(
        self, entry: ConsumerEntry, partition: TopicName, message: protocol.PolledMessage
    ) -> Any:
        record = decode_record(message.record)
        out = pb.StreamMessage(
            request_id=message.offset,
            msg_id=pb.MsgID(
                topic_name=str(partition),
                broker_addr=self.advertised_url,
                topic_offset=message.offset,
            ),
            payload=record.payload,
            publish_time=record.publish_time_ms,
            producer_name=record.producer,
            subscription_name=entry.subscription,
            attributes=dict(record.attributes),
        )
        if record.key is not None:
            out.routing_key = record.key
        if record.schema_id is not None:
            out.schema_id = record.schema_id
        if record.schema_version is not None:
            out.schema_version = record.schema_version
        return out

    def _ack_target(self, request: Any, *, forget: bool) -> tuple[ConsumerEntry, TopicName, int]:
        msg_id = request.msg_id
        partition = client_topic(msg_id.topic_name)
        requests.subscription(request.subscription_name, "subscription_name")
        entry = self.clients.holder(
            partition, request.subscription_name, msg_id.topic_offset, forget=forget
        )
        if entry is None:
            raise NotFoundError(
                f"no consumer of {request.subscription_name} on {partition} here",
                code=codes.CONSUMER_NOT_FOUND,
            )
        entry.last_seen = time.monotonic()
        return entry, partition, msg_id.topic_offset

    async def ack(self, request: Any, context: Any) -> Any:
        entry, partition, offset = self._ack_target(request, forget=True)
        assert entry.acks is not None
        await entry.acks.ack((partition.topic, offset))
        return pb.AckResponse(request_id=request.request_id)

    async def _send_acks(self, entry: ConsumerEntry, refs: Sequence[tuple[str, int]]) -> None:
        await self.services.dispatcher.ack(
            entry.topic, entry.subscription, entry.dispatcher_id, refs
        )

    async def nack(self, request: Any, context: Any) -> Any:
        entry, partition, offset = self._ack_target(request, forget=True)
        delay_ms = request.delay_ms if request.HasField("delay_ms") else 0
        if request.HasField("reason"):
            log.debug("nack of %s@%d: %s", partition, offset, request.reason[:200])
        await self.services.dispatcher.nack(
            entry.topic,
            entry.subscription,
            entry.dispatcher_id,
            [(partition.topic, offset)],
            delay_ms=min(delay_ms, protocol.NACK_DELAY_MS_MAX),
        )
        return pb.NackResponse(request_id=request.request_id)

    # --- HealthCheck ------------------------------------------------------------------------------

    async def health_check(self, request: Any, context: Any) -> Any:
        ok = await self._healthy(requests.client_type(request), request.id)
        status = pb.HealthCheckResponse.OK if ok else pb.HealthCheckResponse.CLOSE
        return pb.HealthCheckResponse(status=status)

    async def _healthy(self, client: str, client_id: int) -> bool:
        """OK while the producer or consumer is known here, its topic exists, and (a
        producer) its session holds or (a consumer) it has not ended."""
        now = time.monotonic()
        if client == "producer":
            producer = self.clients.producers.get(client_id)
            if producer is None:
                return False
            if not await self._topic_exists(producer.topic) or not await self.sessions.keepalive(
                producer.topic, producer.session_id
            ):
                self.clients.producers.pop(client_id, None)
                return False
            producer.last_seen = now
            return True
        consumer = self.clients.consumers.get(client_id)
        if consumer is None or consumer.closed is not None:
            return False
        if not await self._topic_exists(consumer.topic):
            consumer.closed = "its topic was deleted"
            return False
        consumer.last_seen = now
        return True

    # --- the end ---------------------------------------------------------------------------------

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
            await self._detach(consumer)
        if producers or consumers:
            log.info("forgot %d idle gRPC producers, %d consumers", len(producers), len(consumers))

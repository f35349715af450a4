"""ConsumerService (Subscribe, ReceiveMessages, Ack, Nack) of every gRPC door: the consumers
live in the dispatchers, reached over the bus (danube.wire.dispatcher.client); a door keeps
only its clients' table (clients.py), polls for each open stream and batches acks (acks.py).

Danube's clients make one consumer per partition, so a subscription made over gRPC on a
partitioned topic is a subscription of each partition (as in Danube), kept by the dispatcher
like any other.
"""

from __future__ import annotations

import asyncio
import logging
import time
from abc import abstractmethod
from collections.abc import AsyncIterator, Sequence
from functools import partial
from typing import Any, Protocol

from danube.errors import DanubeError, NotFoundError, OverLimitError
from danube.frame import CorruptFrameError, decode_record
from danube.grpc_door import requests
from danube.grpc_door.acks import AckBatcher
from danube.grpc_door.clients import Clients, ConsumerEntry
from danube.meta import TopicName
from danube.meta.backoff import backoff_s
from danube.names import client_topic
from danube.wire import DanubeApi_pb2 as pb
from danube.wire import codes
from danube.wire.dispatcher import protocol
from danube.wire.dispatcher.client import DispatcherClient

log = logging.getLogger(__name__)

# A ReceiveMessages stream polls its dispatcher for at most this many messages at a time,
# waiting at most this long: a batch is written (gRPC flow control: the client's window)
# before the next is asked for, so a stream buffers one batch at most (one poll reply: at
# most a bus message, 1 MiB by default).
RECEIVE_BATCH = 1000
RECEIVE_WAIT_MS = 5_000
_REATTACH_BASE_S = 0.1
_REATTACH_CAP_S = 2.0


class Slots(Protocol):
    """The consumer streams a process holds open, up to its limit."""

    def try_take(self) -> bool:
        """Take a slot; False when all are taken."""
        ...

    def give_back(self) -> None:
        """Return a slot taken with :meth:`try_take`."""
        ...


class ConsumerHandlers:
    """Subscribe, ReceiveMessages, Ack and Nack; a consumer's health."""

    def __init__(
        self,
        clients: Clients,
        dispatcher: DispatcherClient,
        streams: Slots,
        advertised_url: str,
    ) -> None:
        self.clients = clients
        self.dispatcher = dispatcher
        self.streams = streams
        self.advertised_url = advertised_url

    @abstractmethod
    async def ensure_consumed(self, topic: TopicName) -> None:
        """Make ``topic`` exist for a consumer (discovery creates it), or raise why not."""

    @abstractmethod
    async def topic_exists(self, topic: TopicName) -> bool:
        """Whether ``topic`` (or the partition) exists."""

    async def subscribe(self, request: Any, context: Any) -> Any:
        topic = client_topic(request.topic_name)
        requests.subscription(request.subscription)
        wanted = requests.attach(request)
        name, sub_type, filters = wanted.name, wanted.type, tuple(wanted.key_filters)
        await self.ensure_consumed(topic)
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
            await self.detach(entry)
            raise
        log.info("gRPC consumer %s (%s) on %s/%s", name, sub_type, topic, request.subscription)
        return pb.ConsumerResponse(
            request_id=request.request_id, consumer_id=entry.id, consumer_name=name
        )

    async def _attach(
        self, topic: TopicName, sub: str, name: str, sub_type: str, filters: tuple[str, ...]
    ) -> str:
        return await self.dispatcher.attach(
            topic, sub, name, type=sub_type, start="latest", key_filters=filters
        )

    async def detach(self, entry: ConsumerEntry) -> None:
        """Detach ``entry`` from its dispatcher (its unacked messages go to the others)."""
        try:
            await self.dispatcher.detach(entry.topic, entry.subscription, entry.dispatcher_id)
        except DanubeError as exc:  # gone already, or its dispatcher is: it expires there
            log.debug("detach of %s: %s", entry.name, exc)

    async def receive_messages(self, request: Any, context: Any) -> AsyncIterator[Any]:
        entry = self.clients.consumers.get(request.consumer_id)
        if entry is None or entry.closed is not None:
            raise NotFoundError(
                f"consumer {request.consumer_id} is not known here: subscribe again",
                code=codes.CONSUMER_NOT_FOUND,
            )
        streams = self.streams
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
        dispatcher = self.dispatcher
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
            await self.dispatcher.nack(
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
        await self.dispatcher.ack(entry.topic, entry.subscription, entry.dispatcher_id, refs)

    async def nack(self, request: Any, context: Any) -> Any:
        entry, partition, offset = self._ack_target(request, forget=True)
        delay_ms = request.delay_ms if request.HasField("delay_ms") else 0
        if request.HasField("reason"):
            log.debug("nack of %s@%d: %s", partition, offset, request.reason[:200])
        await self.dispatcher.nack(
            entry.topic,
            entry.subscription,
            entry.dispatcher_id,
            [(partition.topic, offset)],
            delay_ms=min(delay_ms, protocol.NACK_DELAY_MS_MAX),
        )
        return pb.NackResponse(request_id=request.request_id)

    async def consumer_healthy(self, client_id: int) -> bool:
        """OK while the consumer is known here, has not ended and its topic exists."""
        consumer = self.clients.consumers.get(client_id)
        if consumer is None or consumer.closed is not None:
            return False
        if not await self.topic_exists(consumer.topic):
            consumer.closed = "its topic was deleted"
            return False
        consumer.last_seen = time.monotonic()
        return True

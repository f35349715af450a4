"""The producer: messages batched into ``POST /v1/topics/{ns}/{topic}/messages`` requests.

``send()`` checks and encodes a message, queues it and returns a future of its
:class:`SendResult`. One task per producer, the sender, turns the queue into batches
(:class:`danube.client.batch.Accumulator`: ``linger_ms``, ``batch_max_messages``,
``batch_max_bytes``) and posts them. With no batch in flight the next one goes at once (an
idle pipe gives a message nothing to wait for); while batches are in flight, messages
gather behind them and a batch goes when full, when its oldest has waited ``linger_ms``, or
when the last batch in flight comes back. Posts retry 429, 503 and transport failures with
jittered backoff within ``send_timeout_s``; every future of a batch gets its message's
result, or the batch's error. :meth:`AsyncProducer.send_many` queues several messages under
one future.

Order: with ``max_inflight_batches=1`` (the default) batches go one after the other, so the
offsets of a partition follow the order of ``send()`` calls, retries included. More batches
in flight send faster; an idempotent producer's batches still keep that order in each
partition (a batch that overtakes another is refused and sent again), an unsequenced
producer's may then be stored in either order.

The queue is bounded (``max_pending_messages``): ``send()`` waits for room when it is full,
so a producer faster than the server slows down rather than growing memory.

Transport: ``"binary"`` (the default) sends each batch as records framed as the WAL frames
them (``application/vnd.danube.records``: no JSON, no base64, the server checks and routes
without decoding payloads); ``"json"`` sends the JSON body of docs/http-api.md. Both store
the same records and answer the same offsets (a binary record's ``publish_time_ms`` is this
host's clock at ``send()``, a JSON one's the server's at the produce).

Idempotence (``idempotent=True``, the default, with the binary transport; docs/client.md,
"Exactly once into the log"): every record carries the producer's epoch and a sequence per
partition, the producer routes its batches itself (one partition per request) and resends
a batch as the same bytes, so the ingest leader stores each message once however often it
is retried (:mod:`danube.client._idempotent`). ``idempotent=False``, or ``transport="json"``,
sends unsequenced records that discovery routes, as before.

Access mode (docs/producers.md): with ``access_mode`` set (``"shared"`` or ``"exclusive"``)
the producer holds a producer session while it is open: opened by ``async with`` or the
first ``send()`` (:class:`ConflictError` when the topic refuses it), kept alive by its own
task, sent with every batch, closed by :meth:`AsyncProducer.close`. Once the server says
the session is gone, every later batch fails with that error. Without an access mode there
is no session, as before.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable, Mapping

from danube.client._chunk_sender import ChunkSender
from danube.client._http import HttpCore
from danube.client._idempotent import DEFAULT_PRODUCER_NAME, IdempotentSender, unique_name
from danube.client._options import ProducerOptions as ProducerOptions
from danube.client._outbox import Group, Outbox, Queued
from danube.client._producer_session import ProducerSession
from danube.client._records import (
    CheckedFields,
    checked_fields,
    encode_checked,
    encode_frame,
    request_head,
    request_params,
)
from danube.client._sending import Sending
from danube.client._sequencing import Stamp, is_sequenced
from danube.client.batch import Accumulator
from danube.client.errors import ClientError, ClosedError, InvalidArgumentError
from danube.client.messages import (
    Message,
    Payload,
    SendResult,
    encode_message,
    topic_path,
)
from danube.frame.compression import codec_id
from danube.names import TopicName
from danube.tasks import TaskSet

log = logging.getLogger(__name__)

# The produce body around the messages: producer name and dispatch (the name is at most
# 256 bytes, JSON escaping at most 6x that).
_BODY_OVERHEAD_BYTES = 2048


class AsyncProducer(Sending):
    """Sends messages to one topic in batches; use as ``async with`` or call :meth:`close`.

    Per message, :meth:`send` costs an encode, a future and an entry in four lists; the
    room in the queue is a counter (waiters only when it is full), and a batch settles its
    messages in one pass when its answer comes."""

    def __init__(self, http: HttpCore, topic: TopicName, options: ProducerOptions) -> None:
        self.topic = topic
        self.options = options
        self._http = http
        self._path = f"/v1/topics/{topic_path(topic)}/messages"
        self._binary = options.transport == "binary"
        self.idempotent = options.idempotent and self._binary
        named = options.name != DEFAULT_PRODUCER_NAME
        self.name = unique_name() if self.idempotent and not named else options.name
        self._producer_raw = self.name.encode("utf-8")
        self._codec = codec_id(options.compression)  # the payloads' (danube.frame.compression)
        self._sequenced: IdempotentSender | None = None
        if self.idempotent:
            self._sequenced = IdempotentSender(
                http,
                topic,
                name=self.name,
                named=named,
                send_timeout_s=options.send_timeout_s,
                params=lambda: self._params,
                direct=options.direct,
            )
        self._head = request_head(options.name, options.dispatch, None)
        self._params = request_params(options.dispatch, None)
        self._session: ProducerSession | None = None
        self._opening = asyncio.Lock()
        queue: Accumulator[Queued] = Accumulator(
            max_messages=options.batch_max_messages,
            max_bytes=options.batch_max_bytes - _BODY_OVERHEAD_BYTES,
            linger_s=options.linger_ms / 1000,
        )
        self._outbox = Outbox(
            queue,
            pending_max=options.max_pending_messages,
            stamped=self._sequenced is not None,
            start=self._start_sender,
        )
        self._close_called = False
        # The sender's owner: it logs the sender's failure, _sender_done settles the queue.
        self._tasks = TaskSet(f"producer {topic}")
        self._sender: asyncio.Task[None] | None = None
        # Large messages (docs/client.md): a layer over send(), None unless asked for.
        self._chunks: ChunkSender | None = None
        if options.chunking:
            self._chunks = ChunkSender(
                self.send,
                chunk_bytes=options.max_payload_bytes,
                total_bytes_max=options.max_chunked_message_bytes,
            )

    async def __aenter__(self) -> AsyncProducer:
        await self.open()
        return self

    async def open(self) -> str | None:
        """Open the producer session if the producer has an access mode (once); its id.
        :class:`ConflictError` ``exclusive_producer`` / ``producer_exists`` when refused."""
        if self.options.access_mode is None:
            return None
        async with self._opening:
            if self._outbox.closing:
                raise ClosedError(f"producer of {self.topic} is closed")
            if self._session is None:
                self._session = await ProducerSession.open(
                    self._http, self.topic, self.options.name, self.options.access_mode
                )
                self._head = request_head(
                    self.options.name, self.options.dispatch, self._session.producer_id
                )
                self._params = request_params(self.options.dispatch, self._session.producer_id)
            return self._session.producer_id

    @property
    def producer_id(self) -> str | None:
        """The producer session's id, once opened."""
        return None if self._session is None else self._session.producer_id

    @property
    def partitions(self) -> int | None:
        """The topic's partition count an idempotent producer routes over, as it last
        learned it (from a lookup or a produce's answer; 0: unpartitioned); None for a
        producer the server routes for. A topic grown meanwhile is seen from the next answer
        after the leaders' caches heard of it (docs/client.md, "Direct produce")."""
        return None if self._sequenced is None else self._sequenced.partitions

    @property
    def session_error(self) -> ClientError | None:
        """Why the producer session ended (every later batch fails with it), if it did."""
        return None if self._session is None else self._session.lost

    async def __aexit__(self, *_: object) -> None:
        await self.close()

    def encode(
        self,
        payload: Payload | Message,
        *,
        key: str | None = None,
        attributes: Mapping[str, str] | None = None,
    ) -> bytes:
        """The message's wire form (its frame, or its JSON object with ``transport="json"``),
        checked against every limit of a record: :class:`InvalidMessageError` for a message
        the server would refuse."""
        if isinstance(payload, Message):
            message = payload
            payload, key, attributes = message.payload, message.key, message.attributes
        if self._binary:
            return encode_frame(
                payload,
                key,
                attributes,
                producer=self._producer_raw,
                max_payload_bytes=self.options.max_payload_bytes,
                sequenced=self.idempotent,
                codec=self._codec,
            )
        message = Message(payload, key, attributes or {})
        return encode_message(message, max_payload_bytes=self.options.max_payload_bytes)

    async def send(
        self,
        payload: Payload | Message,
        *,
        key: str | None = None,
        attributes: Mapping[str, str] | None = None,
    ) -> asyncio.Future[SendResult]:
        """Queue a message (waiting for room when the queue is full); the future resolves
        to where it was stored, or to the error of its batch. A message that breaks a limit
        raises :class:`InvalidMessageError` here, before anything is queued. With
        ``chunking``, a payload over ``max_payload_bytes`` is queued as its chunks (one
        future for them all: where its first chunk is stored)."""
        if self._chunks is not None and self._chunks.wants(payload):
            return await self._chunks.send(payload, key, attributes)
        if self._sequenced is not None:
            if self._must_wait():
                await self._room_for_one()
            body, stamp = self._encode_stamped(self._checked(payload, key, attributes))
            sent: asyncio.Future[SendResult] = asyncio.get_running_loop().create_future()
            self._outbox.add(body, sent, stamp)
            return sent
        # send_encoded() spelled out: one coroutine per message, not two.
        body = self.encode(payload, key=key, attributes=attributes)
        if self._must_wait():
            await self._room_for_one()
        future: asyncio.Future[SendResult] = asyncio.get_running_loop().create_future()
        self._outbox.add(body, future)
        return future

    def would_chunk(self, payload: Payload | Message) -> bool:
        """Whether :meth:`send` sends ``payload`` as chunks (``chunking`` is on and the
        payload is over ``max_payload_bytes``)."""
        return self._chunks is not None and self._chunks.wants(payload)

    def _checked(
        self,
        payload: Payload | Message,
        key: str | None = None,
        attributes: Mapping[str, str] | None = None,
    ) -> CheckedFields:
        """A message's fields checked against every limit of a record
        (:class:`InvalidMessageError`), for :meth:`_encode_stamped`."""
        if isinstance(payload, Message):
            message = payload
            payload, key, attributes = message.payload, message.key, message.attributes
        return checked_fields(
            payload, key, attributes, max_payload_bytes=self.options.max_payload_bytes
        )

    def _encode_stamped(self, fields: CheckedFields) -> tuple[bytes, Stamp | None]:
        """An idempotent producer's record of a message queued right after (no await
        between the two): stamped with its partition's next sequence when it can be (the
        epoch and partitions known, and every message queued before it stamped too:
        sequences follow the queue's order), else with sequence 0, stamped when its batch
        is planned."""
        sender = self._sequenced
        assert sender is not None
        stamps = self._outbox.stamps
        stamp = sender.stamp_next(fields[1], stamps[-1] if stamps else None, queued=bool(stamps))
        if stamp is None:
            body = encode_checked(
                fields, producer=self._producer_raw, sequence=0, codec=self._codec
            )
            return body, None
        body = encode_checked(
            fields,
            producer=self._producer_raw,
            sequence=stamp[2],
            producer_epoch=sender.epoch,
            codec=self._codec,
        )
        return body, stamp

    async def send_encoded(self, body: bytes) -> asyncio.Future[SendResult]:
        """:meth:`send` of a message :meth:`encode` made (by this producer: an idempotent
        one's frames are sequenced records)."""
        if self._sequenced is not None and not is_sequenced(body):
            raise InvalidArgumentError("an idempotent producer sends frames its encode() made")
        if self._must_wait():
            await self._room_for_one()
        future: asyncio.Future[SendResult] = asyncio.get_running_loop().create_future()
        self._outbox.add(body, future)
        return future

    async def send_many(
        self, messages: Iterable[Payload | Message]
    ) -> asyncio.Future[list[SendResult]]:
        """Queue several messages in order (waiting for room as :meth:`send` does) under one
        future: it resolves to their results in order once every one is stored, or to the
        first error of their batches (the others may be stored: a failed group may be sent
        again, at-least-once). Every message is encoded and checked before any is queued,
        so a bad one raises :class:`InvalidMessageError` here with nothing queued. The
        cheaper way to send many: no future or callback per message."""
        # An idempotent producer's records are stamped as they are queued (sequences follow
        # the queue's order; a message checked out here takes none), a plain one's encoded.
        if self._sequenced is not None:
            fields = [self._checked(message) for message in messages]
            count = len(fields)
        else:
            bodies = [self.encode(message) for message in messages]
            count = len(bodies)
        future: asyncio.Future[list[SendResult]] = asyncio.get_running_loop().create_future()
        if not count:
            future.set_result([])
            return future
        group = Group(future, count)
        outbox = self._outbox
        index = 0
        while index < count:
            if self._must_wait():
                await self._room_for_one()
            room = min(outbox.pending_max - outbox.pending, count - index)
            targets: list[Queued] = [(group, i) for i in range(index, index + room)]
            if self._sequenced is not None:
                # Stamped and queued with no await between: nothing is queued meanwhile.
                stamped = [self._encode_stamped(item) for item in fields[index : index + room]]
                outbox.add_many(
                    [pair[0] for pair in stamped], targets, [pair[1] for pair in stamped]
                )
            else:
                outbox.add_many(bodies[index : index + room], targets, [])
            index += room
        return future

    def _must_wait(self) -> bool:
        """A send must not queue at once: closing, no room, or a session to open first."""
        outbox = self._outbox
        return (
            outbox.closing
            or outbox.pending >= outbox.pending_max
            or (self._session is None and self.options.access_mode is not None)
        )

    async def _room_for_one(self) -> None:
        """Wait until one more message may be queued (the session opened, room in the
        queue); :class:`ClosedError` once the producer is closing."""
        if self._outbox.closing:
            if self._sequenced is not None and self._sequenced.fenced is not None:
                raise self._sequenced.fenced
            raise ClosedError(f"producer of {self.topic} is closed")
        if self._session is None and self.options.access_mode is not None:
            await self.open()
        if not await self._outbox.room_for_one():
            raise ClosedError(f"producer of {self.topic} is closed")

    async def send_and_wait(
        self,
        payload: Payload | Message,
        *,
        key: str | None = None,
        attributes: Mapping[str, str] | None = None,
    ) -> SendResult:
        """:meth:`send`, then wait for the result."""
        return await (await self.send(payload, key=key, attributes=attributes))

    async def flush(self) -> None:
        """Send every queued message now (no lingering) and wait until each is settled
        (stored or failed; the failures stay on their futures)."""
        await self._outbox.flush()

    async def close(self) -> None:
        """Flush, then stop the sender; later sends raise :class:`ClosedError`."""
        if self._close_called:
            if self._sender is not None:
                await asyncio.shield(self._sender)
            return
        self._close_called = True
        self._outbox.close()
        try:
            if self._sender is not None:
                await asyncio.shield(self._sender)
        finally:
            if self._sequenced is not None:
                await self._sequenced.aclose()
            async with self._opening:
                session, self._session = self._session, None
            if session is not None:
                await session.close()

    @property
    def pending(self) -> int:
        """Messages queued or in flight (not yet settled)."""
        return self._outbox.pending

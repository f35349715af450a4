"""The consumer: one attached consumer of a subscription, its messages as an async iterator.

``start()`` attaches (``POST .../subscriptions/{sub}/consumers``) and starts two tasks the
consumer owns: the **source** (the WebSocket stream with credits, or long-poll; see
:mod:`danube.client._sources`) filling a queue of at most ``receiver_queue_size`` messages,
and the **ack batcher** (:mod:`danube.client._acks`); a bug that ends either fails the
consumer (``receive()`` raises it). ``receive()`` and ``async for`` take
from the queue; ``ack()``/``nack()`` only queue (they do not wait) and may be called from
any thread. ``close()`` stops the source, sends the queued acks, then detaches, so the
messages not acked go to the subscription's other consumers at once.

Delivery is at-least-once: a message whose ack was lost, or that was in flight when a
socket dropped or a dispatcher restarted, comes again (``redelivery_count`` tells).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from danube.client._acks import AckBatcher
from danube.client._chunking import (
    GIVE_UP_REASONS,
    ChunkedMessage,
    GivenUp,
    GiveUpReason,
    IncompleteMessageError,
    Reassembler,
)
from danube.client._consume_route import ConsumeRoute
from danube.client._http import HttpCore
from danube.client._inbox import Inbox
from danube.client._sources import PollSource, Recovery, StreamSource, run_source
from danube.client.errors import (
    ClientError,
    ClosedError,
    DeadlineExceededError,
    InvalidArgumentError,
    ProtocolError,
)
from danube.client.messages import (
    MessageRef,
    Position,
    ReceivedMessage,
    position_json,
    topic_path,
)
from danube.names import InvalidNameError, TopicName, validate_segment
from danube.tasks import TaskSet
from danube.wire import codes
from danube.wire.chunks import CHUNKED_BYTES_MAX, UUID_ATTRIBUTE

log = logging.getLogger(__name__)

SubscriptionType = Literal["exclusive", "shared", "failover", "key_shared"]
_TYPES = ("exclusive", "shared", "failover", "key_shared")
KEY_FILTERS_MAX = 32  # the server's limits on key filters
KEY_FILTER_CHARS_MAX = 256
Mode = Literal["stream", "poll"]
# How messages travel: delivery batches of frames, checked here ("binary", the fastest), or
# one JSON object per message ("json", what curl and websocat users read).
Transport = Literal["binary", "json"]
# Where a new subscription starts: "latest", "earliest", an offset or a Timestamp.
Start = Position

# The running loop of this thread, None outside one (asyncio's own, without the raise).
_running_loop = asyncio._get_running_loop

RECEIVER_QUEUE_MAX = 10_000  # the server's cap on outstanding stream credits
# What happens to the records of a chunked message given up (docs/client.md, "Large
# messages"): acknowledged (skipped, as Pulsar does an expired one) or nacked (they come
# again: with a failure policy, to the dead-letter topic after its redeliveries).
ChunkGiveUp = Literal["ack", "nack"]
DETACH_TIMEOUT_S = 5.0


@dataclass(frozen=True, slots=True)
class ConsumerOptions:
    """How a consumer attaches, receives and acks. ``type`` and ``start`` matter only to
    the first attach, which creates the subscription; later ones resume from its cursor.
    ``key_filters`` (``key_shared`` only): glob patterns (``user-*``, ``eu-west-?``) of
    the message keys this consumer takes; none, every key."""

    name: str = "danube-client"
    type: SubscriptionType = "exclusive"
    start: Start = "latest"
    mode: Mode = "stream"
    transport: Transport = "binary"
    receiver_queue_size: int = 1000
    poll_wait_ms: int = 1000
    # Acks wait this long to share one request (and one cursor write): Pulsar's
    # acknowledgmentGroupTime. At 1 000 msg/s, 10 requests a second instead of 50.
    ack_interval_ms: float = 100.0
    ack_batch_max: int = 1000
    ack_timeout_s: float = 30.0
    reattach: bool = True
    reconnect_timeout_s: float = 60.0
    attach_timeout_s: float = 30.0
    key_filters: tuple[str, ...] = ()
    # The failure policy of a subscription this attach creates (docs/http-api.md), as
    # FailurePolicy.body() gives it; another one than an existing subscription's: 409.
    failure_policy: Mapping[str, Any] | None = None
    # Chunked messages (docs/client.md, "Large messages"): the payload bytes reserved by
    # partial messages at most (twice the 100 MiB default of max_chunked_message_bytes),
    # how many may be partial at once, how long one may stay partial, and what is done
    # with the records of one given up.
    chunked_bytes_max: int = 2 * 100 * 1024 * 1024
    chunked_partials_max: int = 16
    chunk_expiry_s: float = 60.0
    chunk_give_up: ChunkGiveUp = "ack"
    # Poll, stream, ack, nack and detach on the consume door of the dispatcher that owns
    # the subscription, as the attach names it (docs/client.md, "Direct consume"); off, or
    # when the attach names none, everything goes through the server the client was given.
    direct: bool = True
    # Keep a delayed message the dispatcher hands over before its time until then, so one
    # due while the subscription changes dispatcher comes on time (docs/policies.md,
    # "Delayed delivery"). Shared subscriptions only: the others deliver delayed messages
    # at once.
    hold_delayed: bool = True
    # Messages kept until their time have this much room besides receiver_queue_size
    # (past it they take the queue's room): a second's lookahead at 5 000 msg/s.
    hold_delayed_max: int = 5000

    def __post_init__(self) -> None:
        if not 1 <= len(self.name) <= 128:
            raise InvalidArgumentError(f"consumer name must be 1..128 chars, got {self.name!r}")
        if self.type not in _TYPES:
            raise InvalidArgumentError(f"type: one of {', '.join(_TYPES)}, not {self.type!r}")
        if isinstance(self.key_filters, str):
            raise InvalidArgumentError("key_filters is a sequence of patterns, not one string")
        if self.key_filters and self.type != "key_shared":
            raise InvalidArgumentError(f"key_filters need type key_shared, not {self.type!r}")
        if len(self.key_filters) > KEY_FILTERS_MAX or not all(
            1 <= len(p) <= KEY_FILTER_CHARS_MAX for p in self.key_filters
        ):
            raise InvalidArgumentError(
                f"key_filters: at most {KEY_FILTERS_MAX} patterns, "
                f"each of 1..{KEY_FILTER_CHARS_MAX} chars"
            )
        if self.mode not in ("stream", "poll"):
            raise InvalidArgumentError(f"mode must be stream or poll, got {self.mode!r}")
        if self.transport not in ("binary", "json"):
            raise InvalidArgumentError(f"transport must be binary or json, not {self.transport!r}")
        position_json(self.start)  # raises for a bad one
        if not 1 <= self.receiver_queue_size <= RECEIVER_QUEUE_MAX:
            raise InvalidArgumentError(f"receiver_queue_size must be in 1..{RECEIVER_QUEUE_MAX}")
        if not 0 <= self.hold_delayed_max <= RECEIVER_QUEUE_MAX * 10:
            raise InvalidArgumentError(f"hold_delayed_max must be in 0..{RECEIVER_QUEUE_MAX * 10}")
        if not 0 <= self.poll_wait_ms <= 30_000:
            raise InvalidArgumentError("poll_wait_ms must be in 0..30000")
        if not 0 <= self.ack_interval_ms <= 10_000:
            raise InvalidArgumentError("ack_interval_ms must be in 0..10000")
        if not 1 <= self.chunked_bytes_max <= 2 * CHUNKED_BYTES_MAX:
            raise InvalidArgumentError(f"chunked_bytes_max must be in 1..{2 * CHUNKED_BYTES_MAX}")
        if not 1 <= self.chunked_partials_max <= 10_000:
            raise InvalidArgumentError("chunked_partials_max must be in 1..10000")
        if self.chunk_give_up not in ("ack", "nack"):
            raise InvalidArgumentError(f"chunk_give_up: ack or nack, not {self.chunk_give_up!r}")
        for name in ("ack_timeout_s", "reconnect_timeout_s", "attach_timeout_s", "chunk_expiry_s"):
            if not 0 < getattr(self, name) <= 3600:
                raise InvalidArgumentError(f"{name} must be in (0, 3600]")

    def attach_body(self) -> dict[str, Any]:
        """The attach request's body."""
        body: dict[str, Any] = {
            "name": self.name,
            "type": self.type,
            "start": position_json(self.start),
        }
        if self.key_filters:
            body["key_filters"] = list(self.key_filters)
        if self.failure_policy is not None:
            body["failure_policy"] = dict(self.failure_policy)
        if self.holds_delayed:
            body["hold_delayed"] = True
        return body

    @property
    def holds_delayed(self) -> bool:
        """Whether this consumer keeps delayed messages handed early until their time."""
        return self.hold_delayed and self.type == "shared"


class AsyncConsumer:
    """One consumer of ``subscription`` on ``topic``; use as ``async with`` (attaches on
    enter, closes on exit) or call :meth:`start` and :meth:`close`."""

    def __init__(
        self, http: HttpCore, topic: TopicName, subscription: str, options: ConsumerOptions
    ) -> None:
        try:
            validate_segment("subscription", subscription)
        except InvalidNameError as exc:
            raise InvalidArgumentError(exc.message, code=exc.code) from exc
        self.topic = topic
        self.subscription = subscription
        self.options = options
        self.reattach_enabled = options.reattach
        self.received = 0  # messages handed to the application
        self.reattached = 0  # times the consumer attached again
        self._http = http
        self._route = ConsumeRoute(http, enabled=options.direct)
        self._consumer_id: str | None = None
        self._inbox = Inbox(
            options.receiver_queue_size,
            hold=options.holds_delayed,
            hold_room=options.hold_delayed_max,
        )
        self._acks = AckBatcher(
            self._route,
            self,
            interval_s=options.ack_interval_ms / 1000,
            batch_max=options.ack_batch_max,
            timeout_s=options.ack_timeout_s,
        )
        self._attach_lock = asyncio.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stream: StreamSource | None = None
        self._tasks = TaskSet(f"consumer {topic} {subscription}", on_failure=self._part_failed)
        self._source: asyncio.Task[None] | None = None
        self._acks_task: asyncio.Task[None] | None = None
        self._closed = False
        self.frames_corrupt = 0  # delivered frames that failed their check (nacked)
        self._chunks = Reassembler(
            bytes_max=options.chunked_bytes_max,
            partials_max=options.chunked_partials_max,
            expiry_s=options.chunk_expiry_s,
        )
        # Chunked messages given up, by reason, and the last one's error (also logged).
        self.chunked_given_up: dict[GiveUpReason, int] = dict.fromkeys(GIVE_UP_REASONS, 0)
        self.last_chunk_error: IncompleteMessageError | None = None

    @property
    def consumer_id(self) -> str:
        """The id the server knows this consumer by (it changes when it attaches again)."""
        if self._consumer_id is None:
            raise ClosedError("the consumer is not attached: call start() first")
        return self._consumer_id

    @property
    def door_url(self) -> str | None:
        """The consume door this consumer uses now (None: through the server it was given)."""
        return self._route.url

    @property
    def door_fallbacks(self) -> int:
        """Times a consume door failed this consumer and the server it was given took over."""
        return self._route.fallbacks

    @property
    def delayed_held(self) -> int:
        """Delayed messages handed over before their time and kept until then, since start
        (``hold_delayed``)."""
        return self._inbox.held_total

    @property
    def acks_failed(self) -> int:
        """Acks and nacks given up on (their messages come again)."""
        return self._acks.failed

    async def __aenter__(self) -> AsyncConsumer:
        await self.start()
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.close()

    async def start(self) -> None:
        """Attach, then start receiving in the background (idempotent)."""
        if self._closed:
            raise ClosedError(f"consumer of {self.topic} is closed")
        if self._consumer_id is not None:
            return
        self._loop = asyncio.get_running_loop()
        self._consumer_id = await self._attach()
        if self._closed:  # closed while it attached: nothing starts now
            raise ClosedError(f"consumer of {self.topic} is closed")
        recovery = Recovery(
            self._http.retry, self.options.reconnect_timeout_s, reattach=self.options.reattach
        )
        binary = self.options.transport == "binary"
        if self.options.mode == "stream":
            self._stream = StreamSource(self._route, self._inbox, self, recovery, binary=binary)
            fill = self._stream.fill
        else:
            fill = PollSource(
                self._route,
                self._inbox,
                self,
                recovery,
                wait_ms=self.options.poll_wait_ms,
                binary=binary,
            ).fill
        self._source = self._tasks.spawn(
            run_source(fill, self, self._inbox, recovery), name="source"
        )
        self._acks_task = self._tasks.spawn(self._acks.run(), name="acks")

    def _part_failed(self, _task: str, error: BaseException) -> None:
        # The source or the ack sender died of a bug (the source hands the failures it
        # knows to the inbox itself; its owner logged this one): receive() raises it once
        # the queued messages are taken, rather than wait on a source that is gone or let
        # acks pile up that nothing sends.
        self._inbox.fail(error)

    async def _attach(self) -> str:
        answer = await self._http.request_retrying(
            "POST",
            f"/v1/topics/{topic_path(self.topic)}/subscriptions/{self.subscription}/consumers",
            body=self.options.attach_body(),
            timeout_s=self.options.attach_timeout_s,
        )
        body = answer.body if isinstance(answer.body, dict) else {}
        consumer_id, url = body.get("consumer_id"), body.get("url")
        if not isinstance(consumer_id, str) or not isinstance(url, str | None):
            raise ProtocolError(f"attach answered {answer.body!r:.200}")
        self._route.learn(url)  # the owner's consume door, or none
        return consumer_id

    async def reattach(self, stale_id: str) -> None:
        """Attach again (the server forgot ``stale_id``), unless that was done already."""
        async with self._attach_lock:
            if self._consumer_id != stale_id or self._closed:
                return
            self._consumer_id = await self._attach()
            self.reattached += 1
            log.info("consumer %s attached again as %s", stale_id, self._consumer_id)

    async def receive(self, timeout_s: float | None = None) -> ReceivedMessage:
        """The next message, waiting at most ``timeout_s`` (None: as long as it takes);
        :class:`DeadlineExceededError` when none came, the source's error when it ended.
        Chunks of a large message are gathered here and come out as one
        :class:`~danube.client._chunking.ChunkedMessage` (docs/client.md, "Large messages")."""
        if self._closed:
            raise ClosedError(f"consumer of {self.topic} is closed")
        if self._consumer_id is None:
            await self.start()
        message = self._inbox.take_nowait()
        if message is None:
            message = await self._take(timeout_s)
        elif self._stream is not None:
            self._stream.taken()
        if UUID_ATTRIBUTE in message.attributes:
            message = await self._reassemble(message, timeout_s)
        self.received += 1
        return message

    async def _take(self, timeout_s: float | None) -> ReceivedMessage:
        deadline = asyncio.timeout(timeout_s)
        try:
            async with deadline:
                message = await self._inbox.get()
        except TimeoutError:
            if not deadline.expired():
                raise
            raise DeadlineExceededError(f"no message within {timeout_s} s") from None
        if self._stream is not None:
            self._stream.taken()
        return message

    async def _reassemble(self, chunk: ReceivedMessage, timeout_s: float | None) -> ReceivedMessage:
        """Take chunks (and let go of what is given up) until a message is whole or a plain
        message comes, within ``timeout_s`` in all."""
        loop = asyncio.get_running_loop()
        ends_s = None if timeout_s is None else loop.time() + timeout_s
        message: ReceivedMessage = chunk
        while True:
            whole, given_up = self._chunks.offer(message, loop.time())
            self._let_go(given_up)
            if whole is not None:
                return whole
            left_s = None if ends_s is None else max(0.0, ends_s - loop.time())
            try:
                queued = self._inbox.take_nowait()
                if queued is None:
                    message = await self._take(left_s)
                else:
                    message = queued
                    if self._stream is not None:
                        self._stream.taken()
            except DeadlineExceededError:
                self._let_go(self._chunks.expire(loop.time()))
                raise
            if UUID_ATTRIBUTE not in message.attributes:
                return message

    def _let_go(self, given_up: list[GivenUp]) -> None:
        """Ack or nack (``chunk_give_up``) the records of chunked messages given up; count
        and log each message once."""
        for item in given_up:
            for ref in item.refs:
                if self.options.chunk_give_up == "ack":
                    self._acks.ack(ref.partition, ref.offset)
                else:
                    self._acks.nack(ref.partition, ref.offset, 0)
            if item.first:
                self.chunked_given_up[item.reason] += 1
                self.last_chunk_error = item.error()
                log.warning("%s", self.last_chunk_error)

    def __aiter__(self) -> AsyncConsumer:
        return self

    async def __anext__(self) -> ReceivedMessage:
        try:
            return await self.receive()
        except ClosedError:
            if self._closed:
                raise StopAsyncIteration from None
            raise

    def ack(self, message: ReceivedMessage) -> None:
        """Acknowledge ``message``: queued, sent in a batch within ``ack_interval_ms``."""
        # One call per message on the loop's own thread (the usual case): no queue function
        # and arguments passed on through _in_loop.
        if isinstance(message, ChunkedMessage):
            for ref in message.chunks:
                self._in_loop(self._acks.ack, ref.partition, ref.offset)
            return
        if not self._closed and self._loop is not None and _running_loop() is self._loop:
            self._acks.ack(message.partition, message.offset)
            return
        self._in_loop(self._acks.ack, message.partition, message.offset)

    def nack(self, message: ReceivedMessage, delay_ms: int = 0) -> None:
        """Ask for ``message`` again after ``delay_ms``: queued like an ack."""
        if not 0 <= delay_ms <= 86_400_000:
            raise InvalidArgumentError(f"delay_ms must be in 0..86400000, got {delay_ms}")
        for ref in message.chunks if isinstance(message, ChunkedMessage) else (message.ref,):
            self._in_loop(self._acks.nack, ref.partition, ref.offset, delay_ms)

    def corrupt(self, ref: MessageRef) -> None:
        """A delivered frame failed its check (damaged on the way): counted, and nacked so
        that it comes again, read afresh (the application never sees it)."""
        self.frames_corrupt += 1
        self._acks.nack(ref.partition, ref.offset, 0)

    def _in_loop(self, queue: Any, *args: Any) -> None:
        if self._closed:
            raise ClosedError(f"consumer of {self.topic} is closed")
        if self._loop is None:
            raise ClosedError("the consumer is not attached: call start() first")
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is self._loop:
            queue(*args)
        else:  # from another thread (the sync client's)
            self._loop.call_soon_threadsafe(queue, *args)

    async def flush_acks(self) -> None:
        """Send the queued acks and nacks now and wait for their answers."""
        await self._acks.flush()

    async def close(self, *, detach: bool = True) -> None:
        """Stop receiving, send the queued acks, then detach (unless ``detach`` is False:
        the server then expires the consumer after its session timeout)."""
        if self._closed:
            return
        self._closed = True
        try:
            await self._tasks.cancel(self._source)
            if self._acks_task is not None and not self._acks_task.done():
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(self.options.ack_timeout_s):
                        await self._acks.flush()
            await self._tasks.close()  # the ack sender, with the requests under way
            if detach and self._consumer_id is not None:
                await self._detach(self._consumer_id)
        finally:
            self._inbox.fail(ClosedError(f"consumer of {self.topic} is closed"))
            await self._route.aclose()

    async def _detach(self, consumer_id: str) -> None:
        try:
            http = self._route.http
            try:
                await http.request(
                    "DELETE", f"/v1/consumers/{consumer_id}", timeout_s=DETACH_TIMEOUT_S
                )
            except ClientError as exc:
                if not self._route.fall_back(exc, http):
                    raise
                await self._http.request(
                    "DELETE", f"/v1/consumers/{consumer_id}", timeout_s=DETACH_TIMEOUT_S
                )
        except ClientError as exc:
            if exc.code != codes.CONSUMER_NOT_FOUND:
                log.warning("detaching %s failed (it expires on its own): %s", consumer_id, exc)

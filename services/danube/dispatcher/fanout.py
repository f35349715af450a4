"""Non-reliable subscriptions: messages fanned out from memory, at most once.

A subscription of a ``non_reliable`` topic keeps no cursor and reads nothing back: it listens
to the live subject of each partition (ingest publishes every batch there) and puts each
message in the buffer of one consumer (shared: the least loaded; exclusive and failover: the
active one). A buffer holds at most ``dispatcher.non_reliable_buffer_messages``; when a message
arrives for a full one, the oldest message in it is dropped, so a slow consumer loses
messages and nobody else (ingest, the producer, other consumers) waits for it. Drops are
counted in ``danube_dispatcher_dropped_messages{reason}``.

Acks are accepted and change nothing; a nack does not redeliver (at-most-once). The start
position is always "now": messages produced while no consumer is attached are not kept.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from danube.bus import Bus, Message, MessageCallback, Subscription
from danube.config import DispatcherConfig
from danube.dispatcher import metrics, policies
from danube.dispatcher.delivery import DeliveryType
from danube.dispatcher.store import NotOwnerError, SubscriptionStore
from danube.errors import ConflictError, NotFoundError
from danube.frame import FRAME_HEADER_BYTES, CorruptFrameError, walk_frames
from danube.meta import TopicName
from danube.meta.records import SubscriptionConfig
from danube.runtime.topic_metrics import subscription_labels
from danube.tasks import TaskSet, TaskSetClosedError
from danube.wire import codes
from danube.wire.dispatcher import protocol
from danube.wire.dispatcher.errors import ConsumerNotFoundError, SubscriptionTakenError

log = logging.getLogger(__name__)

# Live messages waiting in the bus client per partition before it drops them itself.
_LIVE_PENDING_MSGS = 1024
_EXPIRY_CHECK_S = 1.0


@dataclass(frozen=True, slots=True)
class Buffered:
    """One message waiting in a consumer's buffer: its frame as ingest published it (a view
    of the live message; the consumer's decoder checks it)."""

    partition: str
    offset: int
    frame: bytes | memoryview


class Fanout:
    """Which consumer gets each message, and the bounded buffers (pure, no I/O)."""

    def __init__(self, delivery_type: DeliveryType, buffer_messages: int) -> None:
        if buffer_messages < 1:
            raise ValueError("a consumer buffer holds at least one message")
        self.delivery_type = delivery_type
        self.buffer_messages = buffer_messages
        # In attach order: the first is the active consumer of exclusive and failover.
        self._buffers: dict[str, deque[Buffered]] = {}

    @property
    def consumers(self) -> list[str]:
        """Attached consumers, in attach order."""
        return list(self._buffers)

    def buffered(self, consumer_id: str) -> int:
        """Messages waiting for ``consumer_id``."""
        return len(self._buffer(consumer_id))

    def attach(self, consumer_id: str) -> None:
        """Add a consumer; SubscriptionTakenError for a second one of an exclusive subscription."""
        if self.delivery_type == "exclusive" and self._buffers:
            holder = next(iter(self._buffers))
            raise SubscriptionTakenError(
                "the exclusive subscription already has a consumer", holder=holder
            )
        self._buffers[consumer_id] = deque()

    def detach(self, consumer_id: str) -> int:
        """Remove a consumer; returns how many buffered messages are lost with it (a
        failover successor starts with what arrives next)."""
        return len(self._buffers.pop(consumer_id, ()))

    def offer(self, messages: list[Buffered]) -> dict[str, int]:
        """Buffer ``messages`` (in offset order); returns drops by reason."""
        drops = {"slow_consumer": 0, "no_consumer": 0}
        if not self._buffers:
            drops["no_consumer"] = len(messages)
            return drops
        for message in messages:
            if self.delivery_type == "shared":
                buffer = min(self._buffers.values(), key=len)
            else:
                buffer = next(iter(self._buffers.values()))
            if len(buffer) >= self.buffer_messages:
                buffer.popleft()  # the oldest goes: a consumer that catches up gets news
                drops["slow_consumer"] += 1
            buffer.append(message)
        return drops

    def take(self, consumer_id: str, max_messages: int, max_bytes: int) -> list[Buffered]:
        """Up to ``max_messages`` buffered messages of ``consumer_id`` (at least one, and more
        while their records fit ``max_bytes``)."""
        buffer = self._buffer(consumer_id)
        taken: list[Buffered] = []
        used = protocol.REPLY_HEAD_BYTES
        while buffer and len(taken) < max_messages:
            size = len(buffer[0].frame) + protocol.REPLY_BYTES_PER_MESSAGE
            if taken and used + size > max_bytes:
                break
            taken.append(buffer.popleft())
            used += size
        return taken

    def _buffer(self, consumer_id: str) -> deque[Buffered]:
        buffer = self._buffers.get(consumer_id)
        if buffer is None:
            raise ConsumerNotFoundError(
                f"consumer {consumer_id} is not attached", consumer_id=consumer_id
            )
        return buffer


class FanoutRuntime:
    """Serves one non-reliable subscription while this dispatcher owns it (the same surface
    as :class:`~danube.dispatcher.runtime.SubscriptionRuntime` for the handlers)."""

    dispatch = "non_reliable"

    def __init__(
        self,
        store: SubscriptionStore,
        bus: Bus,
        config: DispatcherConfig,
        *,
        on_failed: Callable[[FanoutRuntime, str], None],
    ) -> None:
        self.store = store
        self.bus = bus
        self.config = config
        self.fanout: Fanout | None = None
        self._on_failed = on_failed
        self._live: list[Subscription] = []
        self._listening: set[str] = set()  # partitions (short names) listened to
        # Its expiry loop and the listens of a growth: without one, consumers would never
        # expire or a partition would go unheard, so a failure fails the subscription.
        self._tasks = TaskSet(
            f"{store.topic}/{store.sub}",
            on_failure=lambda name, exc: self.fail(f"task {name} failed: {exc!r}"),
        )
        self._activate_lock = asyncio.Lock()
        self._changed = asyncio.Event()
        self._last_seen: dict[str, float] = {}
        self._names: dict[str, str] = {}
        self.failed = False
        self.deleted = False
        self.closing = False

    # --- life cycle ------------------------------------------------------------------------

    async def start(self) -> None:
        """Resume an existing subscription: listen again (what passed meanwhile is gone)."""
        config = await self.store.load_config()
        if config is not None:
            await self._activate(config)

    async def _activate(self, config: SubscriptionConfig) -> None:
        if config.type == "key_shared":
            raise protocol.BadRequestError(
                "key_shared is served on reliable topics only",
                code="unsupported_subscription_type",
            )
        self.fanout = Fanout(config.type, self.config.non_reliable_buffer_messages)
        await self._listen(await self.store.partitions())
        self._tasks.spawn(self._expire_loop(), name=f"expiry-{self.store.topic}")
        log.info(
            "serving non-reliable subscription %s/%s (%s)",
            self.store.topic,
            self.store.sub,
            config.type,
        )

    async def _listen(self, partitions: list[TopicName]) -> None:
        for partition in partitions:
            if partition.topic in self._listening:
                continue
            self._listening.add(partition.topic)
            subject = self.bus.subjects.live(partition)
            self._live.append(
                await self.bus.subscribe(
                    subject,
                    self._live_handler(partition.topic),
                    pending_msgs_limit=_LIVE_PENDING_MSGS,
                )
            )

    def grow(self, count: int) -> None:
        """The topic has ``count`` partitions now: listen to the new ones too (from now on:
        non-reliable delivery has no past to read)."""
        if self.fanout is None or self.failed or count <= len(self._listening):
            return
        with contextlib.suppress(TaskSetClosedError):  # stopped: nothing starts
            self._tasks.spawn(
                self._listen(self.store.topic.partitions(count)), name=f"grow-{self.store.topic}"
            )

    def fail(self, reason: str) -> None:
        """Stop serving at once and tell the owner."""
        if self.failed:
            return
        self.failed = True
        log.error("subscription %s/%s fails: %s", self.store.topic, self.store.sub, reason)
        self.notify()
        self._on_failed(self, reason)

    def unacked_count(self) -> int:
        """Messages buffered for consumers (lost on a hand-over: at-most-once)."""
        fanout = self.fanout
        return 0 if fanout is None else sum(map(fanout.buffered, fanout.consumers))

    def hold_cursors(self, held: bool) -> None:
        """Nothing to hold: a non-reliable subscription has no cursors."""

    async def flush_held(self) -> None:
        """Nothing held (no cursors)."""

    def begin_stop(self) -> None:
        """Make waiting polls answer now."""
        self.closing = True
        self.notify()

    async def stop(self) -> None:
        """Stop listening; buffered messages are dropped (at-most-once)."""
        self.begin_stop()
        await self._tasks.close()
        for live in self._live:
            await live.unsubscribe()
        self._live.clear()
        if self.fanout is not None:
            for consumer_id in self.fanout.consumers:
                self._detach(consumer_id)

    # --- requests --------------------------------------------------------------------------

    async def attach(self, request: protocol.AttachRequest) -> str:
        """Add a consumer (creating the subscription on its first attach); its id."""
        if request.type == "key_shared":
            raise protocol.BadRequestError(
                f"{self.store.topic} is non-reliable: key_shared is served on reliable topics only",
                code="unsupported_subscription_type",
            )
        limits = await policies.policies_of(self.store)  # docs/policies.md
        async with self._activate_lock:
            if self.fanout is None:
                config = await self.store.create_config(
                    SubscriptionConfig(
                        type=request.type,
                        initial_position="latest",
                        created_ms=int(time.time() * 1000),
                    ),
                    max_subscriptions=limits.max_subscriptions,
                )
                await self._activate(config)
        fanout = self._fanout()
        if request.type != fanout.delivery_type:
            raise ConflictError(
                f"the subscription is {fanout.delivery_type}, not {request.type}",
                code="subscription_type_mismatch",
            )
        where = f"{self.store.topic}/{self.store.sub}"
        policies.check_consumers(limits, len(self._last_seen), where)
        consumer_id = uuid.uuid4().hex
        fanout.attach(consumer_id)
        self._names[consumer_id] = request.name
        self._last_seen[consumer_id] = time.monotonic()
        metrics.CONSUMERS.inc()
        return consumer_id

    async def poll(self, request: protocol.PollRequest, wait_s: float) -> bytes:
        """The poll reply (a delivery batch) of buffered messages for the consumer; waits up
        to ``wait_s`` for the first one."""
        fanout = self._fanout()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait_s
        max_bytes = self.bus.max_payload_bytes
        while True:
            self._seen(request.consumer_id)
            taken = fanout.take(request.consumer_id, request.max, max_bytes)
            if taken:
                frames = [m.frame for m in taken]
                counts = [0] * len(taken)
                metrics.DELIVERED.inc(len(taken))
                labels = subscription_labels(self.store.topic, self.store.sub)
                metrics.SUB_MESSAGES_OUT.labels(*labels).inc(len(taken))
                metrics.SUB_BYTES_OUT.labels(*labels).inc(
                    sum(map(len, frames)) - FRAME_HEADER_BYTES * len(frames)
                )
                metrics.observe_delivery_age(counts, frames)
                return protocol.encode_poll_columns([m.partition for m in taken], counts, frames)
            remaining_s = deadline - loop.time()
            if remaining_s <= 0 or self.closing or self.failed:
                return protocol.encode_poll_columns([], [], [])
            changed = self._changed
            try:
                async with asyncio.timeout(remaining_s):
                    await changed.wait()
            except TimeoutError:
                pass

    async def ack(self, request: protocol.AckRequest, timeout_s: float) -> list[tuple[str, int]]:
        """Accepted and ignored: nothing is redelivered anyway, and nothing is tracked, so
        no ref is ever told as not in flight."""
        del timeout_s
        self._check_consumer(request.consumer_id)
        metrics.ACKED.inc(request.count())
        return []

    async def nack(self, request: protocol.AckRequest) -> None:
        """Accepted; at-most-once, so the message is not delivered again."""
        self._check_consumer(request.consumer_id)
        metrics.NACKED.inc(request.count())

    async def detach(self, consumer_id: str) -> None:
        """Remove a consumer; what was buffered for it is dropped."""
        self._check_consumer(consumer_id)
        self._detach(consumer_id)

    # --- administration --------------------------------------------------------------------

    async def seek(self, position: protocol.StartPosition) -> dict[str, int]:
        """Refused: a non-reliable subscription keeps no position to move."""
        raise protocol.BadRequestError(
            f"{self.store.topic} is non-reliable: its subscriptions have no cursor to seek "
            f"(asked for {position!r})",
            code="unsupported_operation",
        )

    async def skip(self, name: str, to_offset: int | None) -> protocol.SkipReply:
        """Refused: a non-reliable subscription keeps no position to move."""
        raise protocol.BadRequestError(
            f"{self.store.topic} is non-reliable: its subscriptions have no cursor to skip",
            code="unsupported_operation",
        )

    async def failure_policy(self, policy: object) -> protocol.PolicyReply:
        """Refused: a non-reliable subscription never redelivers, so it has no failure policy."""
        raise protocol.BadRequestError(
            f"{self.store.topic} is non-reliable: its subscriptions never redeliver and have "
            f"no failure policy (asked for {policy!r})",
            code="unsupported_operation",
        )

    async def stats(self) -> protocol.SubscriptionStats:
        """The consumers and what is buffered for each (no cursors, no backlog)."""
        fanout = self._fanout()
        consumers = [
            protocol.ConsumerStats(
                consumer_id=c, name=self._names.get(c, ""), unacked=fanout.buffered(c)
            )
            for c in fanout.consumers
        ]
        return protocol.SubscriptionStats(
            type=fanout.delivery_type, partitions=[], consumers=consumers
        )

    async def delete(self) -> None:
        """Delete the subscription's keys (fenced on our owner key) and stop serving;
        buffered messages are dropped."""
        async with self._activate_lock:
            if self.deleted or self.failed:
                raise NotOwnerError(f"{self.store.topic}/{self.store.sub}: being stopped")
            self.deleted = True
        try:
            await self.store.delete()
        finally:
            self.fail("deleted")

    # --- internals -------------------------------------------------------------------------

    def _fanout(self) -> Fanout:
        if self.fanout is None:
            raise NotFoundError(self.store.absent(), code=codes.CONSUMER_NOT_FOUND)
        return self.fanout

    def _check_consumer(self, consumer_id: str) -> None:
        self._seen(consumer_id)
        self._fanout().buffered(consumer_id)  # ConsumerNotFoundError when unknown

    def _seen(self, consumer_id: str) -> None:
        if consumer_id in self._last_seen:
            self._last_seen[consumer_id] = time.monotonic()

    def _detach(self, consumer_id: str) -> None:
        lost = self._fanout().detach(consumer_id)
        self._names.pop(consumer_id, None)
        if self._last_seen.pop(consumer_id, None) is not None:
            metrics.CONSUMERS.dec()
        if lost:
            metrics.DROPPED.labels("detached").inc(lost)

    def notify(self) -> None:
        """Wake every waiting poll."""
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()

    def _live_handler(self, partition: str) -> MessageCallback:
        async def on_live(message: Message) -> None:
            try:
                # Split, not checked: the consumer's decoder checks each frame it takes.
                frames, _ = walk_frames(message.body)
            except CorruptFrameError as exc:
                log.error("corrupt live message of %s dropped: %s", partition, exc)
                return
            batch = [Buffered(partition, f.offset, f.data) for f in frames]
            for reason, count in self._fanout().offer(batch).items():
                if count:
                    metrics.DROPPED.labels(reason).inc(count)
            self.notify()

        return on_live

    async def _expire_loop(self) -> None:
        while True:
            await asyncio.sleep(_EXPIRY_CHECK_S)
            now_s = time.monotonic()
            for consumer_id, seen_s in list(self._last_seen.items()):
                if now_s - seen_s > self.config.consumer_session_timeout_s:
                    log.info("consumer %s of %s/%s expired", consumer_id, *self._key())
                    self._detach(consumer_id)

    def _key(self) -> tuple[str, str]:
        return str(self.store.topic), self.store.sub

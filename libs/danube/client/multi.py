"""One subscription over many topics of a namespace (Pulsar's ``topics`` and
``topicsPattern``): a list of topic names, or a regular expression a topic name must match
whole (``re.fullmatch`` on the name within the namespace, ``orders-.*``).

It is the subscription of that name on each topic, one :class:`AsyncConsumer` per topic,
merged: ``receive()`` and ``async for`` take from all of them, and a message's ``ack()`` goes
to its own topic's consumer (``message.partition`` names the topic). A task the consumer
owns lists the namespace's topics every ``refresh_interval_s`` (5 s, jittered) and joins a
new match from its first message (``start="earliest"``): a topic created after the
subscription is read within about one interval. A topic that goes away ends its consumer
(logged); the others go on. The topics at the start take ``options.start``.

Memory: each topic's consumer holds at most ``receiver_queue_size`` messages, and the merge
one more such queue: ``(topics + 1) x receiver_queue_size`` messages at most.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import random
import re
from collections.abc import Callable, Sequence

from danube.client.admin import AsyncAdmin
from danube.client.consumer import AsyncConsumer, ConsumerOptions
from danube.client.errors import (
    ClientError,
    ClosedError,
    DeadlineExceededError,
    InvalidArgumentError,
)
from danube.client.messages import ReceivedMessage
from danube.names import InvalidNameError, TopicName, validate_segment
from danube.tasks import TaskSet

log = logging.getLogger(__name__)

REFRESH_INTERVAL_S = 5.0
TOPICS_MAX = 1000  # topics one multi-topic consumer joins at most (a consumer each)
PATTERN_CHARS_MAX = 512

ConsumerFactory = Callable[[TopicName, ConsumerOptions], AsyncConsumer]


class AsyncMultiConsumer:
    """Consumes ``subscription`` on every topic of ``namespace`` that ``topics`` names or
    ``topics_pattern`` matches (exactly one of the two), now and as topics appear."""

    def __init__(
        self,
        make_consumer: ConsumerFactory,
        admin: AsyncAdmin,
        namespace: str,
        subscription: str,
        options: ConsumerOptions,
        *,
        topics: Sequence[str] | None = None,
        topics_pattern: str | None = None,
        refresh_interval_s: float = REFRESH_INTERVAL_S,
    ) -> None:
        try:
            validate_segment("namespace", namespace)
            validate_segment("subscription", subscription)
        except InvalidNameError as exc:
            raise InvalidArgumentError(str(exc), code=exc.code) from exc
        if (topics is None) == (topics_pattern is None):
            raise InvalidArgumentError("give either topics or topics_pattern")
        if not 0.1 <= refresh_interval_s <= 3600:
            raise InvalidArgumentError("refresh_interval_s: 0.1 … 3600")
        self._matches = _matcher(topics, topics_pattern)
        self._make = make_consumer
        self._admin = admin
        self.namespace = namespace
        self.subscription = subscription
        self.options = options
        self.refresh_interval_s = refresh_interval_s
        self._consumers: dict[str, AsyncConsumer] = {}
        # The refresher and one pump per topic. Their failures are logged, nothing more
        # ("log"): a pump that ends leaves the other topics going (a topic that goes away
        # ends its own), and a refresher that ends leaves the topics joined going.
        self._tasks = TaskSet(f"multi-consumer {namespace} {subscription}")
        self._merged: asyncio.Queue[ReceivedMessage] = asyncio.Queue(options.receiver_queue_size)
        self._started = False
        self._closed = False

    @property
    def topics(self) -> list[str]:
        """The topics joined so far (names within the namespace), sorted."""
        return sorted(self._consumers)

    async def __aenter__(self) -> AsyncMultiConsumer:
        await self.start()
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.close()

    async def start(self) -> None:
        """Join the topics that match now (``options.start``), then keep looking."""
        if self._closed:
            raise ClosedError(f"multi-topic consumer of {self.namespace} is closed")
        if self._started:
            return
        self._started = True
        await self._join_new(self.options)
        if self._closed:  # closed while it joined
            raise ClosedError(f"multi-topic consumer of {self.namespace} is closed")
        self._tasks.spawn(self._refresh_loop(), name="refresher", on_failure="log")

    async def _refresh_loop(self) -> None:
        later = dataclasses.replace(self.options, start="earliest")
        while True:
            await asyncio.sleep(self.refresh_interval_s * random.uniform(0.8, 1.0))
            try:
                await self._join_new(later)
            except ClientError as exc:  # the next round looks again
                log.warning("multi-topic consumer of %s: %s", self.namespace, exc)

    async def _join_new(self, options: ConsumerOptions) -> None:
        names = await self._admin.topics(self.namespace)
        for name in sorted(n for n in names if self._matches(n) and n not in self._consumers):
            if len(self._consumers) >= TOPICS_MAX:
                log.warning("multi-topic consumer: %d topics joined, %s left", TOPICS_MAX, name)
                return
            consumer = self._make(TopicName(self.namespace, name), options)
            await consumer.start()
            self._consumers[name] = consumer
            if self._closed:  # closed while it attached: no pump may start now
                await consumer.close()
                raise ClosedError(f"multi-topic consumer of {self.namespace} is closed")
            self._tasks.spawn(self._pump(name, consumer), name=f"pump {name}", on_failure="log")
            log.info(
                "multi-topic consumer %s joined /%s/%s", self.subscription, self.namespace, name
            )

    async def _pump(self, name: str, consumer: AsyncConsumer) -> None:
        try:
            async for message in consumer:
                await self._merged.put(message)  # waits while the merge is full
        except ClientError as exc:
            log.warning("multi-topic consumer: /%s/%s ended: %s", self.namespace, name, exc)

    async def receive(self, timeout_s: float | None = None) -> ReceivedMessage:
        """The next message of any topic, waiting at most ``timeout_s`` (None: as long as
        it takes); :class:`DeadlineExceededError` when none came."""
        if self._closed:
            raise ClosedError(f"multi-topic consumer of {self.namespace} is closed")
        await self.start()
        try:
            async with asyncio.timeout(timeout_s):
                return await self._merged.get()
        except TimeoutError:
            raise DeadlineExceededError(f"no message within {timeout_s} s") from None

    def __aiter__(self) -> AsyncMultiConsumer:
        return self

    async def __anext__(self) -> ReceivedMessage:
        try:
            return await self.receive()
        except ClosedError:
            raise StopAsyncIteration from None

    async def close(self) -> None:
        """Stop looking for topics, then close every topic's consumer (their queued acks
        sent, detached)."""
        if self._closed:
            return
        self._closed = True
        await self._tasks.close()
        with contextlib.suppress(ClientError):
            await asyncio.gather(*(c.close() for c in self._consumers.values()))


def _matcher(topics: Sequence[str] | None, pattern: str | None) -> Callable[[str], bool]:
    if topics is not None:
        if isinstance(topics, str):
            raise InvalidArgumentError("topics is a sequence of names, not one string")
        if not 1 <= len(topics) <= TOPICS_MAX:
            raise InvalidArgumentError(f"topics: 1 … {TOPICS_MAX} names")
        wanted = set(topics)
        return wanted.__contains__
    assert pattern is not None
    if not 1 <= len(pattern) <= PATTERN_CHARS_MAX:
        raise InvalidArgumentError(f"topics_pattern: 1 … {PATTERN_CHARS_MAX} chars")
    try:
        compiled = re.compile(pattern)
    except re.error as exc:
        raise InvalidArgumentError(f"topics_pattern {pattern!r}: {exc}") from exc
    return lambda name: compiled.fullmatch(name) is not None

"""The producers and consumers this front door created for gRPC clients.

Danube's protocol names a producer or consumer by a number the broker gave it, and a client
keeps talking to the instance that answered its lookup (this one: lookups answer with the
instance's own address). So the tables live here, in memory, bounded: an entry that neither
a HealthCheck (every 5 s from Danube's clients) nor an open stream has touched for
``idle_s`` is dropped; its HealthCheck then answers CLOSE and the client creates it again.
Nothing here is needed for safety: cursors and acks live in the dispatcher, messages in
ingest; losing the tables (a restart) costs the clients a re-subscribe.
"""

from __future__ import annotations

import secrets
import time
from collections import OrderedDict
from dataclasses import dataclass, field

from danube.errors import OverLimitError
from danube.grpc_door.acks import AckBatcher
from danube.meta import TopicName

# Deliveries remembered to route an ack (which names no consumer) to the consumer that got
# the message; past this many the oldest are forgotten (their acks find no consumer here and
# the messages are redelivered after the ack timeout: at least once, never lost).
HOLDERS_MAX = 1_000_000


@dataclass
class ProducerEntry:
    id: int
    topic: TopicName  # a topic or one partition of it (``<t>-part-N``)
    name: str
    access_mode: str  # "shared" | "exclusive"
    session_id: str  # its producer session (danube.admission.sessions)
    last_seen: float = field(default_factory=time.monotonic)


@dataclass
class ConsumerEntry:
    id: int
    topic: TopicName  # what the dispatcher serves: a topic or one partition of it
    subscription: str
    name: str
    type: str
    key_filters: tuple[str, ...]
    dispatcher_id: str
    last_seen: float = field(default_factory=time.monotonic)
    streams: int = 0  # ReceiveMessages calls open on it
    closed: str | None = None  # why it ended (its HealthCheck answers CLOSE)
    acks: AckBatcher | None = None  # made by the front door with the consumer


class Clients:
    """Producer and consumer entries by id, at most ``limit`` of both together."""

    def __init__(self, *, limit: int, idle_s: float) -> None:
        self.limit = limit
        self.idle_s = idle_s
        self.producers: dict[int, ProducerEntry] = {}
        self.consumers: dict[int, ConsumerEntry] = {}
        # (partition, subscription, offset) -> the consumer the message was delivered to
        self._holders: OrderedDict[tuple[str, str, int], int] = OrderedDict()

    def new_id(self) -> int:
        """A fresh id: random 63-bit, so ids of a restarted instance do not collide with the
        ones its clients still hold."""
        while True:
            candidate = secrets.randbits(63) or 1
            if candidate not in self.producers and candidate not in self.consumers:
                return candidate

    def _check_room(self) -> None:
        if len(self.producers) + len(self.consumers) >= self.limit:
            raise OverLimitError(
                f"this instance serves its maximum of {self.limit} gRPC producers and consumers"
            )

    def add_producer(self, entry: ProducerEntry) -> None:
        self._check_room()
        self.producers[entry.id] = entry

    def add_consumer(self, entry: ConsumerEntry) -> None:
        self._check_room()
        self.consumers[entry.id] = entry

    def delivered(
        self, partition: TopicName, subscription: str, offset: int, consumer: int
    ) -> None:
        """Remember who got ``offset`` of ``partition`` (for the ack that names no consumer)."""
        key = (str(partition), subscription, offset)
        self._holders[key] = consumer
        self._holders.move_to_end(key)
        while len(self._holders) > HOLDERS_MAX:
            self._holders.popitem(last=False)

    def holder(
        self, partition: TopicName, subscription: str, offset: int, *, forget: bool
    ) -> ConsumerEntry | None:
        """The consumer ``offset`` was delivered to, if this instance delivered it and the
        consumer is still here; else any consumer of this instance on that subscription."""
        key = (str(partition), subscription, offset)
        consumer_id = self._holders.pop(key, None) if forget else self._holders.get(key)
        entry = None if consumer_id is None else self.consumers.get(consumer_id)
        if entry is not None:
            return entry
        for candidate in self.consumers.values():
            if candidate.subscription == subscription and (
                candidate.topic in (partition, partition.parent)
            ):
                return candidate
        return None

    def idle(self, now: float) -> tuple[list[ProducerEntry], list[ConsumerEntry]]:
        """Remove and return the entries nobody touched for ``idle_s`` (streams keep
        consumers)."""
        cutoff = now - self.idle_s
        producers = [p for p in self.producers.values() if p.last_seen < cutoff]
        consumers = [c for c in self.consumers.values() if c.streams == 0 and c.last_seen < cutoff]
        for p in producers:
            del self.producers[p.id]
        for c in consumers:
            del self.consumers[c.id]
        return producers, consumers

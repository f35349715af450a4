"""What the subscription machine holds: one entry per message, the fresh queue of each
partition, each consumer's window. Plain data (no logic beyond building a :class:`Message`),
shared by :mod:`danube.dispatcher.delivery` and its key-shared subclass in
:mod:`danube.dispatcher.keyed`."""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field
from typing import Literal

from danube.dispatcher.cursor import PartitionCursor
from danube.dispatcher.events import Message

# "blocked": a poison message held under failure policy block (danube.dispatcher.poison);
# "expired": let go past its TTL (danube.dispatcher.expiring), no longer held.
EntryState = Literal["fresh", "in_flight", "scheduled", "ready", "blocked", "expired"]
Ref = tuple[str, int]


@dataclass(slots=True)
class Entry:
    """One message held: where it is in its life (``state``) and whose window it counts in."""

    partition: str
    offset: int
    payload: object
    state: EntryState = "fresh"
    redelivery_count: int = 0
    key: str | None = None  # the message key, read by key-shared subscriptions only
    # The consumer whose window it counts against: the one it is in flight to, or the one
    # an ack timeout took it back from (until it is delivered again).
    consumer_id: str | None = None
    # Bumped at every state change: a heap item whose stamp differs is stale (lazy deletion).
    stamp: int = 0
    # The consumer that last let it time out or nacked it: a shared subscription gives it
    # to another consumer first (danube.dispatcher.slow).
    refused_by: str | None = None
    # When it expires (Unix ms: danube.dispatcher.expiring); None: never.
    expires_ms: int | None = None
    # A delayed message that fell due (danube.dispatcher.delaying): its cursor acked it
    # when read; its ack is the delay index's.
    delayed: bool = False
    # Its delivery time (Unix ms) when it became an entry before it (handed early to
    # holding consumers: danube.dispatcher.delaying); 0 otherwise. Nobody else is given it
    # before then, a redelivery included.
    due_ms: int = 0

    def message(self) -> Message:
        """The entry as handed to a consumer."""
        return Message(self.partition, self.offset, self.payload, self.redelivery_count)


@dataclass(slots=True)
class PartitionQueue:
    """A partition read by the subscription: its cursor, and what was read, not yet delivered."""

    cursor: PartitionCursor
    fresh: deque[Entry] = field(default_factory=deque)
    paused: bool = False


@dataclass(slots=True)
class ConsumerWindow:
    """An attached consumer and the messages it holds."""

    consumer_id: str
    name: str
    # It keeps a delayed message handed early until its time (danube.dispatcher.delaying).
    holds_delayed: bool = False
    # Its window: given to it and not acked (in flight, or taken back by an ack timeout and
    # not yet delivered again), in delivery order.
    held: dict[Ref, Entry] = field(default_factory=dict)
    # Of those, the ones due again, lowest offset first (stamped like the machine's ready
    # heap): it takes them back before anything else, whatever room its window has left.
    ready: list[tuple[int, str, int]] = field(default_factory=list)
    # Slow-consumer bookkeeping (danube.dispatcher.slow): ack timeouts in a row with no
    # ack between them, halvings of its window, the machine's stamp at its last strike
    # (batches sent before it do not strike again) and when it last polled.
    strikes: int = 0
    halvings: int = 0
    struck_stamp: int = 0
    polled_s: float = -math.inf

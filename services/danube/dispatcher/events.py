"""What the subscription state machine is told (events) and what it asks for (actions).

Times are monotonic seconds (``now_s``) supplied by the caller, so the machine never reads a
clock; partitions are named by their topic segment (``orders`` or ``orders-part-3``).
Payloads are opaque to the machine (a record, or a reference to one): it only carries them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

from danube.dispatcher.cursor import CursorState


@dataclass(frozen=True, slots=True)
class Message:
    """One message as handed to a consumer; ``redelivery_count`` is 0 on first delivery."""

    partition: str
    offset: int
    payload: object
    redelivery_count: int = 0


# --- events ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ConsumerAttached:
    """A consumer joins; refused with ``SubscriptionTakenError`` on a taken exclusive one.
    ``key_filters`` (key-shared only): glob patterns of the keys it takes; none, every key.
    ``holds_delayed``: it keeps a delayed message given early until its time
    (danube.dispatcher.delaying)."""

    consumer_id: str
    name: str
    key_filters: tuple[str, ...] = ()
    holds_delayed: bool = False


@dataclass(frozen=True, slots=True)
class ConsumerDetached:
    """A consumer leaves (or its session expired); its unacked messages are redelivered."""

    consumer_id: str
    now_s: float


@dataclass(frozen=True, slots=True)
class MessagesAvailable:
    """A read of ``partition`` returned ``messages`` (offset, payload), in increasing offset
    order, and covered ``[from_offset, next_offset)``: an offset of that range that is not in
    ``messages`` does not exist. ``from_offset`` defaults to the first message's offset (a
    live message proves nothing about the offsets before it); ``next_offset`` defaults to
    one past the last message. A read starting above the cursor's read position is ignored:
    it would leave a range never read."""

    partition: str
    messages: Sequence[tuple[int, object]]
    from_offset: int | None = None
    next_offset: int | None = None


@dataclass(frozen=True, slots=True)
class Poll:
    """A consumer asks for up to ``max_messages`` messages now."""

    consumer_id: str
    max_messages: int
    now_s: float
    wall_ms: int | None = None  # the wall clock (Unix ms) message expiry is judged by


@dataclass(frozen=True, slots=True)
class Ack:
    """A consumer acknowledges ``(partition, offset)`` pairs."""

    consumer_id: str
    refs: Sequence[tuple[str, int]]


@dataclass(frozen=True, slots=True)
class Nack:
    """A consumer refuses ``(partition, offset)`` pairs: redeliver after ``delay_ms``."""

    consumer_id: str
    refs: Sequence[tuple[str, int]]
    delay_ms: int
    now_s: float


@dataclass(frozen=True, slots=True)
class Tick:
    """Time passes: ack timeouts fire, redeliveries fall due, cursors get written, expired
    messages go (``wall_ms``: Unix ms; None: not judged)."""

    now_s: float
    wall_ms: int | None = None


@dataclass(frozen=True, slots=True)
class Seek:
    """Move the cursor of each named partition to an offset. Resolving ``earliest``,
    ``latest`` or a timestamp to offsets needs I/O, so the caller does it first."""

    offsets: Mapping[str, int]
    now_s: float


Event = ConsumerAttached | ConsumerDetached | MessagesAvailable | Poll | Ack | Nack | Tick | Seek


# --- actions -----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Deliver:
    """Hand messages to the consumer (the answer to its poll), as columns in delivery order:
    the i-th message is ``partitions[i]@offsets[i]``. Columns, not a :class:`Message` each: a
    poll hands out up to thousands, and the reply is built from the columns as they are.
    Nobody changes the lists once the action is made."""

    consumer_id: str
    partitions: list[str]
    offsets: list[int]
    payloads: list[object]
    redelivery_counts: list[int]

    def __post_init__(self) -> None:
        size = len(self.partitions)
        columns = (self.offsets, self.payloads, self.redelivery_counts)
        assert all(len(column) == size for column in columns), "columns of different lengths"

    @property
    def messages(self) -> tuple[Message, ...]:
        """The messages one by one (for readers that want them so: tests, tools)."""
        columns = (self.partitions, self.offsets, self.payloads, self.redelivery_counts)
        return tuple(map(Message, *columns))


@dataclass(frozen=True, slots=True)
class DeadLetter:
    """A poison message: publish it to the dead-letter topic (``dispose`` ``dead_letter``)
    or count it as dropped (``drop``); the cursor has already moved past it."""

    message: Message
    dispose: Literal["dead_letter", "drop"] = "dead_letter"


@dataclass(frozen=True, slots=True)
class PauseReading:
    """Stop reading ``partition`` (live and catch-up): the subscription holds too much."""

    partition: str


@dataclass(frozen=True, slots=True)
class ResumeReading:
    """Read ``partition`` again, from the cursor's read position."""

    partition: str


@dataclass(frozen=True, slots=True)
class ReadFrom:
    """Drop what is being read of ``partition`` and read again from ``offset`` (a seek)."""

    partition: str
    offset: int


@dataclass(frozen=True, slots=True)
class FlushCursor:
    """Write the cursor of ``partition`` (fenced on the subscription's owner key); ``seq`` is
    the cursor's :attr:`~PartitionCursor.flush_seq` for this state (later writes, higher)."""

    partition: str
    state: CursorState
    seq: int = field(default=0, compare=False)


@dataclass(frozen=True, slots=True)
class NotInFlight:
    """Tell the consumer that acked ``refs`` that the ack did nothing for them: they were
    never delivered (not yet read, or read and not yet given to anyone), dropped by a seek,
    or are not of this subscription. Offsets acked before are not listed: acking twice is
    fine (a retried ack)."""

    consumer_id: str
    refs: tuple[tuple[str, int], ...]


@dataclass(frozen=True, slots=True)
class SlowConsumerDetached:
    """The machine detached ``consumer_id`` (named ``name``): its messages timed out
    ``strikes`` times in a row with no ack (danube.dispatcher.slow). Its unacked messages
    are already back for the others; count it, log it, forget its session."""

    consumer_id: str
    name: str
    strikes: int
    reason: str


Action = (
    Deliver
    | DeadLetter
    | PauseReading
    | ResumeReading
    | ReadFrom
    | FlushCursor
    | NotInFlight
    | SlowConsumerDetached
)

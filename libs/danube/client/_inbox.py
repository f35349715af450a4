"""A consumer's receive queue: delivered messages waiting for the application, bounded by
``receiver_queue_size``. The stream never overfills it (credits are granted only for its free
room) and the long-poll asks only for its free room, so a message past the bound is a
server that broke the protocol.

**Delayed messages handed early.** A consumer that attached with ``hold_delayed`` is given
a delayed message up to the dispatcher's ``delay_lookahead_ms`` before its delivery time
(danube.wire.delay). The inbox keeps such a message, in its room, until that time by this
machine's clock, then queues it like any other; a second copy of a message it keeps (a new
owner of the subscription hands out again what the old one had) is dropped. A message due
more than ``HOLD_MS_MAX`` ahead is queued at once: no dispatcher hands one out that early,
and a slot of the queue is not kept for longer than that. Kept messages have room of their
own, ``hold_room`` (a second's worth at a high rate is thousands: in the queue's room they
would leave none for the messages due now); past it they take the queue's room. So the
inbox never holds more than ``capacity + hold_room`` messages.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import time
from collections import deque

from danube.client.errors import ProtocolError
from danube.client.messages import ReceivedMessage
from danube.wire.delay import DELIVER_AFTER_ATTRIBUTE, DELIVER_AT_ATTRIBUTE, deliver_at_ms

# The dispatcher's lookahead is at most 10 s; this leaves room for the clocks' difference.
HOLD_MS_MAX = 15_000


class Inbox:
    """Messages in delivery order, plus the error that ended their source (if any).
    ``hold``: delayed messages handed early are kept until their time (module docstring)."""

    def __init__(self, capacity: int, *, hold: bool = False, hold_room: int = 0) -> None:
        if capacity < 1 or hold_room < 0:
            raise ValueError(f"need capacity >= 1 and hold_room >= 0: {capacity}, {hold_room}")
        self.capacity = capacity
        self.hold = hold
        self.hold_room = hold_room if hold else 0
        self._items: deque[ReceivedMessage] = deque()
        self._ready = asyncio.Event()  # set while a message or the failure waits
        self._taken = asyncio.Event()  # set when the application took a message
        self.failure: BaseException | None = None
        # Kept until their time: a heap of (due ms, arrival count, message), their refs,
        # and the timer that queues the earliest.
        self._held: list[tuple[int, int, ReceivedMessage]] = []
        self._held_refs: set[tuple[str, int]] = set()
        self._arrivals = itertools.count()
        self._timer: asyncio.TimerHandle | None = None
        self.held_total = 0  # messages kept until their time, since start
        self.copies_dropped = 0  # second copies of a message kept

    def __len__(self) -> int:
        return len(self._items) + len(self._held)

    @property
    def free(self) -> int:
        """Room for this many more messages: the queue's, less what kept messages take of
        it past their own room."""
        over = max(0, len(self._held) - self.hold_room)
        return max(0, self.capacity - len(self._items) - over)

    def put(self, message: ReceivedMessage) -> None:
        """Queue a delivered message; ProtocolError past the bound."""
        if len(self) >= self.capacity + self.hold_room:
            raise ProtocolError(
                f"the server sent more than the {self.capacity} messages there was room for"
            )
        if not self._kept(message):
            self._items.append(message)
            self._ready.set()

    def put_many(self, messages: list[ReceivedMessage]) -> None:
        """Queue a delivered batch (one wake-up of the reader for all of it); ProtocolError,
        nothing queued, when it does not fit."""
        if len(self) + len(messages) > self.capacity + self.hold_room:
            raise ProtocolError(
                f"the server sent {len(messages)} messages with room for {self.free}"
            )
        if self.hold:
            messages = [message for message in messages if not self._kept(message)]
        if messages:
            self._items.extend(messages)
            self._ready.set()

    def _kept(self, message: ReceivedMessage) -> bool:
        """Whether ``message`` is kept until its time (or dropped as a copy of one kept)
        rather than queued now."""
        if not self.hold:
            return False
        attributes = message.attributes
        if DELIVER_AT_ATTRIBUTE not in attributes and DELIVER_AFTER_ATTRIBUTE not in attributes:
            return False
        ref = (message.partition, message.offset)
        if ref in self._held_refs:
            self.copies_dropped += 1
            return True
        due_ms = deliver_at_ms(attributes, message.publish_time_ms)
        wait_ms = None if due_ms is None else due_ms - time.time() * 1000
        if wait_ms is None or wait_ms <= 0 or wait_ms > HOLD_MS_MAX:
            return False
        assert due_ms is not None
        if not self._held or due_ms < self._held[0][0]:
            self._arm(wait_ms / 1000)
        heapq.heappush(self._held, (due_ms, next(self._arrivals), message))
        self._held_refs.add(ref)
        self.held_total += 1
        return True

    def _arm(self, delay_s: float) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer = asyncio.get_running_loop().call_later(delay_s, self._release)

    def _release(self) -> None:
        """Queue the kept messages whose time came (by the wall clock: a timer may fire a
        little early), then wait for the next."""
        self._timer = None
        held, now_ms = self._held, time.time() * 1000
        while held and held[0][0] <= now_ms:
            message = heapq.heappop(held)[2]
            self._held_refs.discard((message.partition, message.offset))
            self._items.append(message)
            self._ready.set()
        if held:
            self._arm(max(held[0][0] - now_ms, 0.1) / 1000)

    def fail(self, error: BaseException) -> None:
        """The source ended: :meth:`get` raises ``error`` once the queue is drained."""
        self.failure = error
        self._ready.set()

    def take_nowait(self) -> ReceivedMessage | None:
        """The next message, or None (raises the failure once drained)."""
        if self._items:
            message = self._items.popleft()
            if not self._items and self.failure is None:
                self._ready.clear()
            self._taken.set()
            return message
        if self.failure is not None:
            raise self.failure
        return None

    async def get(self) -> ReceivedMessage:
        """The next message, waiting as long as it takes (the caller bounds it)."""
        while True:
            message = self.take_nowait()
            if message is not None:
                return message
            self._ready.clear()
            await self._ready.wait()

    async def wait_taken(self) -> None:
        """Wait until the application takes a message (room frees up)."""
        self._taken.clear()
        await self._taken.wait()

    def drain(self) -> list[ReceivedMessage]:
        """Every queued message, removed (on close), and those kept: never handed out,
        the server gives them again."""
        items = list(self._items)
        self._items.clear()
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._held.clear()
        self._held_refs.clear()
        return items

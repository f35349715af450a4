"""A consumer's receive queue: delivered messages waiting for the application, bounded by
``receiver_queue_size``. The stream never overfills it (credits are granted only for its free
room) and the long-poll asks only for its free room, so a message past the bound is a
server that broke the protocol."""

from __future__ import annotations

import asyncio
from collections import deque

from danube.client.errors import ProtocolError
from danube.client.messages import ReceivedMessage


class Inbox:
    """Messages in delivery order, plus the error that ended their source (if any)."""

    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError(f"capacity must be at least 1, got {capacity}")
        self.capacity = capacity
        self._items: deque[ReceivedMessage] = deque()
        self._ready = asyncio.Event()  # set while a message or the failure waits
        self._taken = asyncio.Event()  # set when the application took a message
        self.failure: BaseException | None = None

    def __len__(self) -> int:
        return len(self._items)

    @property
    def free(self) -> int:
        """Room for this many more messages."""
        return self.capacity - len(self._items)

    def put(self, message: ReceivedMessage) -> None:
        """Queue a delivered message; ProtocolError past the capacity."""
        if len(self._items) >= self.capacity:
            raise ProtocolError(
                f"the server sent more than the {self.capacity} messages there was room for"
            )
        self._items.append(message)
        self._ready.set()

    def put_many(self, messages: list[ReceivedMessage]) -> None:
        """Queue a delivered batch (one wake-up of the reader for all of it); ProtocolError,
        nothing queued, when it does not fit."""
        if len(self._items) + len(messages) > self.capacity:
            raise ProtocolError(
                f"the server sent {len(messages)} messages with room for {self.free}"
            )
        if messages:
            self._items.extend(messages)
            self._ready.set()

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
        """Every queued message, removed (on close)."""
        items = list(self._items)
        self._items.clear()
        return items

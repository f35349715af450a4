"""Live streams: a subscription that either pushes each message to a callback or is iterated.

Messages wait in the subscription's pending queue, bounded by ``pending_msgs_limit`` and
``pending_bytes_limit``. When a consumer falls behind and the queue is full, NATS drops the newest
messages (counted in :attr:`Subscription.dropped`, logged at a bounded rate): the bus is
at-most-once, and a reader that must not miss anything notices the gap in offsets and reads it
back from the WAL.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable

import nats.errors
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription as NatsSubscription

from danube import trace
from danube.bus.errors import BusError, BusTimeoutError, NotConnectedError
from danube.bus.messages import Message, MessageCallback
from danube.bus.protocol import check_timeout
from danube.bus.rpc import DropCounter

logger = logging.getLogger(__name__)

DEFAULT_SUBSCRIBE_PENDING_MSGS = 10_000
DEFAULT_SUBSCRIBE_PENDING_BYTES = 64 * 1024 * 1024


def to_message(msg: Msg) -> Message:
    """The bus's view of a NATS message."""
    return Message(subject=msg.subject, body=msg.data, headers=msg.headers or {})


def adapt_callback(subject: str, callback: MessageCallback) -> Callable[[Msg], Awaitable[None]]:
    """Wrap a user callback so one failing message is logged and the stream goes on.

    A closure rather than a callable object: nats-py accepts only coroutine functions.
    """

    async def on_message(msg: Msg) -> None:
        message = to_message(msg)
        # The message's trace id (the request that published it) for the callback's logs.
        with trace.bound(trace.from_bus_headers(message.headers)):
            try:
                await callback(message)
            except Exception:
                logger.exception("bus: subscriber callback on %s failed", subject)

    return on_message


class Subscription(DropCounter):
    """A live subscription made by :meth:`Bus.subscribe`.

    Without a callback it is an async iterator of :class:`Message` (``async for m in sub``),
    which ends once the subscription is unsubscribed or drained; :meth:`next` waits for one
    message with a deadline.
    """

    def __init__(self, subject: str, sub: NatsSubscription, *, has_callback: bool) -> None:
        super().__init__(subject)
        self._sub = sub
        self._has_callback = has_callback

    @property
    def pending(self) -> int:
        """Messages received and not yet consumed."""
        return self._sub.pending_msgs

    async def __aiter__(self) -> AsyncIterator[Message]:
        if self._has_callback:
            raise BusError("a subscription with a callback cannot be iterated")
        async for msg in self._sub.messages:
            yield to_message(msg)

    async def next(self, timeout_s: float) -> Message:
        """The next message, or BusTimeoutError if none arrives within ``timeout_s``."""
        if self._has_callback:
            raise BusError("a subscription with a callback cannot be read with next()")
        check_timeout(timeout_s)
        try:
            return to_message(await self._sub.next_msg(timeout=timeout_s))
        except nats.errors.TimeoutError as exc:
            raise BusTimeoutError(self.subject, timeout_s) from exc
        except nats.errors.Error as exc:  # the subscription or the connection is closed
            raise NotConnectedError(f"cannot read {self.subject!r}: {exc}") from exc

    async def unsubscribe(self) -> None:
        """Stop receiving now; messages still pending are discarded."""
        with contextlib.suppress(nats.errors.Error):  # closed already: nothing left to stop
            await self._sub.unsubscribe()

    async def drain(self) -> None:
        """Stop receiving, then let the messages already pending be consumed.

        Unbounded on its own when nobody consumes them: put a deadline around it.
        """
        with contextlib.suppress(nats.errors.Error):
            await self._sub.drain()  # type: ignore[no-untyped-call]  # nats-py leaves it unannotated

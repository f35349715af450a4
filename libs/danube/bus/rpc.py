"""The responder side of request/reply: one served subject, its bounded handlers, their replies.

Flow control, from the wire in: NATS delivers the subject's messages into the subscription's
pending queue (bounded by ``pending_msgs_limit`` and ``pending_bytes_limit``); one task takes them
out in order and starts a handler task for each, but only once one of ``max_concurrency`` slots is
free. So when every slot is busy, requests wait in the pending queue; when that queue is full too,
NATS drops new requests on arrival (a "slow consumer" event, logged and counted in
:attr:`Responder.dropped`), and their callers see a timeout, which is retriable. A request whose
deadline has passed is answered ``deadline_exceeded`` at once, without taking a slot, so a backlog
of expired work clears fast.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Mapping

import nats.errors
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription as NatsSubscription

from danube import trace
from danube.bus.errors import BusError, DeadlineExceededError, PayloadTooLargeError
from danube.bus.messages import Handler, Reply, Request
from danube.bus.protocol import (
    check_user_headers,
    error_headers,
    headers_size_bytes,
    monotonic_s,
    read_timeout_s,
)
from danube.errors import DanubeError

logger = logging.getLogger(__name__)

DEFAULT_MAX_CONCURRENCY = 32
DEFAULT_SERVE_PENDING_MSGS = 1024
DEFAULT_SERVE_PENDING_BYTES = 64 * 1024 * 1024

PublishFn = Callable[[str, bytes, Mapping[str, str] | None], Awaitable[None]]

_DROP_LOG_INTERVAL_S = 5.0  # a flood would otherwise log one line per dropped message


class DropCounter:
    """Counts the messages NATS dropped for one subscription, logging them at a bounded rate."""

    def __init__(self, subject: str) -> None:
        self.subject = subject
        self.dropped = 0
        self._logged_at: float | None = None

    def note_dropped(self) -> None:
        """Called from the connection's error callback on a slow-consumer event."""
        self.dropped += 1
        now = asyncio.get_running_loop().time()
        if self._logged_at is None or now - self._logged_at >= _DROP_LOG_INTERVAL_S:
            self._logged_at = now
            logger.warning(
                "bus: pending queue of %s is full; dropping messages (%d so far)",
                self.subject,
                self.dropped,
            )


class Responder(DropCounter):
    """One served subject: runs ``handler`` for each request, at most ``max_concurrency`` at once.

    Made by :meth:`Bus.serve`; :meth:`drain` stops taking requests and finishes those taken,
    :meth:`unsubscribe` stops at once and cancels the handlers in flight (for an owner that
    lost its lease and must not answer any more).
    """

    def __init__(
        self,
        *,
        subject: str,
        handler: Handler,
        max_concurrency: int,
        default_timeout_s: float,
        publish_timeout_s: float,
        max_payload_bytes: Callable[[], int],
        publish: PublishFn,
        drain_timeout_s: float = 10.0,
    ) -> None:
        if max_concurrency < 1:
            raise BusError(f"max_concurrency must be at least 1, got {max_concurrency}")
        super().__init__(subject)
        self._handler = handler
        self._slots = asyncio.Semaphore(max_concurrency)
        self._default_timeout_s = default_timeout_s
        self._publish_timeout_s = publish_timeout_s
        self._drain_timeout_s = drain_timeout_s
        self._max_payload_bytes = max_payload_bytes
        self._publish = publish
        self._tasks: set[asyncio.Task[None]] = set()
        self._sub: NatsSubscription | None = None
        self.max_concurrency = max_concurrency

    @property
    def in_flight(self) -> int:
        """How many handlers are running right now."""
        return len(self._tasks)

    def can_take_now(self) -> bool:
        """True when :meth:`on_message` would start a handler without waiting for a slot
        (the connection then hands it a request in the read loop's turn)."""
        return not self._slots.locked()

    def attach(self, sub: NatsSubscription) -> None:
        """Bind the NATS subscription that feeds :meth:`on_message` (done by the bus)."""
        self._sub = sub

    async def on_message(self, msg: Msg) -> None:
        """The subscription's callback: answer expired requests, start handlers for the rest."""
        headers: Mapping[str, str] = msg.headers or {}
        # The deadline starts now, on this host's clock: the caller's clock never matters.
        timeout_s = read_timeout_s(headers, default_timeout_s=self._default_timeout_s)
        deadline_s = monotonic_s() + timeout_s
        request = Request(msg.subject, msg.data, headers, deadline_s=deadline_s)
        if timeout_s <= 0:
            await self._send(msg.reply, _deadline_reply(msg.subject))
            return
        # Waiting here holds the next messages in NATS' bounded pending queue: that is the
        # back-pressure, and why the handler itself runs in a task of its own.
        await self._slots.acquire()
        task = asyncio.create_task(self._run(msg.reply, request), name=f"bus {self.subject}")
        self._tasks.add(task)
        task.add_done_callback(self._finished)

    def _finished(self, task: asyncio.Task[None]) -> None:
        # Here rather than in a `finally` of the task: a task cancelled before it ever ran
        # (by unsubscribe or a drain that ran out of time) must give its slot back too.
        self._tasks.discard(task)
        self._slots.release()
        if not task.cancelled() and (exc := task.exception()) is not None:
            logger.error("bus: responder on %s failed", self.subject, exc_info=exc)

    async def _run(self, reply_to: str, request: Request) -> None:
        # The task's own context: the caller's trace id for the handler and its logs, and
        # back to the caller on the reply.
        with trace.bound(trace.from_bus_headers(request.headers)):
            reply = await self._call(request)
            await self._send(reply_to, reply)

    async def _call(self, request: Request) -> Reply:
        # Nobody waits past the deadline, so the handler stops there too.
        scope = asyncio.timeout(request.remaining_s())
        try:
            async with scope:
                result = await self._handler(request)
        except TimeoutError as exc:
            if scope.expired():
                logger.debug("bus: handler on %s passed its deadline", request.subject)
                return _deadline_reply(request.subject)
            return Reply(headers=error_headers(exc))
        except DanubeError as exc:
            logger.debug("bus: handler on %s raised %r", request.subject, exc)
            return Reply(headers=error_headers(exc))
        except Exception as exc:
            logger.exception("bus: handler on %s failed", request.subject)
            return Reply(headers=error_headers(exc))
        if isinstance(result, Reply):
            try:
                return Reply(result.body, check_user_headers(result.headers))
            except BusError as exc:
                logger.error("bus: handler on %s returned bad headers: %s", request.subject, exc)
                return Reply(headers=error_headers(exc))
        if isinstance(result, bytes | bytearray | memoryview):
            return Reply(bytes(result))
        logger.error("bus: handler on %s returned %s", request.subject, type(result).__name__)
        return Reply(headers=error_headers(TypeError("handler returned neither bytes nor Reply")))

    async def _send(self, reply_to: str, reply: Reply) -> None:
        if not reply_to:
            return  # a plain publish to a served subject: nobody waits for an answer
        size = len(reply.body) + headers_size_bytes(reply.headers)
        limit = self._max_payload_bytes()
        if size > limit:
            exc = PayloadTooLargeError(size_bytes=size, limit_bytes=limit)
            logger.error("bus: reply on %s dropped: %s", self.subject, exc)
            reply = Reply(headers=error_headers(exc))
        headers = {**reply.headers, **trace.bus_headers()} if reply.headers else trace.bus_headers()
        try:
            async with asyncio.timeout(self._publish_timeout_s):
                await self._publish(reply_to, reply.body, headers or None)
        except (BusError, TimeoutError) as exc:
            # The caller will time out and may retry; nothing else can be done from here.
            logger.warning("bus: reply on %s lost: %r", self.subject, exc)

    async def drain(self) -> None:
        """Stop taking requests, then wait for the queued and running ones to be answered,
        for ``drain_timeout_s`` at most: the handlers still running then are cancelled (their
        callers time out), so an owner's stop never waits on a stuck handler."""
        try:
            async with asyncio.timeout(self._drain_timeout_s):
                sub, self._sub = self._sub, None
                if sub is not None:
                    with contextlib.suppress(nats.errors.Error):  # closed already
                        await sub.drain()  # type: ignore[no-untyped-call]  # unannotated in nats-py
                if self._tasks:
                    await asyncio.wait(set(self._tasks))
        except TimeoutError:
            logger.warning(
                "bus: %d handlers on %s still running after %.0f s of draining: cancelled",
                len(self._tasks),
                self.subject,
                self._drain_timeout_s,
            )
            self.cancel()

    async def unsubscribe(self) -> None:
        """Stop taking requests now; cancel the handlers in flight (their callers time out)."""
        sub, self._sub = self._sub, None
        if sub is not None:
            with contextlib.suppress(nats.errors.Error):  # closed already: nothing left to take
                await sub.unsubscribe()
        self.cancel()
        if self._tasks:
            await asyncio.wait(set(self._tasks), timeout=self._publish_timeout_s)

    def cancel(self) -> None:
        """Cancel every handler in flight (used when a drain runs out of time)."""
        for task in self._tasks:
            task.cancel()


def _deadline_reply(subject: str) -> Reply:
    return Reply(headers=error_headers(DeadlineExceededError(subject)))

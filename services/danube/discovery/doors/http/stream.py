"""The consumer stream route: ``GET /v1/consumers/{id}/stream`` (WebSocket), push delivery
with credit-based flow control (docs/http-api.md, "Consume (WebSocket)"; frames and credits
in :mod:`danube.discovery.doors.http.stream_protocol`).

One stream is three tasks in one TaskGroup, all ended when any of them ends:

- ``receive`` reads client frames: a flow frame adds credits; an ack or nack goes to the
  dispatcher before the next frame is read, so they keep the client's order;
- ``pump`` long-polls the dispatcher for at most ``min(credits, POLL_BATCH_MAX)`` messages,
  only while credits remain, spends one credit per message and queues them for the writer;
  with no credits it only tells the dispatcher, now and then, that the consumer is alive.
  A client that asked for the ``danube.frames.v1`` subprotocol gets each poll's messages as
  one binary delivery batch (danube.wire.delivery: the frames as the WAL holds them, checked
  by the client); others get one JSON text frame per message;
- ``write`` is the one writer of the socket, draining a queue of ``SEND_QUEUE_BATCHES``
  batches: when the client reads slowly the pump waits on the full queue and stops polling.

Closing the socket does not detach the consumer: the client may reconnect with the same id
(``DELETE /v1/consumers/{id}`` detaches). Messages polled but not yet sent when the socket
closes are in flight at the dispatcher: they come again after ``dispatcher.ack_timeout_s``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from typing import TypeVar

from fastapi import APIRouter, WebSocket
from starlette.types import Message
from starlette.websockets import WebSocketDisconnect, WebSocketDisconnected

from danube.discovery import metrics
from danube.discovery.doors.http.consume import (
    full_names,
    message_ranges,
    messages_out,
    not_in_flight,
    parse_consumer_id,
)
from danube.discovery.doors.http.params import ConsumerId
from danube.discovery.doors.http.state import Services, services_of
from danube.discovery.doors.http.stream_protocol import (
    AckFrame,
    Credits,
    FlowFrame,
    NackFrame,
    error_frame,
    message_frame,
    parse_frame,
)
from danube.discovery.errors import (
    BadRequestError,
    OverLimitError,
    StreamProtocolError,
    error_body,
    http_status,
    ws_close_code,
)
from danube.errors import DanubeError
from danube.meta import TopicName
from danube.wire import codes, delivery

log = logging.getLogger(__name__)

router = APIRouter(prefix="/v1", tags=["consume"])

# Messages asked of the dispatcher in one poll at most (as a long poll may), and how long
# a poll waits for the first one: short, so a stream whose client left stops polling soon.
POLL_BATCH_MAX = 1000
POLL_WAIT_MS = 1000
# Polled batches waiting for the writer; the pump blocks when it is full. A poll reply
# fits one bus message, so a stream holds about this many replies (plus the one sending).
SEND_QUEUE_BATCHES = 2
# A frame the client does not take within this long (it reads nothing) ends the stream.
SEND_TIMEOUT_S = 30.0
# The error frame and close that end a stream, at most this long (the client may be gone).
CLOSE_TIMEOUT_S = 2.0

_T = TypeVar("_T")


class _StreamEnded(Exception):
    """Raised by a stream's task to end the stream: ``error`` is told to the client before
    the close, None when the client is gone (nothing left to tell). Control flow of the
    consumer streams (this module's and api/multi_session's), never answered: private."""

    def __init__(self, error: BaseException | None) -> None:
        super().__init__(repr(error))
        self.error = error


@router.websocket("/consumers/{cid}/stream")
async def stream(websocket: WebSocket, cid: ConsumerId) -> None:
    """Push the consumer's messages as the client grants credits; it acks and nacks on the
    same socket. Ends with an error frame and a close code when something goes wrong."""
    services = services_of(websocket)
    await run_stream(websocket, services, lambda frames: _serve(websocket, services, cid, frames))


async def run_stream(
    websocket: WebSocket,
    services: Services,
    serve: Callable[[bool], Awaitable[BaseException | None]],
) -> None:
    """Accept a consumer stream (binary delivery batches when the client asks for their
    subprotocol), refuse it as authentication decided (api/auth.py: 4401 / 4403) or past
    the instance's stream limit, else run ``serve(frames)`` holding a stream slot, and close
    with the error it ended with (None: the client left)."""
    frames = delivery.SUBPROTOCOL in websocket.scope.get("subprotocols", ())
    await websocket.accept(subprotocol=delivery.SUBPROTOCOL if frames else None)
    refusal = getattr(websocket.state, "refusal", None)
    if refusal is not None:
        await close_stream(websocket, refusal)
        return
    if not services.streams.try_take():
        limit = services.streams.limit
        refusal = OverLimitError(
            f"this instance holds {limit} streams open; retry later or elsewhere",
            code="too_many_streams",
        )
        await close_stream(websocket, refusal)
        return
    metrics.STREAMS_OPEN.inc()
    try:
        error = await serve(frames)
    finally:
        metrics.STREAMS_OPEN.dec()
        services.streams.give_back()
    if error is not None:
        await close_stream(websocket, error)


async def _serve(
    websocket: WebSocket, services: Services, cid: str, frames: bool
) -> BaseException | None:
    """Serve one stream; the error it ended with, None when the client left. ``frames``:
    messages go as binary delivery batches."""
    try:
        topic, sub, dispatcher_id = parse_consumer_id(cid)
        session = _Stream(websocket, services, topic, sub, dispatcher_id, frames)
        # An unknown consumer is told at once, not at the first credit.
        await session.touch()
        return await session.run()
    except (DanubeError, TimeoutError) as exc:
        return exc
    except Exception as exc:
        log.exception("consumer stream %s failed", cid[:200])
        return exc


async def close_stream(websocket: WebSocket, error: BaseException) -> None:
    """Tell the client why the stream ends (an error frame), then close with its code."""
    code = ws_close_code(error)
    if http_status(error) >= 500:
        log.warning("consumer stream closed with %d: %r", code, error)
    reason = error_body(error)["error"]["code"]
    with contextlib.suppress(WebSocketDisconnect, WebSocketDisconnected, TimeoutError):
        async with asyncio.timeout(CLOSE_TIMEOUT_S):
            await websocket.send_text(error_frame(error))
            await websocket.close(code, reason)


def _consumer_gone(exc: BaseException) -> bool:
    # consumer_detached: the dispatcher detached it for never acking (dispatcher.md).
    return isinstance(exc, DanubeError) and exc.code in (
        codes.CONSUMER_NOT_FOUND,
        "consumer_detached",
    )


def first_ended(group: BaseExceptionGroup[_StreamEnded]) -> _StreamEnded:
    first = group.exceptions[0]
    return first if isinstance(first, _StreamEnded) else first_ended(first)


class _Stream:
    """One open stream of one consumer: its credits, its send queue and its three tasks."""

    def __init__(
        self,
        websocket: WebSocket,
        services: Services,
        topic: TopicName,
        sub: str,
        dispatcher_id: str,
        frames: bool = False,
    ) -> None:
        self.websocket = websocket
        self.services = services
        self.frames = frames
        self.dispatcher = services.dispatcher
        self.keepalive_s = services.stream_keepalive_s
        self.topic = topic
        self.sub = sub
        self.dispatcher_id = dispatcher_id
        self.credits = Credits()
        self._granted = asyncio.Event()  # set by every flow frame; the pump waits on it
        self._outbox: asyncio.Queue[list[str | bytes]] = asyncio.Queue(maxsize=SEND_QUEUE_BATCHES)

    async def touch(self) -> None:
        """Tell the dispatcher the consumer is alive; ``consumer_not_found`` if it is not."""
        await self.dispatcher.touch(self.topic, self.sub, self.dispatcher_id)

    async def run(self) -> BaseException | None:
        """Serve until the client leaves (None) or an error ends the stream (returned)."""
        ended: _StreamEnded | None = None
        try:
            async with asyncio.TaskGroup() as tg:
                tg.create_task(self._receive(), name="stream-receive")
                tg.create_task(self._pump(), name="stream-pump")
                tg.create_task(self._write(), name="stream-write")
        except* _StreamEnded as group:
            ended = first_ended(group)
        if ended is None:
            raise AssertionError("the tasks of a stream end only by _StreamEnded")
        return ended.error

    # --- receive ---------------------------------------------------------------------------

    async def _receive(self) -> None:
        while True:
            # No deadline: an idle client is normal, and the server's pings (every 20 s,
            # 20 s to answer) close the connection of one that is gone.
            frame = parse_client_frame(await self.websocket.receive())
            if isinstance(frame, FlowFrame):
                try:
                    self.credits.grant(frame.credits)
                except StreamProtocolError as exc:
                    raise _StreamEnded(exc) from None
                self._granted.set()
            else:
                await self._acknowledge(frame)

    async def _acknowledge(self, frame: AckFrame | NackFrame) -> None:
        try:
            ranges = message_ranges(self.topic, frame)
            if isinstance(frame, NackFrame):
                await self.dispatcher.nack_ranges(
                    self.topic, self.sub, self.dispatcher_id, ranges, delay_ms=frame.delay_ms
                )
            else:
                ignored = await self.dispatcher.ack_ranges(
                    self.topic, self.sub, self.dispatcher_id, ranges
                )
                if ignored:
                    await self._outbox.put([error_frame(not_in_flight_error(self.topic, ignored))])
        except (DanubeError, TimeoutError) as exc:
            if _consumer_gone(exc):
                raise _StreamEnded(exc) from None
            # The stream goes on; messages whose ack failed stay unacked and come again.
            await self._outbox.put([error_frame(exc)])

    # --- pump ------------------------------------------------------------------------------

    async def _pump(self) -> None:
        while True:
            if self.credits.available == 0:
                await self._wait_for_credits()
                continue
            wanted = min(self.credits.available, POLL_BATCH_MAX)
            if self.frames:
                frames = await self._call(
                    self.dispatcher.poll_frames(
                        self.topic, self.sub, self.dispatcher_id, max=wanted, wait_ms=POLL_WAIT_MS
                    )
                )
                if not frames.size:
                    continue
                # Raises (a bug, the stream closes with 1011) rather than send past the credits.
                self.credits.spend(frames.size)
                body = delivery.rename_partitions(frames.body, full_names(self.topic))
                metrics.STREAM_MESSAGES.inc(frames.size)
                await self._outbox.put([body])
                continue
            polled = await self._call(
                self.dispatcher.poll(
                    self.topic, self.sub, self.dispatcher_id, max=wanted, wait_ms=POLL_WAIT_MS
                )
            )
            if not polled.messages:
                continue
            try:
                out = await self._call(
                    messages_out(self.services, self.topic, self.sub, self.dispatcher_id, polled)
                )
                texts: list[str | bytes] = [message_frame(m) for m in out]
            except DanubeError as exc:  # a record that does not decode
                raise _StreamEnded(exc) from None
            self.credits.spend(len(texts))
            metrics.STREAM_MESSAGES.inc(len(texts))
            await self._outbox.put(texts)

    async def _wait_for_credits(self) -> None:
        self._granted.clear()
        try:
            async with asyncio.timeout(self.keepalive_s):
                await self._granted.wait()
        except TimeoutError:
            # No poll is waiting for this consumer: without a word the dispatcher would
            # expire it after dispatcher.consumer_session_timeout_s.
            await self._call(self.touch())

    async def _call(self, call: Awaitable[_T]) -> _T:
        try:
            return await call
        except (DanubeError, TimeoutError) as exc:
            raise _StreamEnded(exc) from None

    # --- write -----------------------------------------------------------------------------

    async def _write(self) -> None:
        while True:
            for frame in await self._outbox.get():
                try:
                    async with asyncio.timeout(SEND_TIMEOUT_S):
                        if isinstance(frame, bytes):
                            await self.websocket.send_bytes(frame)
                        else:
                            await self.websocket.send_text(frame)
                except WebSocketDisconnect:
                    raise _StreamEnded(None) from None
                except TimeoutError:
                    log.info("consumer stream: the client took nothing for %.0f s", SEND_TIMEOUT_S)
                    raise _StreamEnded(None) from None


# Refs named in a not_in_flight error frame at most (the count is always given).
NOT_IN_FLIGHT_SHOWN = 20


def not_in_flight_error(topic: TopicName, refs: list[tuple[str, int]]) -> BadRequestError:
    """What an ``error`` frame tells of an ack that did nothing for ``refs``."""
    named = not_in_flight(topic, refs[:NOT_IN_FLIGHT_SHOWN])
    shown = ", ".join(f"{ref.partition}@{ref.offset}" for ref in named)
    more = f" and {len(refs) - len(named)} more" if len(refs) > len(named) else ""
    return BadRequestError(
        f"{len(refs)} acked messages were not in flight (never delivered, or dropped by a "
        f"seek): {shown}{more}",
        code="not_in_flight",
    )


def parse_client_frame(message: Message) -> FlowFrame | AckFrame | NackFrame:
    """The client frame of an ASGI WebSocket message; _StreamEnded when the client left or sent
    something that is not a frame."""
    if message["type"] == "websocket.disconnect":
        raise _StreamEnded(None)
    text = message.get("text")
    try:
        if text is None:
            raise StreamProtocolError("frames are JSON text, not binary")
        return parse_frame(text)
    except StreamProtocolError as exc:
        raise _StreamEnded(exc) from None

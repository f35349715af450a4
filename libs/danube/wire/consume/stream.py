"""The consumer stream, ``GET /v1/consumers/{id}/stream`` (WebSocket): push delivery with
credit-based flow control (docs/http-api.md, "Consume (WebSocket)"; frames and credits in
:mod:`danube.wire.consume.stream_protocol`), served alike by discovery (the dispatcher over
the bus) and by a dispatcher's consume door (in its own process): :class:`StreamDoor` says
which.

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
from dataclasses import dataclass
from typing import TypeVar

from prometheus_client import Counter, Gauge
from starlette.types import Message
from starlette.websockets import WebSocket, WebSocketDisconnect, WebSocketDisconnected

from danube.errors import BadRequestError, DanubeError, OverLimitError
from danube.meta import TopicName
from danube.runtime.held import Slots
from danube.wire import codes, delivery
from danube.wire.consume.ids import parse_consumer_id
from danube.wire.consume.messages import (
    ConsumerCalls,
    full_names,
    message_ranges,
    messages_out,
    not_in_flight,
)
from danube.wire.consume.stream_protocol import (
    AckFrame,
    Credits,
    FlowFrame,
    NackFrame,
    StreamProtocolError,
    error_frame,
    message_frame,
    parse_frame,
    ws_close_code,
)
from danube.wire.http_errors import error_body, http_status

log = logging.getLogger(__name__)

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
# Refs named in a not_in_flight error frame at most (the count is always given).
NOT_IN_FLIGHT_SHOWN = 20

_T = TypeVar("_T")


@dataclass(frozen=True)
class StreamDoor:
    """What serves a door's streams: the dispatcher's operations, the door's stream slots,
    how often a stream with no credits tells the dispatcher its consumer is alive, and the
    door's gauge of open streams and counter of messages pushed."""

    calls: ConsumerCalls
    slots: Slots
    keepalive_s: float
    open_streams: Gauge
    messages: Counter


class _StreamEnded(Exception):
    """Raised by a stream's task to end the stream: ``error`` is told to the client before
    the close, None when the client is gone (nothing left to tell). Control flow of the
    consumer streams (this module's and discovery's many-topics stream), never answered."""

    def __init__(self, error: BaseException | None) -> None:
        super().__init__(repr(error))
        self.error = error


async def run_stream(
    websocket: WebSocket,
    door: StreamDoor,
    serve: Callable[[bool], Awaitable[BaseException | None]],
    refusal: BaseException | None = None,
) -> None:
    """Accept a consumer stream (binary delivery batches when the client asks for their
    subprotocol), refuse it with ``refusal`` (authentication decided: 4401 / 4403) or past
    the door's stream limit, else run ``serve(frames)`` holding a stream slot, and close
    with the error it ended with (None: the client left)."""
    frames = delivery.SUBPROTOCOL in websocket.scope.get("subprotocols", ())
    await websocket.accept(subprotocol=delivery.SUBPROTOCOL if frames else None)
    if refusal is not None:
        await close_stream(websocket, refusal)
        return
    if not door.slots.try_take():
        limit = door.slots.limit
        refusal = OverLimitError(
            f"this door holds {limit} streams open; retry later or elsewhere",
            code="too_many_streams",
        )
        await close_stream(websocket, refusal)
        return
    door.open_streams.inc()
    try:
        error = await serve(frames)
    finally:
        door.open_streams.dec()
        door.slots.give_back()
    if error is not None:
        await close_stream(websocket, error)


async def serve_consumer(
    websocket: WebSocket, door: StreamDoor, cid: str, frames: bool
) -> BaseException | None:
    """Serve one consumer's stream; the error it ended with, None when the client left.
    ``frames``: messages go as binary delivery batches."""
    try:
        topic, sub, dispatcher_id = parse_consumer_id(cid)
        session = ConsumerStream(websocket, door, topic, sub, dispatcher_id, frames)
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


def consumer_gone(exc: BaseException) -> bool:
    """Whether ``exc`` says the consumer is gone (the stream cannot go on)."""
    # consumer_detached: the dispatcher detached it for never acking (dispatcher.md);
    # not_leader: the subscription left this consume door's dispatcher.
    return isinstance(exc, DanubeError) and exc.code in (
        codes.CONSUMER_NOT_FOUND,
        "consumer_detached",
        "not_leader",
    )


def first_ended(group: BaseExceptionGroup[_StreamEnded]) -> _StreamEnded:
    """The first _StreamEnded of a stream's task group."""
    first = group.exceptions[0]
    return first if isinstance(first, _StreamEnded) else first_ended(first)


class ConsumerStream:
    """One open stream of one consumer: its credits, its send queue and its three tasks."""

    def __init__(
        self,
        websocket: WebSocket,
        door: StreamDoor,
        topic: TopicName,
        sub: str,
        dispatcher_id: str,
        frames: bool = False,
    ) -> None:
        self.websocket = websocket
        self.door = door
        self.frames = frames
        self.dispatcher = door.calls
        self.keepalive_s = door.keepalive_s
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
            if consumer_gone(exc):
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
                self.door.messages.inc(frames.size)
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
                    messages_out(self.dispatcher, self.topic, self.sub, self.dispatcher_id, polled)
                )
                texts: list[str | bytes] = [message_frame(m) for m in out]
            except DanubeError as exc:  # a record that does not decode
                raise _StreamEnded(exc) from None
            self.credits.spend(len(texts))
            self.door.messages.inc(len(texts))
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
    """The client frame of an ASGI WebSocket message; _StreamEnded when the client left or
    sent something that is not a frame."""
    if message["type"] == "websocket.disconnect":
        raise _StreamEnded(None)
    text = message.get("text")
    try:
        if text is None:
            raise StreamProtocolError("frames are JSON text, not binary")
        return parse_frame(text)
    except StreamProtocolError as exc:
        raise _StreamEnded(exc) from None

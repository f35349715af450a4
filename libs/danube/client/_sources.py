"""Where a consumer's messages come from: the WebSocket stream with credits, or long-poll.

Each source fills the consumer's :class:`Inbox` until it is cancelled or fails for good.
Failures that may pass (a dispatcher that did not answer, a dropped connection, a server
restarting) are retried with jittered backoff for at most ``reconnect_timeout_s`` in a row;
``consumer_not_found`` (the consumer expired, or its dispatcher restarted and forgot it)
attaches again when ``reattach`` is on. Anything else ends the source: the error is put in
the inbox, and ``receive()`` raises it once the queued messages are taken.

**Credits** (stream): ``len(inbox) + outstanding credits <= capacity`` at all times. A new
socket starts with no credits; the source grants the room left (``capacity - len(inbox)``) and
grants again whenever at least half the capacity is free, like Pulsar's permits.

**Where**: the consume door of the subscription's owner, as the last attach named it, else
the client's server (danube.client._consume_route); a door that fails a poll or a socket
(421 ``not_leader``, no answer, 502-504) is left at once, without a backoff, for the
client's server.

**Transport**: ``binary`` (the default) asks for delivery batches (``Accept:
application/x-danube-frames`` on a poll, the ``danube.frames.v1`` subprotocol on a stream):
many messages per answer or WebSocket message, frames as the WAL holds them, checked here
(danube.client._frames). A server that does not offer them answers JSON, which is read as
before; ``json`` asks for JSON only.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import orjson
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidStatus
from websockets.typing import Subprotocol

from danube.client._consume_route import ConsumeRoute, routed
from danube.client._frames import FrameChecker, decode_frames_batch
from danube.client._http import HttpCore
from danube.client._inbox import Inbox
from danube.client._session import Session
from danube.client.errors import (
    WS_SERVICE_RESTART,
    ClientError,
    ProtocolError,
    TransportError,
    api_error,
    error_from_body,
    status_of_close,
)
from danube.client.messages import ReceivedMessage, decode_message
from danube.client.retry import RetryPolicy
from danube.tasks import TaskSet
from danube.wire import codes
from danube.wire.delivery import MEDIA_TYPE, SUBPROTOCOL

log = logging.getLogger(__name__)

# The server takes at most this many messages per poll, and per flow frame.
POLL_MAX = 1000
CREDITS_MAX = 10_000
# A message frame holds a payload (512 KiB by default, 4/3 of it as base64), a key and up
# to 64 attributes of 4 KiB: 4 MiB leaves room for a server with larger limits.
MAX_FRAME_BYTES = 4 * 1024 * 1024
# How long the handshake, and the close, may take.
OPEN_TIMEOUT_S = 10.0
CLOSE_TIMEOUT_S = 2.0
# Closes after which a new socket (same consumer id) is likely to work.
_CLOSES_RETRIED = frozenset({1000, 1001, 1006, WS_SERVICE_RESTART})
SUBSCRIPTION_TAKEN = codes.SUBSCRIPTION_TAKEN


class Recovery:
    """The retry budget of a source: failures in a row for at most ``timeout_s``."""

    def __init__(self, policy: RetryPolicy, timeout_s: float, *, reattach: bool) -> None:
        self.policy = policy
        self.timeout_s = timeout_s
        self.reattach = reattach
        self._attempt = 0
        self._failing_since: float | None = None

    def healthy(self) -> None:
        """Messages flow again: backoff and budget start over at the next failure."""
        self._attempt = 0
        self._failing_since = None

    def connected(self) -> None:
        """A socket opened: the budget starts over (the backoff keeps growing until a
        message comes, so a server that accepts and closes at once is not hammered)."""
        self._failing_since = None

    async def after(self, error: ClientError) -> bool:
        """Wait before the next try and return whether it should attach again first;
        raise ``error`` when the source should give up."""
        loop = asyncio.get_running_loop()
        if self._failing_since is None:
            self._failing_since = loop.time()
        again = error.code == codes.CONSUMER_NOT_FOUND and self.reattach
        if not (again or error.retriable) or loop.time() - self._failing_since > self.timeout_s:
            raise error
        delay = self.policy.delay_s(self._attempt)
        self._attempt += 1
        log.info("consumer source: %s; again in %.2f s", error, delay)
        await asyncio.sleep(delay)
        return again


Fill = Callable[[str], Awaitable[None]]


async def run_source(fill: Fill, session: Session, inbox: Inbox, recovery: Recovery) -> None:
    """Run ``fill(consumer_id)`` (one poll, or one socket's life) over and over, recovering
    from its failures (attaching again after ``consumer_not_found``); the failure it does
    not recover from goes to the inbox."""
    reattach = False
    while True:
        attaching = reattach
        try:
            if reattach:
                await session.reattach(session.consumer_id)
                reattach = attaching = False
            await fill(session.consumer_id)
        except ClientError as error:
            if attaching and error.code == SUBSCRIPTION_TAKEN:
                # The server said it does not know this consumer, yet its exclusive
                # subscription is still held (by this consumer's old attachment, while the
                # subscription is being taken over): its views differ for a moment. Poll with
                # the old id again, and attach again only if it is really gone.
                error = ClientError(error.message, code=error.code, retriable=True)
                reattach = False
            try:
                reattach = await recovery.after(error) or reattach
            except ClientError as final:
                log.warning("consumer %s: source ended: %s", session.consumer_id, final)
                inbox.fail(final)
                return
        except Exception as bug:
            # Never leave receive() waiting on a source that is gone.
            log.exception("consumer %s: source failed", session.consumer_id)
            inbox.fail(bug)
            return


class PollSource:
    """Long-poll ``GET /v1/consumers/{id}/messages`` for the inbox's free room."""

    def __init__(
        self,
        http: HttpCore | ConsumeRoute,
        inbox: Inbox,
        consumer: FrameChecker,
        recovery: Recovery,
        *,
        wait_ms: int,
        binary: bool = True,
    ) -> None:
        self.route = routed(http)
        self.inbox = inbox
        self.consumer = consumer
        self.recovery = recovery
        self.wait_ms = wait_ms
        self.binary = binary

    async def fill(self, consumer_id: str) -> None:
        """One poll: wait for room, ask for that many, queue what comes. A consume door
        that fails it (docs/client.md, "Direct consume") is left: the next poll, at once,
        goes through discovery."""
        while self.inbox.free == 0:
            await self.inbox.wait_taken()
        http = self.route.http
        try:
            answer = await http.request(
                "GET",
                f"/v1/consumers/{consumer_id}/messages",
                params={"max": min(self.inbox.free, POLL_MAX), "wait_ms": self.wait_ms},
                # The server may hold the poll wait_ms, then take 2 s to reach the dispatcher.
                timeout_s=self.wait_ms / 1000 + http.timeout_s,
                accept=MEDIA_TYPE if self.binary else None,
            )
        except ClientError as error:
            if self.route.fall_back(error, http):
                return
            raise
        body = answer.body
        if isinstance(body, bytes):
            self.recovery.healthy()
            self.inbox.put_many(decode_frames_batch(body, self.consumer)[0])
            return
        messages = body.get("messages") if isinstance(body, dict) else None
        if not isinstance(messages, list):
            raise ProtocolError(f"poll answered {body!r:.200}")
        self.recovery.healthy()
        for data in messages:
            self.inbox.put(decode_message(data, self.consumer))


class StreamSource:
    """``GET /v1/consumers/{id}/stream``: messages pushed as credits allow."""

    def __init__(
        self,
        http: HttpCore | ConsumeRoute,
        inbox: Inbox,
        consumer: FrameChecker,
        recovery: Recovery,
        *,
        binary: bool = True,
    ) -> None:
        self.route = routed(http)
        self.inbox = inbox
        self.consumer = consumer
        self.recovery = recovery
        self.binary = binary
        self.outstanding = 0  # credits granted on the current socket, not yet spent
        # Credits are granted when at least this many are due (half the queue).
        self.threshold = max(1, inbox.capacity // 2)
        self._room = asyncio.Event()  # set when enough room to grant credits freed up
        # The credit granter of the socket open now. A granter that fails (a bug: a closed
        # socket ends it quietly) fails the consumer, whose stream would otherwise stall
        # for want of credits with the socket still open.
        self._tasks = TaskSet("consumer stream", on_failure=lambda _, error: inbox.fail(error))

    def taken(self) -> None:
        """The application took a message from the inbox: wake the granting task once
        there is enough room to grant (not on every message: a task switch each)."""
        if self.inbox.free - self.outstanding >= self.threshold:
            self._room.set()

    async def fill(self, consumer_id: str) -> None:
        """One socket's life; ends with the ClientError that closed it, or returns when a
        consume door failed it (the next socket, at once, goes through discovery)."""
        http = self.route.http
        try:
            await self._socket(http, consumer_id)
        except ClientError as error:
            if self.route.fall_back(error, http):
                return
            raise

    async def _socket(self, http: HttpCore, consumer_id: str) -> None:
        url = http.ws_url(f"/v1/consumers/{consumer_id}/stream")
        try:
            # No compression: on the loopback and in a LAN it costs more CPU than it saves.
            async with connect(
                url,
                proxy=None,
                compression=None,
                open_timeout=OPEN_TIMEOUT_S,
                close_timeout=CLOSE_TIMEOUT_S,
                max_size=MAX_FRAME_BYTES,
                # wss://: the client's TLS context (CA, client certificate), else the
                # default one (True); ws:// takes none.
                ssl=(http.ssl_context or True) if url.startswith("wss://") else None,
                additional_headers=http.auth_headers,
                subprotocols=[Subprotocol(SUBPROTOCOL)] if self.binary else None,
            ) as ws:
                self.outstanding = 0
                self.recovery.connected()
                error = await self._serve(ws)
        except InvalidStatus as exc:
            status = exc.response.status_code
            body = _json_or_none(exc.response.body)
            raise error_from_body(status, body, fallback="stream refused") from exc
        except (OSError, InvalidHandshake, TimeoutError) as exc:
            raise TransportError(f"stream {url}: {exc!r}") from exc
        raise error

    async def _serve(self, ws: ClientConnection) -> ClientError:
        last_error: dict[str, Any] | None = None
        granting = self._tasks.spawn(self._grant(ws), name="stream-credits")
        try:
            async for raw in ws:
                if isinstance(raw, bytes):  # a delivery batch (danube.frames.v1)
                    delivered = self._batch(raw)
                    self.inbox.put_many(delivered)
                    if delivered:
                        self.recovery.healthy()
                        if self.inbox.hold:
                            # Kept ones (delayed, early) left the queue's room free: the
                            # credits they spent are granted again now, not at a take.
                            self.taken()
                    continue
                try:
                    frame = orjson.loads(raw)
                except orjson.JSONDecodeError as exc:
                    raise ProtocolError(f"stream frame is not JSON: {raw!r:.200}") from exc
                kind = frame.get("type") if isinstance(frame, dict) else None
                if kind == "message":
                    self.outstanding -= 1
                    self.inbox.put(decode_message(frame, self.consumer))
                    self.recovery.healthy()
                    if self.inbox.hold:
                        self.taken()
                elif kind == "error" and isinstance(frame.get("error"), dict):
                    last_error = frame["error"]
                    log.info("consumer stream error frame: %s", last_error)
                else:
                    raise ProtocolError(f"unknown stream frame {raw!r:.200}")
        except ConnectionClosed:
            pass
        finally:
            await self._tasks.cancel(granting)
        return _close_error(ws.close_code, ws.close_reason or "", last_error)

    def _batch(self, raw: bytes) -> list[ReceivedMessage]:
        messages, sent = decode_frames_batch(raw, self.consumer)
        # Every message of the batch spent a credit, the corrupt ones (nacked) too.
        self.outstanding -= sent
        return messages

    async def _grant(self, ws: ClientConnection) -> None:
        while True:
            # Cleared before the room is read: a message taken from here on wakes us again.
            self._room.clear()
            room = min(CREDITS_MAX, self.inbox.free - self.outstanding)
            if room >= self.threshold:
                # Counted before the send, so that taken() meanwhile sees them granted.
                self.outstanding += room
                try:
                    await ws.send(orjson.dumps({"type": "flow", "credits": room}).decode())
                except ConnectionClosed:
                    return  # the reader sees the same close, and reports it
                continue
            await self._room.wait()


def _json_or_none(body: bytes | bytearray | None) -> Any:
    try:
        return orjson.loads(body) if body else None
    except orjson.JSONDecodeError:
        return None


def _close_error(code: int | None, reason: str, frame: dict[str, Any] | None) -> ClientError:
    """The error a socket closed with: the server's error frame when it sent one."""
    code = 1006 if code is None else code
    if frame is not None and isinstance(frame.get("code"), str):
        error = api_error(status_of_close(code), frame["code"], str(frame.get("message", "")))
        if code == WS_SERVICE_RESTART:
            error.retriable = True
        return error
    if code in _CLOSES_RETRIED:
        return TransportError(f"stream closed ({code} {reason})".strip())
    return api_error(status_of_close(code), reason or f"ws_{code}", f"stream closed with {code}")

"""The consume door of a dispatcher (DESIGN §10, docs/http-api.md "Direct consume"): the
consumer-id routes of the subscriptions this dispatcher owns, served in its own process with
no hop through discovery or the bus, with discovery's bodies and answers
(danube.wire.consume):

    GET    /v1/consumers/{cid}/messages   long poll (JSON, or Accept: delivery batches)
    POST   /v1/consumers/{cid}/ack        204, or 200 naming the refs not in flight
    POST   /v1/consumers/{cid}/nack       204
    DELETE /v1/consumers/{cid}            204
    GET    /v1/consumers/{cid}/stream     WebSocket, credits (danube.wire.consume.stream)

Attach stays on discovery (it creates topics, checks policies, claims the subscription);
its answer names this door's ``url`` when this dispatcher owns the subscription.

The checks, in order (the first refusal answers):

1. the path and the method (404, 405);
2. who asks: a bearer token or the client certificate (401), with security on;
3. the consumer id (400 ``invalid_consumer_id``), then ``consume`` on its topic (403): the
   decision discovery's guard takes for these routes (danube.security.gate);
4. the door's limits: ``dispatcher.data_max_inflight`` requests at once (429),
   ``data_max_streams`` streams (4429), ``data_body_bytes_max`` bytes of body (413);
5. whether this dispatcher owns the subscription: 421 ``not_leader`` (its owner's door in
   ``Danube-Leader-Url`` when etcd names one) — the client goes back to discovery.

A stream refused at 2 or 3 is accepted, told why in an error frame and closed (4401, 4403,
4400), as discovery's; a stream whose subscription leaves this dispatcher ends with 4421.
"""

from __future__ import annotations

import asyncio
import logging
import re
from urllib.parse import parse_qs

import orjson
from starlette.types import Receive, Scope, Send
from starlette.websockets import WebSocket

from danube.config import DanubeSettings
from danube.dispatcher import metrics
from danube.dispatcher.local_consume import LocalConsumers
from danube.errors import (
    BadRequestError,
    DanubeError,
    NotFoundError,
    OverLimitError,
)
from danube.meta import TopicName
from danube.runtime.door import (
    DOOR_START_S,
    DOOR_STOP_S,
    JSON,
    Answer,
    Listening,
    error_answer,
    header,
    principal,
    read_body,
    send_answer,
)
from danube.runtime.held import Slots
from danube.runtime.http import AsgiServer, advertised_url
from danube.runtime.service import NodeSession
from danube.security import Permission, Resource, SecurityError
from danube.security.gate import SecurityGate
from danube.tasks import TaskSet
from danube.wire import delivery
from danube.wire.consume.ids import parse_consumer_id
from danube.wire.consume.messages import (
    POLL_MAX_MESSAGES,
    POLL_WAIT_MS_MAX,
    full_names,
    message_ranges,
    messages_out,
    not_in_flight,
    wants_frames,
)
from danube.wire.consume.models import AckResult, MessagesOut, parse_ack_body
from danube.wire.consume.stream import StreamDoor, run_stream, serve_consumer

log = logging.getLogger(__name__)

_ROUTE = re.compile(r"/v1/consumers/([^/]+)(/messages|/ack|/nack|/stream)?")
_METHODS = {"/messages": "GET", "/ack": "POST", "/nack": "POST", None: "DELETE"}
_OPS = {"/messages": "poll", "/ack": "ack", "/nack": "nack", None: "detach"}
_BODY_SETTING = "dispatcher.data_body_bytes_max"


class ConsumeDoor:
    """The ASGI app of a dispatcher's consume listener."""

    def __init__(
        self, settings: DanubeSettings, calls: LocalConsumers, security: SecurityGate
    ) -> None:
        config = settings.dispatcher
        self.calls = calls
        self.security = security
        self.body_bytes_max = config.data_body_bytes_max
        self.timeout_s = config.data_timeout_s
        self._inflight = 0
        self._inflight_max = config.data_max_inflight
        self.streams = StreamDoor(
            calls=calls,
            slots=Slots(config.data_max_streams),
            keepalive_s=config.consumer_session_timeout_s / 3,
            open_streams=metrics.DOOR_STREAMS_OPEN,
            messages=metrics.DOOR_MESSAGES,
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "websocket":
            await self._stream(scope, receive, send)
            return
        if scope["type"] != "http":  # lifespan: nothing served
            return
        try:
            answer = await self._answer(scope, receive)
        except Exception as exc:
            answer = error_answer(exc, "consume door", metrics.DOOR_REFUSALS)
        await send_answer(send, answer)

    async def _answer(self, scope: Scope, receive: Receive) -> Answer:
        match = _ROUTE.fullmatch(scope["path"])
        if match is None or match[2] == "/stream":
            raise NotFoundError(f"no route {scope['path'][:200]} on a consume door")
        tail = match[2]
        method = _METHODS[tail]
        if scope["method"] != method:
            body = orjson.dumps(
                {"error": {"code": "method_not_allowed", "message": f"{method} only"}}
            )
            return 405, body, JSON, {"Allow": method}
        topic, sub, dispatcher_id = self._authorized(scope, match[1])
        if self._inflight >= self._inflight_max:
            raise OverLimitError("too many requests in flight on this consume door; retry")
        self._inflight += 1
        try:
            metrics.DOOR_REQUESTS.labels(_OPS[tail]).inc()
            if tail == "/messages":
                return await self._poll(scope, topic, sub, dispatcher_id)
            async with asyncio.timeout(self.timeout_s):
                if tail is None:
                    await self.calls.detach(topic, sub, dispatcher_id)
                    return 204, b"", JSON, None
                body = await read_body(receive, self.body_bytes_max, _BODY_SETTING)
                return await self._acknowledge(tail == "/nack", topic, sub, dispatcher_id, body)
        finally:
            self._inflight -= 1

    def _authorized(self, scope: Scope, cid: str) -> tuple[TopicName, str, str]:
        """Who asks (401), the consumer id (400), ``consume`` on its topic (403): the order
        of discovery's guard."""
        who = principal(self.security, scope)
        topic, sub, dispatcher_id = parse_consumer_id(cid)
        action = f"{scope.get('method', 'WEBSOCKET')} /v1/consumers/{{cid}} (consume door)"
        self.security.authorize(who, Permission.Consume, Resource.topic(topic), action=action)
        return topic, sub, dispatcher_id

    async def _poll(self, scope: Scope, topic: TopicName, sub: str, dispatcher_id: str) -> Answer:
        max_, wait_ms = _poll_params(scope["query_string"])
        accept = header(scope, b"accept")
        async with asyncio.timeout(self.timeout_s + wait_ms / 1000):
            if wants_frames(accept):
                frames = await self.calls.poll_frames(
                    topic, sub, dispatcher_id, max=max_, wait_ms=wait_ms
                )
                metrics.DOOR_MESSAGES.inc(frames.size)
                body = delivery.rename_partitions(frames.body, full_names(topic))
                return 200, body, delivery.MEDIA_TYPE, None
            batch = await self.calls.poll(topic, sub, dispatcher_id, max=max_, wait_ms=wait_ms)
            out = await messages_out(self.calls, topic, sub, dispatcher_id, batch)
        metrics.DOOR_MESSAGES.inc(len(out))
        return 200, MessagesOut(messages=out).model_dump_json().encode(), JSON, None

    async def _acknowledge(
        self, nack: bool, topic: TopicName, sub: str, dispatcher_id: str, body: bytes
    ) -> Answer:
        request = parse_ack_body(body)
        ranges = message_ranges(topic, request)
        if nack:
            await self.calls.nack_ranges(
                topic, sub, dispatcher_id, ranges, delay_ms=request.delay_ms
            )
            return 204, b"", JSON, None
        ignored = await self.calls.ack_ranges(topic, sub, dispatcher_id, ranges)
        if not ignored:
            return 204, b"", JSON, None
        result = AckResult(not_in_flight=not_in_flight(topic, ignored))
        return 200, result.model_dump_json().encode(), JSON, None

    async def _stream(self, scope: Scope, receive: Receive, send: Send) -> None:
        match = _ROUTE.fullmatch(scope["path"])
        if match is None or match[2] != "/stream":
            # Refused before the handshake completes: the client sees HTTP 403.
            await send({"type": "websocket.close", "code": 1008})
            return
        websocket = WebSocket(scope, receive, send)
        cid = match[1]
        refusal: DanubeError | None = None
        try:
            self._authorized(scope, cid)
        except (SecurityError, BadRequestError) as exc:
            refusal = exc
        metrics.DOOR_REQUESTS.labels("stream").inc()
        door = self.streams
        await run_stream(
            websocket, door, lambda frames: serve_consumer(websocket, door, cid, frames), refusal
        )


def _poll_params(query_string: bytes) -> tuple[int, int]:
    """``max`` (1..1000, 100) and ``wait_ms`` (0..30 000, 1000) of a poll's query."""
    query = parse_qs(query_string.decode("latin-1"))
    return (
        _int_param(query, "max", 100, 1, POLL_MAX_MESSAGES),
        _int_param(query, "wait_ms", 1000, 0, POLL_WAIT_MS_MAX),
    )


def _int_param(query: dict[str, list[str]], name: str, default: int, low: int, high: int) -> int:
    values = query.get(name)
    if not values:
        return default
    text = values[-1]
    if not text.isdigit() or not low <= int(text) <= high:
        raise BadRequestError(
            f"query.{name}: an integer in {low}..{high}, not {text[:20]!r}", code="invalid_request"
        )
    return int(text)


class OpenDoor(Listening):
    """A consume door serving: its listener and its view of the security policy."""

    def __init__(self, server: AsgiServer, serving: asyncio.Task[None], gate: SecurityGate) -> None:
        super().__init__(server, serving)
        self._tasks = TaskSet("consume door")
        if gate.enabled:
            self._tasks.spawn(gate.follow_keys(), name="security-keys")

    def follow(self, revision: int, gate: SecurityGate) -> None:
        """Keep the roles and bindings current from ``revision`` (the gate's load)."""
        self._tasks.spawn(gate.follow(revision), name="security")

    async def close(self) -> None:
        """Stop taking requests (those in progress are answered), then the views."""
        await super().close()
        await self._tasks.close(timeout_s=DOOR_STOP_S)


async def open_door(
    settings: DanubeSettings, session: NodeSession, calls: LocalConsumers
) -> tuple[OpenDoor, str]:
    """Listen on ``dispatcher.data_port`` with the section's limits and TLS, the security
    policy loaded first; advertise the door's URL in the node's registration. The door and
    its URL (attach answers name it)."""
    config = settings.dispatcher
    gate = SecurityGate.from_config(
        settings.security,
        session.store,
        authn_failed=metrics.AUTHN_FAILED,
        authz_denied=metrics.AUTHZ_DENIED,
    )
    revision = await gate.load()
    door = ConsumeDoor(settings, calls, gate)
    server = AsgiServer(door, config.host, config.data_port, config, listener="data")
    serving = session.tasks.create_task(server.serve(), name="consume-door")
    await server.wait_started(serving, DOOR_START_S)
    url = config.data_advertised_url or advertised_url(config, server.port)
    await session.advertise(url)
    opened = OpenDoor(server, serving, gate)
    opened.follow(revision, gate)
    log.info("dispatcher %s: consume door at %s", session.node_id, url)
    return opened, url

"""The plain ASGI layer of the public API (:class:`ApiFront`): the trace id, the Host check,
the request body limit and request metrics, in one pass.

The trace id (danube.trace) comes from the request's ``traceparent`` or ``x-request-id``
header, else is made here; it is bound for the whole request, so every log line of it and
every bus message it sends carry it, and it is echoed in the ``X-Request-Id`` response header
(and the WebSocket handshake's accept).

The Host check refuses a request whose ``Host`` header names a host that is not allowed
(``discovery.allowed_hosts``): a web page whose DNS name was rebound to this address sends
its own name, so it cannot drive a local API. Health and metrics stay open to any name
(probes and scrapers address a node by its IP).

The body limit answers 413 from the ``Content-Length`` header before any byte is read, and
also counts the bytes of a body sent without one (chunked), failing the read once past the
limit, so no handler ever holds more than ``max_body_bytes`` of a request.

Both answer before the app runs, with the error body and status of
:mod:`danube.discovery.errors` (the one map).
"""

from __future__ import annotations

import orjson
from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from danube import trace
from danube.discovery import metrics
from danube.discovery.doors.http.content_encoding import (
    check_encoding,
    content_encoding,
    decoded_scope,
    inflate,
)
from danube.discovery.doors.http.produce import (
    PRODUCE_TEMPLATE,
    answer_headers,
    fast_produce,
    is_fast_produce,
    is_produce,
)
from danube.discovery.doors.http.state import Services
from danube.discovery.errors import (
    BadRequestError,
    TooLargeError,
    error_body,
    http_status,
)
from danube.errors import DanubeError

# Open to any Host: what probes and scrapers ask for.
UNCHECKED_PATHS = frozenset({"/healthz", "/readyz", "/metrics"})


async def _send_error(send: Send, error: Exception) -> None:
    body = orjson.dumps(error_body(error))
    await send(
        {
            "type": "http.response.start",
            "status": http_status(error),
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                (b"connection", b"close"),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


def _too_large(limit_bytes: int) -> TooLargeError:
    return TooLargeError(
        f"request body over the limit of {limit_bytes} bytes",
        code="body_too_large",
        limit=limit_bytes,
    )


def host_name(header: bytes) -> str:
    """The host of a ``Host`` header, lowercase, without its port (``[::1]:80`` -> ``::1``)."""
    host = header.decode("latin-1").strip().lower()
    if host.startswith("["):
        return host[1:].partition("]")[0]
    if host.count(":") == 1:
        return host.partition(":")[0]
    return host


_TRACE_HEADERS = (trace.TRACEPARENT_HEADER.encode(), trace.HTTP_HEADER.encode())
_ECHO_HEADER = trace.HTTP_HEADER.encode()


def _trace_headers(scope: Scope) -> dict[str, str]:
    return {
        name.decode("latin-1"): value.decode("latin-1")
        for name, value in scope["headers"]
        if name in _TRACE_HEADERS
    }


class ApiFront:
    """The one ASGI layer around the app: the Host check, the body limit and request metrics
    in one pass (three nested layers cost a coroutine and a closure each per request).

    Refuses requests and WebSocket upgrades whose ``Host`` is not in ``allowed`` (None: any
    is) with 400 ``host_not_allowed`` (a WebSocket: closed before it opens, 403); request
    bodies over ``limit_bytes`` with 413 ``body_too_large``; counts every answered request by
    method, route template and status, these refusals included."""

    def __init__(
        self,
        app: ASGIApp,
        *,
        allowed: frozenset[str] | None,
        limit_bytes: int,
        services: Services | None = None,
    ) -> None:
        """``services``: serve produce requests with JSON bodies here
        (:func:`~danube.discovery.doors.http.produce.fast_produce`); None: all go to ``app``."""
        self.app = app
        self.allowed = allowed
        self.limit_bytes = limit_bytes
        self.services = services

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        kind = scope["type"]
        if kind == "http":
            trace_id = trace.incoming(_trace_headers(scope))
            with trace.bound(trace_id):
                await self._serve_http(scope, receive, send, trace_id.encode())
        elif kind == "websocket":
            trace_id = trace.incoming(_trace_headers(scope))
            with trace.bound(trace_id):
                await self._serve_websocket(scope, receive, send, trace_id.encode())
        else:
            await self.app(scope, receive, send)

    async def _serve_websocket(
        self, scope: Scope, receive: Receive, send: Send, trace_id: bytes
    ) -> None:
        if self._host_refusal(scope) is not None:
            await send({"type": "websocket.close", "code": 1008})
            return
        echoed = (_ECHO_HEADER, trace_id)

        async def send_with_id(message: Message) -> None:
            if message["type"] == "websocket.accept":
                message = {**message, "headers": [*message.get("headers", []), echoed]}
            await send(message)

        await self.app(scope, receive, send_with_id)

    async def _serve_http(
        self, scope: Scope, receive: Receive, send: Send, trace_id: bytes
    ) -> None:
        status = 500
        template: str | None = None

        # One wrapper of ``send`` for everything but a fast produce (which answers itself):
        # the trace id echoed, the status kept for the metrics.
        async def answer(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
                headers = [*message.get("headers", []), (_ECHO_HEADER, trace_id)]
                message = {**message, "headers": headers}
            await send(message)

        try:
            refusal: Exception | None = self._host_refusal(scope)
            declared = _content_length(scope) if refusal is None else None
            if refusal is None and declared is not None and declared > self.limit_bytes:
                refusal = _too_large(self.limit_bytes)
            encoding = content_encoding(scope) if refusal is None else None
            if refusal is not None:
                await _send_error(answer, refusal)
            elif encoding is not None:
                served = await self._serve_encoded(scope, encoding, receive, send, answer, trace_id)
                if served is not None:
                    status = served
                if is_produce(scope):  # the route saw a scope of its own: name it here
                    template = PRODUCE_TEMPLATE
            elif (
                self.services is not None
                and declared is not None
                and declared >= 0
                and is_fast_produce(scope)
            ):
                answered = await self._fast_produce(self.services, scope, receive, send, trace_id)
                if isinstance(answered, int):
                    status, template = answered, PRODUCE_TEMPLATE
                else:
                    await self._replay(scope, answered, receive, answer)
            elif declared is not None and declared >= 0:
                # The server delivers no more than the declared length: nothing to count.
                await self.app(scope, receive, answer)
            else:
                await self.app(scope, self._limited(receive), answer)
        finally:
            if template is None:
                template = getattr(scope.get("route"), "path", None) or "unmatched"
            metrics.HTTP_REQUESTS.labels(scope["method"], template, str(status)).inc()

    async def _serve_encoded(
        self,
        scope: Scope,
        encoding: str,
        receive: Receive,
        send: Send,
        answer: Send,
        trace_id: bytes,
    ) -> int | None:
        """A request with a ``Content-Encoding`` (danube.discovery.doors.http.content_encoding): a
        produce's body read whole (within the limit), inflated within the limit, then served
        as if sent so; anything else refused. The status when answered here as a fast
        produce, else None (``answer`` carried the answer)."""
        try:
            check_encoding(encoding, produce=is_produce(scope))
            # Read whole, counted: a chunked body (no Content-Length) was not refused above.
            received: list[Message] = []
            size = 0
            while not received or (
                received[-1]["type"] == "http.request" and received[-1].get("more_body")
            ):
                received.append(await receive())
                size += len(received[-1].get("body", b""))
                if size > self.limit_bytes:
                    raise _too_large(self.limit_bytes)
            if received[-1]["type"] != "http.request":
                return None  # the client went away
            raw = b"".join(m.get("body", b"") for m in received)
            body = inflate(encoding, raw, limit_bytes=self.limit_bytes)
        except DanubeError as exc:  # the body over its limit, or its encoding refused
            await _send_error(answer, exc)
            return None
        scope = decoded_scope(scope, len(body))
        decoded: list[Message] = [{"type": "http.request", "body": body, "more_body": False}]
        if self.services is not None and is_fast_produce(scope):

            async def receive_decoded() -> Message:
                return decoded.pop() if decoded else await receive()

            answered = await self._fast_produce(
                self.services, scope, receive_decoded, send, trace_id
            )
            if isinstance(answered, int):
                return answered
            decoded = answered
        await self._replay(scope, decoded, receive, answer)
        return None

    async def _fast_produce(
        self, services: Services, scope: Scope, receive: Receive, send: Send, trace_id: bytes
    ) -> int | list[Message]:
        """Answer a produce here and return its status, or return the messages read so far
        when the app must answer it (:meth:`_replay`)."""
        message = await receive()
        received = [message]
        while message["type"] == "http.request" and message.get("more_body", False):
            message = await receive()
            received.append(message)
        answer = None
        if message["type"] == "http.request":
            if len(received) == 1:
                body = message.get("body", b"")
            else:
                body = b"".join(m.get("body", b"") for m in received)
            answer = await fast_produce(services, scope, body)
        if answer is None:
            return received
        status, body, extra = answer
        headers = answer_headers(body, extra)
        headers.append((_ECHO_HEADER, trace_id))
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body})
        return status

    async def _replay(
        self, scope: Scope, received: list[Message], receive: Receive, send: Send
    ) -> None:
        """Hand a produce :meth:`_fast_produce` did not answer to the app, its body replayed."""
        replay = iter(received)

        async def replay_receive() -> Message:
            return next(replay, None) or await receive()

        await self.app(scope, replay_receive, send)

    def _host_refusal(self, scope: Scope) -> BadRequestError | None:
        if self.allowed is None or scope["path"] in UNCHECKED_PATHS:
            return None
        headers = [value for name, value in scope["headers"] if name == b"host"]
        host = host_name(headers[0]) if len(headers) == 1 else None
        if host in self.allowed:
            return None
        shown = "no Host header" if host is None else f"Host {host[:100]!r}"
        return BadRequestError(
            f"{shown} is not allowed (discovery.allowed_hosts)", code="host_not_allowed"
        )

    def _limited(self, receive: Receive) -> Receive:
        """``receive`` failing once a body sent without a length (chunked) passes the limit."""
        limit_bytes = self.limit_bytes
        seen = 0

        async def limited_receive() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > limit_bytes:
                    # FastAPI re-raises an HTTPException met while reading the body; the
                    # app's handler turns it into our error body.
                    raise HTTPException(413, f"request body over {limit_bytes} bytes")
            return message

        return limited_receive


def _content_length(scope: Scope) -> int | None:
    """The declared body length; None without the header, -1 when it is not a number."""
    for name, value in scope["headers"]:
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return -1
    return None

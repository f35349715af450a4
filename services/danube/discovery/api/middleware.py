"""Plain ASGI middleware of the public API: the trace id, the Host check, the request body
limit and request metrics.

The trace id (danube.trace) comes from the request's ``traceparent`` or ``x-request-id``
header, else is made here; it is bound for the whole request, so every log line of it and
every bus message it sends carry it, and it is echoed in the ``X-Request-Id`` response header.

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
from danube.discovery.errors import BadRequestError, TooLargeError, error_body, http_status

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


async def _send_too_large(send: Send, limit_bytes: int) -> None:
    error = TooLargeError(
        f"request body over the limit of {limit_bytes} bytes",
        code="body_too_large",
        limit=limit_bytes,
    )
    await _send_error(send, error)


def host_name(header: bytes) -> str:
    """The host of a ``Host`` header, lowercase, without its port (``[::1]:80`` -> ``::1``)."""
    host = header.decode("latin-1").strip().lower()
    if host.startswith("["):
        return host[1:].partition("]")[0]
    if host.count(":") == 1:
        return host.partition(":")[0]
    return host


class HostCheckMiddleware:
    """Refuse requests and WebSocket upgrades whose ``Host`` is not in ``allowed`` (None:
    any is), with 400 ``host_not_allowed`` (a WebSocket: closed before it opens, 403)."""

    def __init__(self, app: ASGIApp, *, allowed: frozenset[str] | None) -> None:
        self.app = app
        self.allowed = allowed

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (
            self.allowed is None
            or scope["type"] not in ("http", "websocket")
            or scope["path"] in UNCHECKED_PATHS
        ):
            await self.app(scope, receive, send)
            return
        headers = [value for name, value in scope["headers"] if name == b"host"]
        host = host_name(headers[0]) if len(headers) == 1 else None
        if host in self.allowed:
            await self.app(scope, receive, send)
            return
        if scope["type"] == "websocket":
            await send({"type": "websocket.close", "code": 1008})
            return
        shown = "no Host header" if host is None else f"Host {host[:100]!r}"
        await _send_error(
            send,
            BadRequestError(
                f"{shown} is not allowed (discovery.allowed_hosts)", code="host_not_allowed"
            ),
        )


class BodyLimitMiddleware:
    """Refuse request bodies over ``limit_bytes`` with 413 ``body_too_large``."""

    def __init__(self, app: ASGIApp, *, limit_bytes: int) -> None:
        self.app = app
        self.limit_bytes = limit_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        for name, value in scope["headers"]:
            if name == b"content-length":
                try:
                    declared = int(value)
                except ValueError:
                    declared = -1
                if declared > self.limit_bytes:
                    await _send_too_large(send, self.limit_bytes)
                    return
        seen = 0

        async def limited_receive() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.limit_bytes:
                    # FastAPI re-raises an HTTPException met while reading the body; the
                    # app's handler turns it into our error body.
                    raise HTTPException(413, f"request body over {self.limit_bytes} bytes")
            return message

        await self.app(scope, limited_receive, send)


class MetricsMiddleware:
    """Count answered requests by method, route template and status."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        status = 500

        async def recording_send(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
            await send(message)

        try:
            await self.app(scope, receive, recording_send)
        finally:
            route = scope.get("route")
            template = getattr(route, "path", None) or "unmatched"
            metrics.HTTP_REQUESTS.labels(scope["method"], template, str(status)).inc()


class TraceMiddleware:
    """Bind the request's trace id around the app; echo it in ``X-Request-Id`` (an HTTP
    response, or the WebSocket handshake's accept)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        wanted = (trace.TRACEPARENT_HEADER.encode(), trace.HTTP_HEADER.encode())
        headers = {
            name.decode("latin-1"): value.decode("latin-1")
            for name, value in scope["headers"]
            if name in wanted
        }
        trace_id = trace.incoming(headers)
        echoed = (trace.HTTP_HEADER.encode(), trace_id.encode())

        async def send_with_id(message: Message) -> None:
            if message["type"] in ("http.response.start", "websocket.accept"):
                message = {**message, "headers": [*message.get("headers", []), echoed]}
            await send(message)

        with trace.bound(trace_id):
            await self.app(scope, receive, send_with_id)

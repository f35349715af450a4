"""Plain ASGI middleware of the public API: the request body limit and request metrics.

The body limit answers 413 from the ``Content-Length`` header before any byte is read, and
also counts the bytes of a body sent without one (chunked), failing the read once past the
limit, so no handler ever holds more than ``max_body_bytes`` of a request.
"""

from __future__ import annotations

import orjson
from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from danube.discovery import metrics


async def _send_too_large(send: Send, limit_bytes: int) -> None:
    body = orjson.dumps(
        {
            "error": {
                "code": "body_too_large",
                "message": f"request body over the limit of {limit_bytes} bytes",
            }
        }
    )
    await send(
        {
            "type": "http.response.start",
            "status": 413,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                (b"connection", b"close"),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


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

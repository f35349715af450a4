"""What a service's own HTTP door needs around its routes (DESIGN §10: an ingest node's data
door, a dispatcher's consume door), written once: the request's headers and principal, a
body read within its bound, an error answered as every door answers it, the answer sent,
and the listener closed at a stop. The routes are each door's own (raw ASGI, no framework
on the data path)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Protocol

import orjson
from prometheus_client import Counter
from starlette.types import Receive, Scope, Send

from danube.errors import DanubeError, TooLargeError, UnavailableError
from danube.runtime.http import AsgiServer
from danube.security.tls import TLS_PRINCIPAL_SCOPE_KEY
from danube.wire.http_errors import error_body, error_headers, http_status

log = logging.getLogger(__name__)

ANONYMOUS = "anonymous"
JSON = "application/json"
DOOR_START_S = 5.0  # a door's listener binds within this, or its service does not start
DOOR_STOP_S = 5.0  # requests in progress are answered within this at a stop

# status, body, media type, extra headers
Answer = tuple[int, bytes, str, dict[str, str] | None]


class Authenticator(Protocol):
    """Who asks (danube.security.gate.SecurityGate)."""

    @property
    def enabled(self) -> bool:
        """False: everyone is anonymous."""
        ...

    def authenticate(self, authorization: str | None, tls_principal: str | None) -> str:
        """The principal of a bearer token or a verified client certificate, or
        UnauthenticatedError."""
        ...


def header(scope: Scope, name: bytes) -> str | None:
    """The first value of header ``name`` (lower case), None when absent."""
    for key, value in scope["headers"]:
        if key == name:
            return str(value.decode("latin-1"))
    return None


def principal(security: Authenticator, scope: Scope) -> str:
    """Who asks (:func:`principal_of`) in an ASGI request."""
    if not security.enabled:
        return ANONYMOUS
    tls = scope.get(TLS_PRINCIPAL_SCOPE_KEY)
    return security.authenticate(
        header(scope, b"authorization"), tls if isinstance(tls, str) else None
    )


def principal_of(security: Authenticator, authorization: str | None, tls: str | None) -> str:
    """Who asks: the bearer token or the client certificate (401 when neither holds), or
    anonymous with security off."""
    if not security.enabled:
        return ANONYMOUS
    return security.authenticate(authorization, tls)


def body_too_large(body_bytes_max: int, setting: str) -> TooLargeError:
    """413 ``body_too_large``, naming the setting that bounds it."""
    return TooLargeError(
        f"the body is over {body_bytes_max} bytes ({setting})",
        code="body_too_large",
        limit=body_bytes_max,
    )


async def read_body(receive: Receive, body_bytes_max: int, setting: str) -> bytes:
    """The request's body, refused (413) as soon as it passes ``body_bytes_max``; 503 when
    the client goes away before it all came."""
    parts: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise UnavailableError("the client went away before its body was read")
        part = message.get("body", b"")
        size += len(part)
        if size > body_bytes_max:
            raise body_too_large(body_bytes_max, setting)
        parts.append(part)
        if not message.get("more_body", False):
            return parts[0] if len(parts) == 1 else b"".join(parts)


def error_answer(exc: Exception, door: str, refusals: Counter) -> Answer:
    """The answer to a request that raised ``exc``: its error for ours (and timeouts),
    counted by code in ``refusals``; a logged 500 for anything else."""
    if isinstance(exc, DanubeError | TimeoutError):
        status = http_status(exc)
        if status >= 500:
            log.warning("%s answered %d: %r", door, status, exc)
        body = error_body(exc)
        refusals.labels(body["error"]["code"]).inc()
        return status, orjson.dumps(body), JSON, error_headers(exc)
    log.error("%s: request failed", door, exc_info=exc)
    return 500, orjson.dumps(error_body(exc)), JSON, None


async def send_answer(send: Send, answer: Answer) -> None:
    """Send ``answer`` (no content type when it has no body)."""
    status, body, media, headers = answer
    head = [(b"content-length", b"%d" % len(body))]
    if body:
        head.append((b"content-type", media.encode("latin-1")))
    for name, value in (headers or {}).items():
        head.append((name.lower().encode("latin-1"), value.encode("latin-1")))
    await send({"type": "http.response.start", "status": status, "headers": head})
    await send({"type": "http.response.body", "body": body})


class Listening:
    """A door's listener serving."""

    def __init__(self, server: AsgiServer, serving: asyncio.Task[None]) -> None:
        self.server = server
        self.serving = serving

    async def close(self) -> None:
        """Stop taking requests (those in progress are answered within DOOR_STOP_S)."""
        self.server.stop()
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.wait_for(asyncio.shield(self.serving), DOOR_STOP_S)

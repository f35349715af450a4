"""Errors of the client SDK (``danube.client``): one hierarchy, every error with a code.

::

    DanubeError
    └── ClientError                  "client_error": root; ``status`` None (no HTTP answer)
        ├── TransportError           "transport": no answer (refused, reset, read timeout);
        │                            retriable
        ├── DeadlineExceededError    "deadline_exceeded": a client deadline passed
        │                            (also a TimeoutError); retriable
        ├── InvalidArgumentError     "invalid_argument", "invalid_name": a bad option or name,
        │   │                        refused before anything is sent (also a ValueError)
        │   └── InvalidMessageError  "invalid_message": a key or attribute over its limit,
        │                            a payload too large
        ├── ClosedError              "closed": the client, producer or consumer is closed
        ├── ProtocolError            "protocol_error": the server answered something that is
        │                            not the API (a bug on one side)
        └── ApiError                 the server's ``{"error": {"code", "message"}}`` and status
            ├── BadRequestError      400  invalid_name, invalid_request, invalid_partition...
            ├── UnauthenticatedError 401  unauthenticated, invalid_token, token_expired...
            ├── PermissionDeniedError 403 permission_denied (the message names the permission)
            ├── NotFoundError        404  topic_not_found, namespace_not_found,
            │                             consumer_not_found...; 410 consumer_detached
            ├── ConflictError        409  topic_exists, subscription_taken...
            ├── TooLargeError        413  payload_too_large, body_too_large...
            ├── OverLimitError       429  too_many_requests, too_many_streams; retriable
            ├── UnavailableError     503  no_owner, timeout, ack_not_durable...; retriable
            └── ServerError          500 and anything else

An :class:`ApiError` carries the server's ``code`` as is, so callers branch on
``exc.code`` (``"consumer_not_found"``) rather than on message text. A consumer stream that
the server ends (a WebSocket close) raises the same classes: close code ``4000 + status``
maps to that status, 1008 (the client broke the protocol) to 400, 1011 to 500.
"""

from __future__ import annotations

from typing import Any

from danube.errors import DanubeError


class ClientError(DanubeError):
    """Root of the SDK's errors; ``status`` is the HTTP status when the server answered."""

    code = "client_error"
    status: int | None = None


class TransportError(ClientError):
    """The request got no answer: connection refused or reset, or no response in time.
    Retriable; a produce that timed out while reading may have been stored (at-least-once)."""

    code = "transport"
    retriable = True


class DeadlineExceededError(ClientError, TimeoutError):
    """A deadline of the client's own passed (``send_timeout_s``, a receive timeout)."""

    code = "deadline_exceeded"
    retriable = True


class InvalidArgumentError(ClientError, ValueError):
    """An option or a name refused before anything was sent."""

    code = "invalid_argument"


class InvalidMessageError(InvalidArgumentError):
    """A message refused before it was sent; the server would refuse it too."""

    code = "invalid_message"


class ClosedError(ClientError):
    """The client, producer or consumer was closed."""

    code = "closed"


class ProtocolError(ClientError):
    """The server's answer does not follow the API (a bug on one side, or not a Danube
    server at that address)."""

    code = "protocol_error"


class ApiError(ClientError):
    """An error answered by the server: its ``status`` and the ``code`` of its body."""

    code = "api_error"

    def __init__(self, message: str, *, code: str, status: int) -> None:
        super().__init__(message, code=code)
        self.status = status

    def __str__(self) -> str:
        return f"{self.code}: {self.message}"


class BadRequestError(ApiError):
    """400: the request is wrong; the same request fails again."""


class UnauthenticatedError(ApiError):
    """401: no token, or a token the server refuses (expired, another issuer or audience,
    signed by a key it does not list)."""


class PermissionDeniedError(ApiError):
    """403: the token's principal lacks the permission the message names."""


class NotFoundError(ApiError):
    """404: the namespace, topic, consumer or route does not exist; 410
    ``consumer_detached``: the dispatcher detached the consumer for never acking (attaching
    again is the caller's decision: the SDK does not do it by itself)."""


class ConflictError(ApiError):
    """409: the request contradicts what exists."""


class TooLargeError(ApiError):
    """413: a payload, a body or a batch over its limit."""


class OverLimitError(ApiError):
    """429: the server is at a limit; retry later."""

    retriable = True


class UnavailableError(ApiError):
    """503: no owner, or a dependency (bus, etcd, a dispatcher) did not answer; retry."""

    retriable = True


class ServerError(ApiError):
    """500 (a bug on the server) or a status the API does not use."""


_BY_STATUS: dict[int, type[ApiError]] = {
    400: BadRequestError,
    401: UnauthenticatedError,
    403: PermissionDeniedError,
    404: NotFoundError,
    405: BadRequestError,
    410: NotFoundError,
    409: ConflictError,
    413: TooLargeError,
    415: BadRequestError,
    429: OverLimitError,
    503: UnavailableError,
}

# WebSocket close codes (docs/http-api.md, "Errors that end the stream").
WS_POLICY_VIOLATION = 1008
WS_MESSAGE_TOO_BIG = 1009
WS_INTERNAL_ERROR = 1011
WS_SERVICE_RESTART = 1012
_WS_APP_CODES = 4000


def api_error(status: int, code: str, message: str) -> ApiError:
    """The error class of ``status``, carrying the server's ``code`` and ``message``."""
    return _BY_STATUS.get(status, ServerError)(message, code=code, status=status)


def error_from_body(status: int, body: Any, *, fallback: str) -> ApiError:
    """The :class:`ApiError` of an answer with ``status`` and decoded JSON ``body``;
    a body that is not the API's error shape gives code ``http_<status>`` and ``fallback``
    (the first bytes of the answer) as message."""
    detail = body.get("error") if isinstance(body, dict) else None
    if isinstance(detail, dict):
        code, message = detail.get("code"), detail.get("message")
        if isinstance(code, str) and isinstance(message, str):
            return api_error(status, code, message)
    return api_error(status, f"http_{status}", fallback or f"HTTP {status}")


def status_of_close(close_code: int) -> int:
    """The HTTP status a consumer stream's close code stands for."""
    if close_code in (WS_POLICY_VIOLATION, WS_MESSAGE_TOO_BIG):
        return 400
    if _WS_APP_CODES <= close_code < _WS_APP_CODES + 1000:
        return close_code - _WS_APP_CODES
    return 500

"""Errors of the discovery service, and the one place that maps any error to an HTTP answer.

The refusals of a request are the general classes of :mod:`danube.errors`, named here too
(discovery's modules import them from here)::

    DanubeError
    ├── BadRequestError        "bad_request", "invalid_json", "unknown_field",
    │   │                      "bad_encoding", "invalid_consumer_id",
    │   │                      "host_not_allowed", "invalid_sequence",
    │   │                      "partition_required", ...                 invalid      400
    │   └── StreamProtocolError  "invalid_frame", "too_many_credits", ... invalid      400
    │                            (a consumer stream's client broke the protocol)
    ├── NotFoundError          "namespace_not_found", "topic_not_found",
    │                          "subscription_not_found"                  not_found    404
    ├── ConflictError          "topic_exists", "namespace_exists",
    │                          "namespace_not_empty", "namespace_protected",
    │                          "too_many_producers"                      conflict     409
    ├── TooLargeError          "payload_too_large", "body_too_large",
    │                          "too_many_messages"                       too_large    413
    ├── UnsupportedMediaTypeError  "unsupported_media_type"          unsupported_media 415
    ├── OverLimitError         "too_many_requests", "too_many_streams",
    │                          "rate_limited", "backlog_quota_exceeded"
    │                          (retriable; Retry-After when it is known) over_limit   429
    └── UnavailableError       "no_owner", "unavailable"  (retriable)    unavailable  503

Every error, these and those of the other packages (``danube.security``'s 401 and 403, the
dispatcher's refusals, ingest's, the bus's and etcd's failures), is answered by its
:class:`~danube.errors.ErrorKind`: :func:`http_status` is the one table, kind to status.
Every error body is ``{"error": {"code": "...", "message": "..."}}``.

A consumer stream (WebSocket) cannot answer a status: it sends the same body as an error
frame and closes with :func:`ws_close_code` (1008 for a protocol violation, 4000 + the HTTP
status for the rest, 1011 for a bug).
"""

from __future__ import annotations

from danube.errors import (
    BadRequestError,
    ConflictError,
    NotFoundError,
    OverLimitError,
    TooLargeError,
    UnavailableError,
    UnsupportedMediaTypeError,
)
from danube.wire.consume.stream_protocol import StreamProtocolError, ws_close_code
from danube.wire.http_errors import error_body, http_status

__all__ = [
    "BadRequestError",
    "ConflictError",
    "NotFoundError",
    "OverLimitError",
    "StreamProtocolError",
    "TooLargeError",
    "UnavailableError",
    "UnsupportedMediaTypeError",
    "error_body",
    "http_status",
    "status_code",
    "ws_close_code",
]


# Codes of the statuses the web framework answers by itself (no route, a method the route does
# not serve, a body that does not parse or is not JSON).
_CODE_BY_STATUS: dict[int, str] = {
    400: "invalid_json",  # FastAPI: a body that is not JSON (not UTF-8, nested too deep)
    401: "unauthenticated",
    403: "permission_denied",
    404: "not_found",
    405: "method_not_allowed",
    413: "body_too_large",
    415: "unsupported_media_type",
}


def status_code(status: int) -> str:
    """The error code of an answer the web framework gives by itself with ``status``."""
    return _CODE_BY_STATUS.get(status, "bad_request" if status < 500 else "internal")

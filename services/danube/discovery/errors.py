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
    DanubeError,
    ErrorKind,
    NotFoundError,
    OverLimitError,
    TooLargeError,
    UnavailableError,
    UnsupportedMediaTypeError,
    kind_of,
)

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


class StreamProtocolError(BadRequestError):
    """A consumer stream's client broke the WebSocket protocol (a frame that is not one, too
    many credits): the stream answers an error frame and closes with 1008."""

    code = "invalid_frame"


_STATUS_BY_KIND: dict[ErrorKind, int] = {
    ErrorKind.INVALID: 400,
    ErrorKind.UNAUTHENTICATED: 401,
    ErrorKind.FORBIDDEN: 403,
    ErrorKind.NOT_FOUND: 404,
    ErrorKind.CONFLICT: 409,
    ErrorKind.GONE: 410,
    ErrorKind.TOO_LARGE: 413,
    ErrorKind.UNSUPPORTED_MEDIA: 415,
    ErrorKind.OVER_LIMIT: 429,
    ErrorKind.UNAVAILABLE: 503,
    ErrorKind.INTERNAL: 500,
}


# Status of the codes other packages raise (danube.names, frame, bus, meta, the contracts of
# danube.wire: ingest's and the dispatcher's): the only place their statuses are written.
_STATUS_BY_CODE: dict[str, int] = {
    "invalid_name": 400,
    "invalid_record": 400,
    "bad_request": 400,
    "payload_too_large": 413,
    "frame_too_large": 413,
    "no_responders": 503,
    "not_connected": 503,
    "timeout": 503,
    "deadline_exceeded": 503,
    "not_owner": 503,
    "claim_refused": 503,
    "meta_unavailable": 503,
    "lease_lost": 503,
    "rate_limited": 429,
    "backlog_quota_exceeded": 429,
    # An idempotent producer's records refused by the partition's leader
    # (danube.wire.ingest.protocol): a sequence past the next one, an epoch superseded.
    "out_of_order_sequence": 409,
    "producer_fenced": 409,
    # An ingest node's refusal of a produce (danube.ingest.leadership, its WAL's full disk).
    "no_leader_yet": 503,
    "not_enough_replicas": 503,
    "partition_unavailable": 503,
    "disk_full": 503,
    # The dispatcher's (danube.wire.dispatcher.errors), and policies' (docs/policies.md).
    "dispatcher_error": 500,
    "subscription_taken": 409,
    "too_many_subscriptions": 409,
    "too_many_consumers": 409,
    "consumer_exists": 409,
    "policy_conflict": 409,
    "consumer_not_found": 404,
    "consumer_detached": 410,  # detached for never acking (docs/dispatcher.md, Fair redelivery)
    "subscription_not_found": 404,
    "subscription_type_mismatch": 409,
    "unknown_partition": 500,  # a wiring bug
    "unsupported_operation": 400,  # a seek of a non-reliable subscription (no cursor)
    "unsupported_subscription_type": 400,  # key_shared on a non-reliable topic
    "offset_out_of_range": 400,
    "position_unavailable": 503,
    "ack_not_durable": 503,
    "data_damaged": 500,  # no intact copy of a range: an operator repairs or skips it
    # The dispatcher's refusals of a subscription skip (docs/http-api.md, "Skip"): were 500.
    "nothing_to_skip": 400,
    "skip_backwards": 400,
    # danube.meta.reassign: a reassignment the cluster cannot hold, or nothing to cancel.
    "duplicate_replicas": 400,
    "node_not_live": 400,
    "node_drained": 400,
    "factor_mismatch": 400,
    "too_many_replicas": 400,
    "not_reassigning": 409,
    # danube.security: no or bad credentials, then a missing permission.
    "unauthenticated": 401,
    "invalid_token": 401,
    "token_expired": 401,
    "invalid_api_key": 401,
    "permission_denied": 403,
}


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


def http_status(exc: BaseException) -> int:
    """The HTTP status an error is answered with: its kind's (500 for anything unexpected)."""
    status = _STATUS_BY_KIND[kind_of(exc)]
    _audit(exc, status)
    return status


def _legacy_status(exc: BaseException) -> int:  # TEMPORARY AUDIT
    from danube.meta import MetaError

    by_class = {
        BadRequestError: 400,
        NotFoundError: 404,
        ConflictError: 409,
        TooLargeError: 413,
        UnsupportedMediaTypeError: 415,
        OverLimitError: 429,
        UnavailableError: 503,
    }
    for cls, status in by_class.items():
        if isinstance(exc, cls) and type(exc).__module__.startswith("danube.discovery"):
            return status
        if type(exc) is cls:
            return status
    if isinstance(exc, TimeoutError):
        return 503
    if isinstance(exc, DanubeError):
        found = _STATUS_BY_CODE.get(exc.code)
        if found is not None:
            return found
        if isinstance(exc, MetaError) or exc.retriable:
            return 503
    return 500


def _audit(exc: BaseException, status: int) -> None:  # TEMPORARY AUDIT
    import os

    path = os.environ.get("DANUBE_KIND_AUDIT")
    legacy = _legacy_status(exc)
    if path and legacy != status:
        with open(path, "a") as out:
            name = f"{type(exc).__module__}.{type(exc).__name__}"
            out.write(f"{name} {getattr(exc, 'code', '')} legacy={legacy} kind={status}\n")


def error_body(exc: BaseException) -> dict[str, dict[str, str]]:
    """``{"error": {"code", "message"}}`` for any error; internals are not shown."""
    if isinstance(exc, DanubeError):
        return {"error": {"code": exc.code, "message": exc.message}}
    if isinstance(exc, TimeoutError):
        return {"error": {"code": "timeout", "message": str(exc) or "no answer in time"}}
    return {"error": {"code": "internal", "message": "internal error"}}


# WebSocket close codes (RFC 6455 §7.4): the standard ones, then 4000-4999 for applications.
WS_POLICY_VIOLATION = 1008
WS_INTERNAL_ERROR = 1011
_WS_APP_CODES = 4000


def ws_close_code(exc: BaseException) -> int:
    """The close code a consumer stream ends with on ``exc``: 1008 when the client broke the
    protocol, 1011 for anything unexpected, else 4000 + its HTTP status (4404
    ``consumer_not_found``, 4503 the dispatcher did not answer...)."""
    if isinstance(exc, StreamProtocolError):
        return WS_POLICY_VIOLATION
    status = http_status(exc)
    if status >= 500 and status != 503:
        return WS_INTERNAL_ERROR
    return _WS_APP_CODES + status

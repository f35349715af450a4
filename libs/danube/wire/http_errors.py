"""How every HTTP door of the mesh answers an error (discovery's API, an ingest node's data
door): the status of its kind, the one body ``{"error": {"code", "message"}}`` and the
headers some errors carry (``Retry-After``, ``Danube-Leader-Url``). docs/http-api.md lists
the codes; a test holds each class to its documented status."""

from __future__ import annotations

from danube.errors import DanubeError, ErrorKind, NotLeaderError, OverLimitError, kind_of

STATUS_BY_KIND: dict[ErrorKind, int] = {
    ErrorKind.INVALID: 400,
    ErrorKind.UNAUTHENTICATED: 401,
    ErrorKind.FORBIDDEN: 403,
    ErrorKind.NOT_FOUND: 404,
    ErrorKind.CONFLICT: 409,
    ErrorKind.GONE: 410,
    ErrorKind.TOO_LARGE: 413,
    ErrorKind.UNSUPPORTED_MEDIA: 415,
    ErrorKind.MISDIRECTED: 421,
    ErrorKind.OVER_LIMIT: 429,
    ErrorKind.UNAVAILABLE: 503,
    ErrorKind.INTERNAL: 500,
}

LEADER_URL_HEADER = "Danube-Leader-Url"
"""On a 421 ``not_leader``: the data URL of the partition's leader, when the node knows it."""


def http_status(exc: BaseException) -> int:
    """The HTTP status an error is answered with: its kind's (500 for anything unexpected)."""
    return STATUS_BY_KIND[kind_of(exc)]


def error_body(exc: BaseException) -> dict[str, dict[str, str]]:
    """``{"error": {"code", "message"}}`` for any error; internals are not shown."""
    if isinstance(exc, DanubeError):
        return {"error": {"code": exc.code, "message": exc.message}}
    if isinstance(exc, TimeoutError):
        return {"error": {"code": "timeout", "message": str(exc) or "no answer in time"}}
    return {"error": {"code": "internal", "message": "internal error"}}


def error_headers(exc: BaseException) -> dict[str, str] | None:
    """The headers an error's answer carries besides the body's: when to retry, or where."""
    if isinstance(exc, OverLimitError) and exc.retry_after_s is not None:
        return {"Retry-After": str(exc.retry_after_s)}
    if isinstance(exc, NotLeaderError) and exc.leader_url is not None:
        return {LEADER_URL_HEADER: exc.leader_url}
    return None

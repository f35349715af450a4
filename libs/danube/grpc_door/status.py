"""How an error is answered over gRPC: by its kind (danube.errors.ErrorKind), as the HTTP door
answers by it (danube.wire.http_errors), with a few codes the Danube clients expect named.

The official Danube clients retry UNAVAILABLE, DEADLINE_EXCEEDED and RESOURCE_EXHAUSTED (then
look the topic up again) and give up on anything else, so a retriable failure (no owner yet, a
dependency down, an instance over its limit) must be one of those three, and a caller's
mistake must not be. ALREADY_EXISTS is what the clients expect for a second exclusive producer
or consumer.
"""

from __future__ import annotations

import grpc

from danube.errors import ErrorKind, kind_of
from danube.wire.http_errors import error_body

# The codes the Danube clients expect a status of their own for; the rest by kind.
_BY_CODE: dict[str, grpc.StatusCode] = {
    "subscription_taken": grpc.StatusCode.ALREADY_EXISTS,
    "consumer_exists": grpc.StatusCode.ALREADY_EXISTS,
    "producer_exists": grpc.StatusCode.ALREADY_EXISTS,
    "exclusive_producer": grpc.StatusCode.ALREADY_EXISTS,
    "data_damaged": grpc.StatusCode.DATA_LOSS,
    "timeout": grpc.StatusCode.DEADLINE_EXCEEDED,
    "deadline_exceeded": grpc.StatusCode.DEADLINE_EXCEEDED,
}

_BY_KIND: dict[ErrorKind, grpc.StatusCode] = {
    ErrorKind.INVALID: grpc.StatusCode.INVALID_ARGUMENT,
    ErrorKind.UNAUTHENTICATED: grpc.StatusCode.UNAUTHENTICATED,
    ErrorKind.FORBIDDEN: grpc.StatusCode.PERMISSION_DENIED,
    ErrorKind.NOT_FOUND: grpc.StatusCode.NOT_FOUND,
    ErrorKind.CONFLICT: grpc.StatusCode.FAILED_PRECONDITION,
    ErrorKind.GONE: grpc.StatusCode.FAILED_PRECONDITION,  # a detached consumer: not retried
    ErrorKind.TOO_LARGE: grpc.StatusCode.INVALID_ARGUMENT,  # not RESOURCE_EXHAUSTED: retried
    ErrorKind.UNSUPPORTED_MEDIA: grpc.StatusCode.INVALID_ARGUMENT,
    ErrorKind.OVER_LIMIT: grpc.StatusCode.RESOURCE_EXHAUSTED,
    ErrorKind.UNAVAILABLE: grpc.StatusCode.UNAVAILABLE,
    ErrorKind.MISDIRECTED: grpc.StatusCode.UNAVAILABLE,  # Danube's clients look up again
    ErrorKind.INTERNAL: grpc.StatusCode.INTERNAL,
}


ERROR_CODE_KEY = "danube-error-code"
"""The trailing metadata key of a failed call's error code (the one its details start with)."""


def grpc_status(exc: BaseException) -> tuple[grpc.StatusCode, str, str]:
    """The status code, error code and details ``exc`` is answered with: details are
    ``<code>: <message>`` as the HTTP API's error body has them; anything unexpected is
    ``INTERNAL``, ``internal: internal error`` (internals are not shown)."""
    error = error_body(exc)["error"]
    code = _BY_CODE.get(error["code"]) or _BY_KIND[kind_of(exc)]
    return code, error["code"], f"{error['code']}: {error['message']}"

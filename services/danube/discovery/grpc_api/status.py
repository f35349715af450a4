"""How an error is answered over gRPC: one table, beside the HTTP one (danube.discovery.errors).

The official Danube clients retry UNAVAILABLE, DEADLINE_EXCEEDED and RESOURCE_EXHAUSTED (then
look the topic up again) and give up on anything else, so a retriable failure (no owner yet, a
dependency down, an instance over its limit) must be one of those three, and a caller's
mistake must not be. ALREADY_EXISTS is what the clients expect for a second exclusive producer
or consumer.
"""

from __future__ import annotations

import grpc

from danube.discovery.errors import error_body, http_status

_BY_CODE: dict[str, grpc.StatusCode] = {
    "subscription_taken": grpc.StatusCode.ALREADY_EXISTS,
    "consumer_exists": grpc.StatusCode.ALREADY_EXISTS,
    "producer_exists": grpc.StatusCode.ALREADY_EXISTS,
    "exclusive_producer": grpc.StatusCode.ALREADY_EXISTS,
    "producer_fenced": grpc.StatusCode.FAILED_PRECONDITION,  # also: an epoch superseded
    "out_of_order_sequence": grpc.StatusCode.FAILED_PRECONDITION,  # a gap: not retried
    "data_damaged": grpc.StatusCode.DATA_LOSS,
    "consumer_detached": grpc.StatusCode.FAILED_PRECONDITION,  # never acked: not retried
    "timeout": grpc.StatusCode.DEADLINE_EXCEEDED,
    "deadline_exceeded": grpc.StatusCode.DEADLINE_EXCEEDED,
}

_BY_HTTP_STATUS: dict[int, grpc.StatusCode] = {
    400: grpc.StatusCode.INVALID_ARGUMENT,
    401: grpc.StatusCode.UNAUTHENTICATED,
    403: grpc.StatusCode.PERMISSION_DENIED,
    404: grpc.StatusCode.NOT_FOUND,
    409: grpc.StatusCode.FAILED_PRECONDITION,
    413: grpc.StatusCode.INVALID_ARGUMENT,  # not RESOURCE_EXHAUSTED: clients would retry it
    415: grpc.StatusCode.INVALID_ARGUMENT,
    429: grpc.StatusCode.RESOURCE_EXHAUSTED,
    503: grpc.StatusCode.UNAVAILABLE,
}


ERROR_CODE_KEY = "danube-error-code"
"""The trailing metadata key of a failed call's error code (the one its details start with)."""


def grpc_status(exc: BaseException) -> tuple[grpc.StatusCode, str, str]:
    """The status code, error code and details ``exc`` is answered with: details are
    ``<code>: <message>`` as the HTTP API's error body has them; anything unexpected is
    ``INTERNAL``, ``internal: internal error`` (internals are not shown)."""
    error = error_body(exc)["error"]
    code = _BY_CODE.get(error["code"])
    if code is None:
        code = _BY_HTTP_STATUS.get(http_status(exc), grpc.StatusCode.INTERNAL)
    return code, error["code"], f"{error['code']}: {error['message']}"

"""How aetcd, gRPC and asyncio failures map onto the MetaError hierarchy (codes, retriable)."""

from __future__ import annotations

from typing import Any

import aetcd
import aetcd.exceptions
import aetcd.rpc
import pytest

from danube.errors import DanubeError
from danube.meta.errors import (
    LeaseLostError,
    MetaAuthError,
    MetaError,
    MetaRequestError,
    MetaTimeoutError,
    MetaUnavailableError,
    WatchCompactedError,
    map_error,
)

pytestmark = pytest.mark.unit


Status = aetcd.rpc.StatusCode


def rpc_error(code: Any, details: str) -> Exception:
    """A gRPC error as the channel raises it (grpc is untyped, so through aetcd.rpc)."""
    error: Exception = aetcd.rpc.AioRpcError(code, None, None, details=details)
    return error


def chained(outer: Exception, cause: BaseException) -> Exception:
    outer.__cause__ = cause  # how aetcd wraps gRPC errors: raise ClientError(...) from error
    return outer


@pytest.mark.parametrize(
    ("exc", "kind", "code", "retriable"),
    [
        (rpc_error(Status.UNAVAILABLE, "refused"), MetaUnavailableError,
         "meta_unavailable", True),
        (chained(aetcd.ConnectionFailedError("refused"),
                 rpc_error(Status.UNAVAILABLE, "refused")), MetaUnavailableError,
         "meta_unavailable", True),
        (rpc_error(Status.RESOURCE_EXHAUSTED, "etcdserver: too many requests"),
         MetaUnavailableError, "meta_unavailable", True),
        (rpc_error(Status.RESOURCE_EXHAUSTED, "Received message larger than max (5054 vs. 4096)"),
         MetaRequestError, "response_too_large", False),
        (rpc_error(Status.DEADLINE_EXCEEDED, "deadline"), MetaTimeoutError, "timeout",
         True),
        (TimeoutError(), MetaTimeoutError, "timeout", True),
        (chained(aetcd.ClientError("etcdserver: requested lease not found"),
                 rpc_error(Status.NOT_FOUND, "etcdserver: requested lease not found")),
         LeaseLostError, "lease_lost", False),
        (rpc_error(Status.INVALID_ARGUMENT, "etcdserver: request is too large"),
         MetaRequestError, "meta_bad_request", False),
        (aetcd.RevisionCompactedError(17), WatchCompactedError, "revision_compacted", False),
        (rpc_error(Status.PERMISSION_DENIED, "etcdserver: permission denied"),
         MetaAuthError, "meta_unauthorized", False),
        (rpc_error(Status.INVALID_ARGUMENT, "etcdserver: user name is empty"),
         MetaAuthError, "meta_unauthorized", False),
        (chained(aetcd.exceptions.UnauthenticatedError("etcdserver: invalid auth token"),
                 rpc_error(Status.UNAUTHENTICATED, "etcdserver: invalid auth token")),
         MetaAuthError, "meta_unauthorized", False),
        (rpc_error(Status.UNKNOWN, "etcdserver: something else"), MetaError, "meta_error", False),
    ],
)  # fmt: skip
def test_failures_map_to_typed_errors(
    exc: BaseException, kind: type[MetaError], code: str, retriable: bool
) -> None:
    error = map_error(exc, op="get")
    assert type(error) is kind
    assert isinstance(error, DanubeError)
    assert error.code == code
    assert error.retriable is retriable
    assert error.message.startswith("etcd get") or isinstance(error, WatchCompactedError)


def test_compaction_keeps_the_compacted_revision_and_resume_point() -> None:
    error = map_error(aetcd.RevisionCompactedError(17), op="watch", resume_revision=9)
    assert isinstance(error, WatchCompactedError)
    assert (error.compact_revision, error.resume_revision) == (17, 9)


def test_meta_errors_pass_through_unchanged() -> None:
    original = MetaUnavailableError("already typed")
    assert map_error(original, op="put") is original

"""Errors of ``danube.meta``: etcd failures, lost leases, broken watches, bad stored values.

::

    DanubeError
    ├── names.InvalidNameError       "invalid_name": name_kind, value, reason (a bad name or key)
    └── MetaError                    "meta_error": an etcd failure with no better name
        ├── MetaUnavailableError     "meta_unavailable": etcd unreachable or overloaded  (retriable)
        ├── MetaTimeoutError         "timeout": no answer within the deadline            (retriable)
        ├── MetaRequestError         "meta_bad_request": etcd refused the request as invalid
        │                            ("response_too_large": an answer over gRPC's limit)
        ├── MetaAuthError            "meta_unauthorized": no, wrong or expired credentials,
        │                            or the user's role does not cover the key
        ├── MetaDecodeError          "corrupt_metadata": key, reason (a stored value is bad)
        ├── UpdateRacedError         "update_raced": key, tries  (retriable; a CAS kept losing)
        ├── LeaseLostError           "lease_lost": lease_id (expired, revoked or not found;
        │                            a service's node lease too: it serves again under a new one)
        ├── DeposedError             "deposed": an elected role's term ended (another leads)
        └── WatchError               "watch_error": resume_revision
            ├── WatchCompactedError  "revision_compacted": compact_revision
            └── WatchOverflowError   "watch_overflow": buffer_size  (retriable)

``retriable`` means the same call may succeed later unchanged. A lost lease is never
retriable: whatever the lease protected (ownership, leadership) is gone and must be won again.
A broken watch carries ``resume_revision`` so the caller can start a new one where it stopped.

A bad name (namespace, topic, subscription, node id...) or a malformed key raises
:class:`danube.names.InvalidNameError`, the one error of the mesh's naming rules. It comes from
the pure functions of :mod:`danube.meta.keys` (and so from ``Election(...)``, which builds its
key), never from a call to etcd, and it is not a :class:`MetaError` (``danube.meta`` re-exports it).
"""

from __future__ import annotations

from typing import Any

import aetcd
import aetcd.rpc

from danube.errors import DanubeError, ErrorKind


class MetaError(DanubeError):
    """Root of the metadata errors; raised as is for an etcd failure with no better name."""

    code = "meta_error"
    kind = ErrorKind.UNAVAILABLE


class MetaUnavailableError(MetaError):
    """etcd could not be reached (connection refused or lost) or is shedding load."""

    code = "meta_unavailable"
    retriable = True


class MetaTimeoutError(MetaError):
    """A request got no answer within its deadline (``request_timeout_s``)."""

    code = "timeout"
    retriable = True


class MetaRequestError(MetaError):
    """etcd refused the request itself (too large, too many operations, bad argument)."""

    code = "meta_bad_request"


class MetaAuthError(MetaError):
    """etcd refused who we are (no user, a wrong password, a token it no longer knows) or
    what we asked (the user's role does not cover the key). etcd's own text says which; it
    never holds the password."""

    code = "meta_unauthorized"


# etcd's messages for authentication and authorization failures (etcdserver/api/v3rpc/
# rpctypes): gRPC codes alone do not tell them apart from other bad requests.
AUTH_FAILURE_DETAILS = (
    "user name is empty",
    "authentication failed",
    "invalid auth token",
    "permission denied",
    "auth: revision in header is old",
    "user name not found",
)
INVALID_TOKEN_DETAIL = "invalid auth token"


class MetaDecodeError(MetaError):
    """A stored value could not be decoded into the model the reader expects."""

    code = "corrupt_metadata"

    def __init__(self, *, key: str, reason: str) -> None:
        super().__init__(f"bad value at {key!r}: {reason}")
        self.key = key
        self.reason = reason


class UpdateRacedError(MetaError):
    """A compare-and-swap update (:meth:`MetaStore.update_model`) found the key changed
    between its read and its write ``tries`` times in a row; nothing was written."""

    code = "update_raced"
    retriable = True

    def __init__(self, *, key: str, tries: int) -> None:
        super().__init__(f"{key!r} changed during each of {tries} updates")
        self.key = key
        self.tries = tries


class LeaseLostError(MetaError):
    """The lease is gone: it expired, was revoked, or its keep-alive failed for a whole TTL."""

    code = "lease_lost"

    def __init__(self, message: str, *, lease_id: int | None) -> None:
        super().__init__(message)
        self.lease_id = lease_id


class DeposedError(MetaError):
    """A role held through an election (the controller, retention's leader) ended: a write
    fenced on the term failed, or the term was lost. Another node leads now; the work stops."""

    code = "deposed"


class WatchError(MetaError):
    """A watch ended before it was closed; start a new one at ``resume_revision``."""

    code = "watch_error"

    def __init__(
        self,
        message: str,
        *,
        resume_revision: int | None,
        code: str | None = None,
        retriable: bool | None = None,
    ) -> None:
        super().__init__(message, code=code, retriable=retriable)
        self.resume_revision = resume_revision


class WatchCompactedError(WatchError):
    """The revision the watch needs was compacted away; re-read the state, then watch again."""

    code = "revision_compacted"

    def __init__(self, *, compact_revision: int, resume_revision: int | None) -> None:
        super().__init__(
            f"watch revision compacted (oldest available: {compact_revision})",
            resume_revision=resume_revision,
        )
        self.compact_revision = compact_revision


class WatchOverflowError(WatchError):
    """The consumer fell more than ``buffer_size`` events behind; events were not dropped
    silently: the watch ended, and a new one from ``resume_revision`` misses nothing."""

    code = "watch_overflow"
    retriable = True

    def __init__(self, *, buffer_size: int, resume_revision: int | None) -> None:
        super().__init__(
            f"watch consumer fell {buffer_size} events behind", resume_revision=resume_revision
        )
        self.buffer_size = buffer_size


def _grpc_error(exc: BaseException) -> Any:
    """The gRPC error behind ``exc``: itself, or the cause aetcd chained it to."""
    for candidate in (exc, exc.__cause__):
        if isinstance(candidate, aetcd.rpc.AioRpcError):
            return candidate
    return None


def map_error(exc: BaseException, *, op: str, resume_revision: int | None = None) -> MetaError:
    """Translate what aetcd/gRPC/asyncio raised during ``op`` into a :class:`MetaError`."""
    if isinstance(exc, MetaError):
        return exc
    if isinstance(exc, aetcd.RevisionCompactedError):
        return WatchCompactedError(
            compact_revision=int(exc.compacted_revision), resume_revision=resume_revision
        )
    if isinstance(exc, TimeoutError | aetcd.WatchTimeoutError | aetcd.ConnectionTimeoutError):
        return MetaTimeoutError(f"etcd {op}: no answer within the deadline")
    rpc_error = _grpc_error(exc)
    if rpc_error is None:
        if isinstance(exc, aetcd.ConnectionFailedError):
            return MetaUnavailableError(f"etcd {op}: {exc}")
        return MetaError(f"etcd {op}: {exc!r}")
    status = aetcd.rpc.StatusCode
    code, details = rpc_error.code(), str(rpc_error.details())
    message = f"etcd {op}: {details}"
    if any(detail in details for detail in AUTH_FAILURE_DETAILS):
        return MetaAuthError(message)
    if code == status.NOT_FOUND and "lease not found" in details:
        return LeaseLostError(message, lease_id=None)
    if code == status.RESOURCE_EXHAUSTED and "larger than max" in details:
        # gRPC's own receive limit: retrying the same request cannot help.
        return MetaRequestError(message, code="response_too_large")
    if code in (status.UNAVAILABLE, status.RESOURCE_EXHAUSTED, status.CANCELLED):
        return MetaUnavailableError(message)
    if code == status.DEADLINE_EXCEEDED:
        return MetaTimeoutError(message)
    if code in (status.INVALID_ARGUMENT, status.FAILED_PRECONDITION, status.OUT_OF_RANGE):
        return MetaRequestError(message)
    return MetaError(message)

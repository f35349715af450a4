"""The root of every error the Danube mesh raises on purpose, and the kinds of error.

Each package draws its own hierarchy under :class:`DanubeError`::

    DanubeError                  code, message, retriable, kind
    ├── names.InvalidNameError   a name that breaks the naming rules (one for every package)
    ├── frame.FrameError         corrupt or oversize frames and records
    ├── config.ConfigError       a bad setting, named by its key path
    ├── bus.BusError             request/reply failures, remote errors
    ├── meta.MetaError           etcd failures, lost leases
    ├── storage.StorageError     object storage failures
    └── the refusals of a request, by kind (below): BadRequestError, NotFoundError,
        ConflictError, TooLargeError, UnsupportedMediaTypeError, OverLimitError,
        UnavailableError

``code`` is a short stable string (``"corrupt_frame"``, ``"timeout"``...) that
travels over the bus and into HTTP error bodies; ``retriable`` tells a caller
whether the same request may succeed later without any change.

``kind`` (:class:`ErrorKind`) says what sort of failure it is — the caller's mistake, a
missing thing, a conflict with what exists, over a limit, a dependency down — and is the
only thing a door looks at to answer it: the HTTP door derives its status from the kind,
the gRPC door its status code. A class states its kind once; a code raised through a
general class names its kind where it is raised. The kind travels over the bus with the
code (danube.bus.protocol), so an error raised by ingest or a dispatcher is answered by
the door as it was meant, with no table of codes at the door.
"""

from __future__ import annotations

from enum import StrEnum


class ErrorKind(StrEnum):
    """What sort of failure an error is; each door answers a kind with its own status."""

    INVALID = "invalid"  # the request is wrong: its shape, a value, a name (400)
    UNAUTHENTICATED = "unauthenticated"  # no or bad credentials (401)
    FORBIDDEN = "forbidden"  # the principal lacks the permission (403)
    NOT_FOUND = "not_found"  # what it names does not exist (404)
    CONFLICT = "conflict"  # contradicts what exists: taken, fenced, in use (409)
    GONE = "gone"  # existed and was ended for good: a detached consumer (410)
    TOO_LARGE = "too_large"  # a payload, body or batch over its limit (413)
    UNSUPPORTED_MEDIA = "unsupported_media"  # a body in a type or encoding not taken (415)
    OVER_LIMIT = "over_limit"  # over a rate, quota or concurrency limit: later (429)
    UNAVAILABLE = "unavailable"  # a dependency or owner is not answering now (503)
    MISDIRECTED = "misdirected"  # asked of a node that does not own it; the owner may (421)
    INTERNAL = "internal"  # a bug or damage nobody can fix by asking again (500)


class DanubeError(Exception):
    """Base class: a stable ``code``, a human ``message``, a ``retriable`` flag and a
    ``kind``."""

    code: str = "internal"
    retriable: bool = False
    kind: ErrorKind = ErrorKind.INTERNAL

    def __init__(
        self,
        message: str,
        *,
        code: str | None = None,
        retriable: bool | None = None,
        kind: ErrorKind | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        if code is not None:
            self.code = code
        if retriable is not None:
            self.retriable = retriable
        if kind is not None:
            self.kind = kind

    def __repr__(self) -> str:
        return f"{type(self).__name__}(code={self.code!r}, message={self.message!r})"


class BadRequestError(DanubeError):
    """The request itself is wrong (shape, type, encoding, a value out of range); nothing
    changed, and the same request fails again."""

    code = "bad_request"
    kind = ErrorKind.INVALID


class NotFoundError(DanubeError):
    """What the request names (a namespace, topic, subscription...) does not exist."""

    code = "not_found"
    kind = ErrorKind.NOT_FOUND


class ConflictError(DanubeError):
    """The request contradicts what exists (another config, a non-empty namespace, a
    holder)."""

    code = "conflict"
    kind = ErrorKind.CONFLICT


class TooLargeError(DanubeError):
    """A payload, a body or a batch over its limit; ``limit`` names the limit."""

    code = "too_large"
    kind = ErrorKind.TOO_LARGE

    def __init__(self, message: str, *, code: str, limit: int) -> None:
        super().__init__(message, code=code)
        self.limit = limit


class UnsupportedMediaTypeError(DanubeError):
    """A body in a type or encoding that is not taken."""

    code = "unsupported_media_type"
    kind = ErrorKind.UNSUPPORTED_MEDIA


class OverLimitError(DanubeError):
    """Over a limit: concurrent work, or a topic's publish rate or backlog quota; retry
    later. ``retry_after_s``: when, if known (HTTP answers it as ``Retry-After``)."""

    code = "too_many_requests"
    kind = ErrorKind.OVER_LIMIT
    retriable = True

    def __init__(
        self, message: str, *, code: str | None = None, retry_after_s: int | None = None
    ) -> None:
        super().__init__(message, code=code)
        self.retry_after_s = retry_after_s


class UnavailableError(DanubeError):
    """A dependency (bus, etcd, the partition's owner) did not answer in time."""

    code = "unavailable"
    kind = ErrorKind.UNAVAILABLE
    retriable = True


class NotLeaderError(DanubeError):
    """A data door was asked for a partition its node does not lead (any more): ask the
    leader, at ``leader_url`` when known (a lookup finds it otherwise). Retriable at once."""

    code = "not_leader"
    kind = ErrorKind.MISDIRECTED
    retriable = True

    def __init__(self, message: str, *, leader_url: str | None = None) -> None:
        super().__init__(message)
        self.leader_url = leader_url


def kind_of(exc: BaseException) -> ErrorKind:
    """The kind of any exception: a DanubeError's own (one that names none but says it is
    retriable is a dependency not answering now: ``unavailable``); a bare ``TimeoutError``
    is a dependency that did not answer; anything else is internal."""
    if isinstance(exc, DanubeError):
        if exc.kind is ErrorKind.INTERNAL and exc.retriable:
            return ErrorKind.UNAVAILABLE
        return exc.kind
    if isinstance(exc, TimeoutError):
        return ErrorKind.UNAVAILABLE
    return ErrorKind.INTERNAL

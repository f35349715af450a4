"""Errors of ``danube.bus``: bad subjects, and request/reply failures on either side.

::

    DanubeError
    ├── names.InvalidNameError        "invalid_name": kind, value, reason (topic/namespace/op...)
    └── BusError                      "bus_error": root; raised as is for a misuse of the API
        ├── InvalidSubjectError       "invalid_subject": subject, reason  (parse side)
        ├── PayloadTooLargeError      "payload_too_large": size_bytes, limit_bytes
        ├── NotConnectedError         "not_connected": retriable          (closed, draining, down)
        ├── BusTimeoutError           "timeout": subject, timeout_s, retriable
        ├── NoRespondersError         "no_responders": subject, retriable
        ├── DeadlineExceededError     "deadline_exceeded": retriable      (sent by a responder)
        └── RemoteError               code, message, retriable, kind as the responder sent them

:class:`RemoteError` is the one class whose ``code`` is not fixed: it carries the code of the
error the remote handler raised (``"deadline_exceeded"``, ``"internal"``, or any code of another
package's hierarchy, such as ``"corrupt_frame"``), so a caller can branch on ``exc.code`` exactly
as if the handler had run in-process.

A bad topic, namespace, subscription or operation name raises
:class:`danube.names.InvalidNameError`, the one error of the mesh's naming rules; it is not a
:class:`BusError` (``danube.bus`` re-exports it). Parsing a subject turns it into an
:class:`InvalidSubjectError`.
"""

from __future__ import annotations

from danube.errors import DanubeError, ErrorKind


class BusError(DanubeError):
    """Root of the bus errors; raised as is for a misuse of the API (a bad argument)."""

    code = "bus_error"


class InvalidSubjectError(BusError):
    """A subject that is not one of the mesh's subjects (wrong prefix, kind or token count)."""

    code = "invalid_subject"

    def __init__(self, subject: str, reason: str) -> None:
        super().__init__(f"invalid subject {subject!r}: {reason}")
        self.subject = subject
        self.reason = reason


class PayloadTooLargeError(BusError):
    """A body larger than the server's ``max_payload``; it would never be delivered."""

    code = "payload_too_large"
    kind = ErrorKind.TOO_LARGE

    def __init__(self, *, size_bytes: int, limit_bytes: int) -> None:
        super().__init__(f"body of {size_bytes} bytes exceeds the bus limit of {limit_bytes}")
        self.size_bytes = size_bytes
        self.limit_bytes = limit_bytes


class NotConnectedError(BusError):
    """The connection is closed, draining, or down with its reconnect buffer full."""

    code = "not_connected"
    kind = ErrorKind.UNAVAILABLE
    retriable = True


class BusTimeoutError(BusError):
    """No reply arrived before the request's deadline (the responder may still have acted)."""

    code = "timeout"
    kind = ErrorKind.UNAVAILABLE
    retriable = True

    def __init__(self, subject: str, timeout_s: float) -> None:
        super().__init__(f"no reply on {subject!r} within {timeout_s:.3f} s")
        self.subject = subject
        self.timeout_s = timeout_s


class NoRespondersError(BusError):
    """Nobody subscribes to the subject right now (no owner yet, or the owner just moved)."""

    code = "no_responders"
    kind = ErrorKind.UNAVAILABLE
    retriable = True

    def __init__(self, subject: str) -> None:
        super().__init__(f"no responders on {subject!r}")
        self.subject = subject


class DeadlineExceededError(BusError):
    """The request's deadline passed before the responder answered; it dropped the work."""

    code = "deadline_exceeded"
    kind = ErrorKind.UNAVAILABLE
    retriable = True

    def __init__(self, subject: str) -> None:
        super().__init__(f"the deadline of a request on {subject!r} passed before it was answered")
        self.subject = subject


class RemoteError(BusError):
    """An error raised by the remote handler, with its ``code``, ``message``, ``retriable``
    and ``kind`` (a reply without one, from a peer of an older version: ``internal``, which
    :func:`danube.errors.kind_of` answers as ``unavailable`` when retriable)."""

    def __init__(
        self,
        *,
        code: str,
        message: str,
        retriable: bool,
        subject: str = "",
        kind: ErrorKind | None = None,
    ) -> None:
        super().__init__(message, code=code, retriable=retriable, kind=kind)
        self.subject = subject

    def __repr__(self) -> str:
        return (
            f"RemoteError(code={self.code!r}, message={self.message!r}, "
            f"retriable={self.retriable!r}, subject={self.subject!r})"
        )

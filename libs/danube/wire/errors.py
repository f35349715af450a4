"""The error of every bus contract in :mod:`danube.wire`: a body that breaks its layout.

::

    DanubeError
    └── BadRequestError    "bad_request" (or a narrower code, e.g. "unknown_op")

A request or reply body that does not follow its layout, or names nothing the responder
knows: nothing changed, and the same request fails again (not retriable). It is raised by
the decoders of every service's contract (``danube.wire.ingest.protocol``,
``danube.wire.dispatcher.protocol``, ``danube.wire.cloud``) and by the services that answer
them; on the bus it travels as its code and its kind (``invalid``). Errors carry no HTTP
status: every door answers the kind with its own (danube.discovery.errors for HTTP).
"""

from __future__ import annotations

from danube.errors import DanubeError, ErrorKind


class BadRequestError(DanubeError):
    """A bus body that does not follow its layout (or names nothing known); nothing
    changed."""

    code = "bad_request"
    kind = ErrorKind.INVALID

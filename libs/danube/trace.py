"""The trace id of the request being served: set at a front door, carried by the bus, logged.

One id follows one client request through the mesh::

    client --HTTP/gRPC (traceparent or x-request-id)--> discovery      binds the id
    discovery --bus request, header Danube-Trace-Id--> ingest, dispatcher, ...   bind it again
    ingest --bus publish (live.*), same header--> dispatcher                   and again
    ... the replies carry it back; discovery echoes it in the X-Request-Id response header

Within a process the id lives in a :class:`contextvars.ContextVar`, so every task started
while serving the request (asyncio copies the context into a new task) sees it, and
:class:`TraceIdFilter` adds it to every log record as ``trace_id``. Nothing here depends on
any other part of the project: the bus, the log setup and the front doors all import it.

An incoming ``traceparent`` (W3C Trace Context) gives its 32-hex trace id; else an incoming
``x-request-id`` is used as it is, when it is a short token; else a new random id is made.
This is not OpenTelemetry: no spans, no exporter; the id is only for finding a request's
lines in the logs of every service it touched.
"""

from __future__ import annotations

import contextlib
import logging
import re
import secrets
from collections.abc import Iterator, Mapping
from contextvars import ContextVar

BUS_HEADER = "Danube-Trace-Id"
"""The bus header (NATS) carrying the id between services; reserved like every Danube- one."""
HTTP_HEADER = "x-request-id"
"""The HTTP header (and gRPC metadata key) read on the way in and echoed on the way out."""
TRACEPARENT_HEADER = "traceparent"

MAX_ID_CHARS = 128
"""Longer incoming ids are refused (a new one is made): the id lands in every log line."""

# version-traceid-parentid-flags; an all-zero trace id is invalid (W3C Trace Context §3.2).
_TRACEPARENT = re.compile(r"([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})")
# What an id may hold: safe in a header, a log line and a NATS header value.
_REQUEST_ID = re.compile(r"[A-Za-z0-9._:@/+=-]+")

_current: ContextVar[str | None] = ContextVar("danube_trace_id", default=None)


def current() -> str | None:
    """The trace id of the request this code serves, or None outside any request."""
    return _current.get()


def new_trace_id() -> str:
    """A fresh id, shaped like a W3C trace id (32 lowercase hex digits)."""
    return secrets.token_hex(16)


def valid_id(value: str | None) -> str | None:
    """``value`` if it may be used as a trace id as it is, else None."""
    if value is None or not 0 < len(value) <= MAX_ID_CHARS:
        return None
    return value if _REQUEST_ID.fullmatch(value) else None


def from_traceparent(value: str | None) -> str | None:
    """The trace id of a W3C ``traceparent`` header, or None if it is malformed."""
    if value is None:
        return None
    match = _TRACEPARENT.fullmatch(value.strip())
    if match is None or match.group(1) == "ff" or match.group(2) == "0" * 32:
        return None
    return match.group(2)


def incoming(headers: Mapping[str, str]) -> str:
    """The id for a request with these (lowercase-named) headers: its traceparent's trace
    id, else its x-request-id, else a new one."""
    return (
        from_traceparent(headers.get(TRACEPARENT_HEADER))
        or valid_id(headers.get(HTTP_HEADER))
        or new_trace_id()
    )


def from_bus_headers(headers: Mapping[str, str]) -> str | None:
    """The id a bus message carries, if any (names compared ignoring case)."""
    for name, value in headers.items():
        if name.lower() == BUS_HEADER.lower():
            return valid_id(value)
    return None


@contextlib.contextmanager
def bound(trace_id: str | None) -> Iterator[str | None]:
    """Serve the code inside as part of request ``trace_id`` (None: of no request)."""
    token = _current.set(trace_id)
    try:
        yield trace_id
    finally:
        _current.reset(token)


def bus_headers() -> dict[str, str]:
    """The header a bus message sent now carries: the current id, if there is one."""
    trace_id = _current.get()
    return {BUS_HEADER: trace_id} if trace_id is not None else {}


class TraceIdFilter(logging.Filter):
    """Adds ``trace_id`` to every record logged while a request is served (on a handler, so
    records of every logger pass through it); records outside a request are left as they are."""

    def filter(self, record: logging.LogRecord) -> bool:
        trace_id = _current.get()
        if trace_id is not None and not hasattr(record, "trace_id"):
            record.__dict__["trace_id"] = trace_id  # what `extra=` would have set
        return True

"""What travels next to the body of a bus message: the header names and their encodings.

Bodies are raw bytes end to end; everything the bus itself needs rides in NATS headers::

    Danube-Timeout-Ms      request   how long the caller waits, milliseconds (integer >= 0)
    Danube-Error-Code      reply     the error's stable code; present only on an error reply
    Danube-Error-Message   reply     the error's message, UTF-8 then percent-encoded
    Danube-Retriable       reply     "true" or "false"
    Danube-Error-Kind      reply     the error's kind (danube.errors.ErrorKind): doors answer by it
    Danube-Trace-Id        any       the trace id of the client request being served (danube.trace);
                                     set by the bus from the sender's context, bound by the receiver

An error reply has an empty body. Header names starting with ``Danube-`` are reserved for the bus.
The deadline travels as a relative timeout (the remaining milliseconds, as gRPC's
``grpc-timeout``), never as a wall-clock instant: the responder starts its own deadline from
its monotonic clock when the request arrives, so clock skew between hosts moves nothing (an
instant would be cut short, or expired on arrival, by a caller whose clock runs ahead).
The time in flight is not subtracted, so the responder's deadline falls slightly after the
caller's: nobody reads a reply that late, but no work is cut short either.
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Mapping
from urllib.parse import quote, unquote

from danube.bus.errors import BusError, RemoteError
from danube.errors import DanubeError, ErrorKind, kind_of

TIMEOUT_HEADER = "Danube-Timeout-Ms"
ERROR_CODE_HEADER = "Danube-Error-Code"
ERROR_MESSAGE_HEADER = "Danube-Error-Message"
RETRIABLE_HEADER = "Danube-Retriable"
ERROR_KIND_HEADER = "Danube-Error-Kind"
RESERVED_HEADER_PREFIX = "danube-"  # compared case-insensitively

CODE_INTERNAL = "internal"
CODE_DEADLINE_EXCEEDED = "deadline_exceeded"
CODE_TIMEOUT = "timeout"
CODE_PAYLOAD_TOO_LARGE = "payload_too_large"

MAX_TIMEOUT_S = 300.0
"""Limit on one request's timeout; a responder also caps a deadline it receives to this far out."""

MAX_ERROR_MESSAGE_CHARS = 1024
"""Error messages are cut to this length so that an error reply stays small."""

MAX_CODE_CHARS = 64

# What NATS accepts as a header name (an HTTP token).
_HEADER_NAME = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
_CODE = re.compile(r"[A-Za-z0-9_.-]+")
# Readable punctuation left as is; '%' is not in the list, so decoding is unambiguous.
_MESSAGE_SAFE = " !\"#$&'()*+,/:;<=>?@[]^_`{|}~"
# "NATS/1.0\r\n" then "Name: value\r\n" per header, then "\r\n": what the server counts.
_HEADER_BLOCK_OVERHEAD = len("NATS/1.0\r\n") + len("\r\n")
_HEADER_LINE_OVERHEAD = len(": \r\n")


def monotonic_s() -> float:
    """The clock a deadline is kept in on this host (asyncio's loop clock); never sent."""
    return time.monotonic()


def encode_timeout(timeout_s: float) -> str:
    """The ``Danube-Timeout-Ms`` value for ``timeout_s``: whole milliseconds, rounded up."""
    return str(max(math.ceil(timeout_s * 1000), 0))


def check_timeout(timeout_s: float) -> float:
    """Return ``timeout_s`` if it is in (0, MAX_TIMEOUT_S], else raise BusError."""
    if not 0 < timeout_s <= MAX_TIMEOUT_S:  # also rejects NaN
        raise BusError(f"timeout_s must be in (0, {MAX_TIMEOUT_S}], got {timeout_s!r}")
    return timeout_s


def read_timeout_s(headers: Mapping[str, str], *, default_timeout_s: float) -> float:
    """How long the caller waits, from its ``Danube-Timeout-Ms``, at most ``MAX_TIMEOUT_S``;
    zero means it has given up already.

    A request from a client that sends no (or a garbled) timeout gets ``default_timeout_s``.
    """
    raw = header(headers, TIMEOUT_HEADER)
    if raw is None or not raw.isascii() or not raw.isdigit():
        return min(default_timeout_s, MAX_TIMEOUT_S)
    if len(raw) > 9:  # longer than the cap anyway (and never parse an unbounded number)
        return MAX_TIMEOUT_S
    return min(int(raw) / 1000, MAX_TIMEOUT_S)


def header(headers: Mapping[str, str], name: str) -> str | None:
    """Look a header up by name, ignoring case (other NATS clients may canonicalize names)."""
    value = headers.get(name)
    if value is not None:
        return value
    lowered = name.lower()
    for key, candidate in headers.items():
        if key.lower() == lowered:
            return candidate
    return None


def check_user_headers(headers: Mapping[str, str] | None) -> dict[str, str]:
    """Copy the caller's headers, refusing names NATS cannot carry and the reserved prefix."""
    checked: dict[str, str] = {}
    for name, value in (headers or {}).items():
        if not _HEADER_NAME.fullmatch(name):
            raise BusError(f"invalid header name {name!r}")
        if name.lower().startswith(RESERVED_HEADER_PREFIX):
            raise BusError(f"header {name!r} uses the reserved prefix 'Danube-'")
        if "\r" in value or "\n" in value or value != value.strip():
            # NATS would rewrite such a value silently; refuse rather than deliver another one.
            raise BusError(f"header {name!r} has line breaks or surrounding whitespace")
        checked[name] = value
    return checked


def headers_size_bytes(headers: Mapping[str, str] | None) -> int:
    """How many bytes a header block takes on the wire (counted against ``max_payload``)."""
    if not headers:
        return 0
    lines = sum(
        len(k.encode()) + len(v.encode()) + _HEADER_LINE_OVERHEAD for k, v in headers.items()
    )
    return _HEADER_BLOCK_OVERHEAD + lines


_KINDS = {kind.value: kind for kind in ErrorKind}


def error_headers(exc: BaseException) -> dict[str, str]:
    """The headers of the error reply that carries ``exc`` back to the caller.

    A :class:`DanubeError` keeps its code, message and retriable flag; any other exception is
    reported as ``internal`` with only its own text (no traceback), except a plain
    ``TimeoutError``, reported as the retriable ``timeout`` it is.
    """
    if isinstance(exc, DanubeError):
        code, message, retriable = exc.code, exc.message, exc.retriable
    elif isinstance(exc, TimeoutError):
        code, message, retriable = CODE_TIMEOUT, str(exc) or "timed out", True
    else:
        code, message, retriable = CODE_INTERNAL, str(exc) or type(exc).__name__, False
    if not _CODE.fullmatch(code) or len(code) > MAX_CODE_CHARS:
        code = CODE_INTERNAL
    return {
        ERROR_CODE_HEADER: code,
        ERROR_MESSAGE_HEADER: quote(message.strip()[:MAX_ERROR_MESSAGE_CHARS], safe=_MESSAGE_SAFE),
        RETRIABLE_HEADER: "true" if retriable else "false",
        ERROR_KIND_HEADER: kind_of(exc).value,
    }


def remote_error(headers: Mapping[str, str], *, subject: str = "") -> RemoteError | None:
    """The :class:`RemoteError` an error reply carries, or ``None`` for a normal reply."""
    code = header(headers, ERROR_CODE_HEADER)
    if code is None:
        return None
    message = unquote(header(headers, ERROR_MESSAGE_HEADER) or "")
    retriable = (header(headers, RETRIABLE_HEADER) or "").lower() == "true"
    kind = _KINDS.get(header(headers, ERROR_KIND_HEADER) or "")
    return RemoteError(code=code, message=message, retriable=retriable, subject=subject, kind=kind)

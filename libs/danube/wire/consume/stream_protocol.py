"""The consumer stream protocol (``GET /v1/consumers/{id}/stream``, docs/http-api.md) without
any I/O: the frames a client may send, the credits it granted, the frames the server sends,
and the count of open streams. :mod:`danube.wire.consume.stream` does the I/O around it,
on discovery and on a dispatcher's consume door.

Every frame is one JSON text message::

    client -> server   {"type": "flow", "credits": N}                     N in 1..10 000
                       {"type": "ack",  "messages": [{"partition", "offset"}, ...]}
                       {"type": "nack", "messages": [...], "delay_ms": N}
    server -> client   {"type": "message", "partition", "offset", "payload", "encoding",
                        "key", "attributes", "publish_time_ms", "producer", "redelivery_count"}
                       {"type": "error", "error": {"code", "message"}}

The server never sends more message frames than the credits granted so far: each one sent
spends one. At most ``CREDITS_MAX`` credits are outstanding at once.
"""

from __future__ import annotations

from typing import Any

import orjson
from pydantic import TypeAdapter, ValidationError

from danube.errors import BadRequestError
from danube.wire.consume.models import (
    FLOW_CREDITS_CAP,
    AckFrame,
    ClientFrame,
    FlowFrame,
    MessageOut,
    NackFrame,
    violation,
)
from danube.wire.http_errors import error_body, http_status

__all__ = [
    "CREDITS_MAX",
    "FRAME_BYTES_MAX",
    "AckFrame",
    "Credits",
    "FlowFrame",
    "NackFrame",
    "StreamProtocolError",
    "error_frame",
    "message_frame",
    "parse_frame",
    "ws_close_code",
]

# Credits outstanding at once (granted, not yet spent): what a client may hold unread.
CREDITS_MAX = FLOW_CREDITS_CAP
# The largest frame a client may send (the WebSocket server closes with 1009 past it): room
# for an ack of ~10 000 refs; a client acks more in several frames.
FRAME_BYTES_MAX = 1024 * 1024


class StreamProtocolError(BadRequestError):
    """A consumer stream's client broke the WebSocket protocol (a frame that is not one, too
    many credits): the stream answers an error frame and closes with 1008."""

    code = "invalid_frame"


# WebSocket close codes (RFC 6455 §7.4): the standard ones, then 4000-4999 for applications.
WS_POLICY_VIOLATION = 1008
WS_INTERNAL_ERROR = 1011
_WS_APP_CODES = 4000


def ws_close_code(exc: BaseException) -> int:
    """The close code a consumer stream ends with on ``exc``: 1008 when the client broke the
    protocol, 1011 for anything unexpected, else 4000 + its HTTP status (4404
    ``consumer_not_found``, 4421 ``not_leader`` on a consume door, 4503 the dispatcher did
    not answer...)."""
    if isinstance(exc, StreamProtocolError):
        return WS_POLICY_VIOLATION
    status = http_status(exc)
    if status >= 500 and status != 503:
        return WS_INTERNAL_ERROR
    return _WS_APP_CODES + status


_FRAME: TypeAdapter[ClientFrame] = TypeAdapter(ClientFrame)


def parse_frame(text: str) -> FlowFrame | AckFrame | NackFrame:
    """One client frame; StreamProtocolError ``invalid_json``, ``unknown_field`` or
    ``invalid_frame`` when it is not one (an unknown ``type`` included)."""
    try:
        return _FRAME.validate_json(text)
    except ValidationError as exc:
        raise violation(
            exc, error=StreamProtocolError, code="invalid_frame", what="frame"
        ) from None


class Credits:
    """Messages the client may still be sent: raised by flow frames, spent by sends."""

    def __init__(self, limit: int = CREDITS_MAX) -> None:
        self.limit = limit
        self.available = 0

    def grant(self, credits: int) -> None:
        """Add ``credits``; StreamProtocolError ``too_many_credits`` (nothing added) when more
        than ``limit`` would be outstanding."""
        if credits < 1:
            raise StreamProtocolError(f"a flow frame grants at least 1 credit, not {credits}")
        if self.available + credits > self.limit:
            raise StreamProtocolError(
                f"granting {credits} credits would put {self.available + credits} outstanding,"
                f" over the limit of {self.limit}",
                code="too_many_credits",
            )
        self.available += credits

    def spend(self, messages: int) -> None:
        """Spend one credit per message about to be sent; more than granted is a bug of the
        caller (it asks the dispatcher for at most ``available``)."""
        if not 0 <= messages <= self.available:
            raise ValueError(f"spending {messages} credits of {self.available}")
        self.available -= messages


def message_frame(message: MessageOut) -> str:
    """A ``message`` frame: the long-poll message with its frame type."""
    body: dict[str, Any] = {"type": "message", **message.model_dump()}
    return orjson.dumps(body).decode()


def error_frame(exc: BaseException) -> str:
    """An ``error`` frame: the HTTP error body (:func:`error_body`) with its frame type."""
    return orjson.dumps({"type": "error", **error_body(exc)}).decode()

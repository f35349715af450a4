"""The consumer stream protocol (``GET /v1/consumers/{id}/stream``, docs/http-api.md) without
any I/O: the frames a client may send, the credits it granted, the frames the server sends,
and the count of open streams. :mod:`danube.discovery.doors.http.stream` does the I/O around it.

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

from danube.discovery.doors.bodies.api import (
    FLOW_CREDITS_CAP,
    AckFrame,
    ClientFrame,
    FlowFrame,
    MessageOut,
    NackFrame,
)
from danube.discovery.errors import StreamProtocolError, error_body

__all__ = [
    "CREDITS_MAX",
    "FRAME_BYTES_MAX",
    "AckFrame",
    "Credits",
    "FlowFrame",
    "NackFrame",
    "error_frame",
    "message_frame",
    "parse_frame",
]

# Credits outstanding at once (granted, not yet spent): what a client may hold unread.
CREDITS_MAX = FLOW_CREDITS_CAP
# The largest frame a client may send (the WebSocket server closes with 1009 past it): room
# for an ack of ~10 000 refs; a client acks more in several frames.
FRAME_BYTES_MAX = 1024 * 1024

_FRAME: TypeAdapter[ClientFrame] = TypeAdapter(ClientFrame)


def parse_frame(text: str) -> FlowFrame | AckFrame | NackFrame:
    """One client frame; StreamProtocolError ``invalid_json``, ``unknown_field`` or
    ``invalid_frame`` when it is not one (an unknown ``type`` included)."""
    try:
        return _FRAME.validate_json(text)
    except ValidationError as exc:
        raise _violation(exc) from None


def _violation(exc: ValidationError) -> StreamProtocolError:
    errors = exc.errors()
    kinds = {str(error.get("type", "")) for error in errors}
    if "json_invalid" in kinds:
        return StreamProtocolError("the frame is not JSON", code="invalid_json")
    first = errors[0]
    where = ".".join(str(part) for part in first.get("loc", ())) or "frame"
    more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
    code = "unknown_field" if "extra_forbidden" in kinds else "invalid_frame"
    return StreamProtocolError(f"{where}: {first.get('msg', 'invalid')}{more}", code=code)


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

"""When a message read falls due: the delivery time its record carries (danube.wire.delay's
attributes, docs/policies.md "Delayed delivery"), read from the frame as it came. Every
message a delaying subscription reads passes here: the usual one, with no attributes or none
of these, costs the record header alone."""

from __future__ import annotations

import struct

from danube.frame import (
    RECORD_HEADER,
    RECORD_HEADER_BYTES,
    SEQUENCED_HEADER_BYTES,
    SEQUENCED_RECORD_VERSION,
    RawFrame,
)
from danube.frame.errors import FrameError
from danube.frame.record import read_attributes
from danube.wire.delay import deliver_at_ms

# What the name of each delivery-time attribute starts with: a record whose attributes do
# not hold it is not delayed, and they are not decoded.
_NAME_PART = b"danube.deliver_"


def due_of(payload: object) -> int | None:
    """When the record in ``payload`` (a frame as read) is due, Unix ms; None when it is
    not delayed. The usual record (no such attribute) costs the header alone (~1 µs)."""
    record = payload.record if isinstance(payload, RawFrame) else payload
    if not isinstance(record, bytes | bytearray | memoryview):
        return None
    view = memoryview(record)
    try:
        version, _, time_ms, _, _, producer_len, key_len, count, payload_len = (
            RECORD_HEADER.unpack_from(view, 0)
        )
        if not count:
            return None
        start = (
            SEQUENCED_HEADER_BYTES if version == SEQUENCED_RECORD_VERSION else RECORD_HEADER_BYTES
        )
        at = start + producer_len + key_len
        if _NAME_PART not in bytes(view[at : len(view) - payload_len]):
            return None
        attributes: dict[str, str] = {}
        read_attributes(view, at, len(view), count, attributes)
    except (FrameError, ValueError, IndexError, struct.error):
        return None
    return deliver_at_ms(attributes, int(time_ms))

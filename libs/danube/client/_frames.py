"""Delivered messages from a delivery batch (``application/x-danube-frames``, the
``danube.frames.v1`` WebSocket subprotocol; layout in danube.wire.delivery): the frames as
the WAL holds them, checked here, where their records are decoded (the hops between only
carried them). A frame that fails its check was damaged on the way: it is left out and
nacked, so that it comes again, read afresh from where it is stored.

This runs once per delivered message, so it walks the batch itself: one pass over the
body (as bytes; views only for the CRC) that splits, checks and decodes each frame and
builds its message, with no object in between (what ``decode_batch``, ``verify_frame`` and
``decode_record_fields`` would each build per message cost more than the decoding)."""

from __future__ import annotations

import logging
import struct
from typing import Protocol

from crc32c import crc32c

from danube.client.errors import ProtocolError
from danube.client.messages import Acknowledger, MessageRef, ReceivedMessage, received_message
from danube.frame import (
    FRAME_CRC_AT,
    FRAME_HEADER,
    FRAME_HEADER_BYTES,
    MAX_FRAME_PAYLOAD_BYTES,
    CorruptFrameError,
    FrameError,
)
from danube.frame.record_decode import decode_record_at
from danube.wire.delivery import ENTRY_BYTES, BatchFormatError, check_entries, read_head

log = logging.getLogger(__name__)

# A frame's header (danube.frame): offset, length, then crc32c over the bytes before it
# and the record.
_FRAME_HEADER = FRAME_HEADER
_CRC_AT = FRAME_CRC_AT
# An entry of the batch: partition index u16, redelivery count u32.
_ENTRY = struct.Struct("<HI")


class FrameChecker(Acknowledger, Protocol):
    """A consumer that takes back a message whose frame failed its check."""

    def corrupt(self, ref: MessageRef) -> None: ...


def decode_frames_batch(body: bytes, consumer: FrameChecker) -> tuple[list[ReceivedMessage], int]:
    """The messages of one delivery batch, in order, and how many the batch held; a corrupt
    one is handed to ``consumer.corrupt`` instead. ProtocolError when the layout is off
    (then nothing is handed out, nor nacked)."""
    try:
        head = read_head(body)
        check_entries(head)
    except BatchFormatError as exc:
        raise ProtocolError(f"delivery batch: {exc.message}") from exc
    data = body if isinstance(body, bytes) else bytes(body)
    view, names, count = head.view, head.names, head.message_count
    end = len(data)
    entry_at = head.entries_at
    pos = head.frames_at
    out: list[ReceivedMessage] = []
    corrupt: list[MessageRef] = []
    unpack_frame = _FRAME_HEADER.unpack_from
    unpack_entry = _ENTRY.unpack_from
    for _ in range(count):
        if end - pos < FRAME_HEADER_BYTES:
            raise ProtocolError(f"delivery batch: {count} entries, fewer whole frames")
        offset, length, crc = unpack_frame(data, pos)
        if length > MAX_FRAME_PAYLOAD_BYTES:
            raise ProtocolError(f"delivery batch: a frame of {length} bytes")
        frame_at = pos
        start = frame_at + FRAME_HEADER_BYTES
        pos = start + length
        if pos > end:
            raise ProtocolError(f"delivery batch: {count} entries, fewer whole frames")
        index, redelivery_count = unpack_entry(data, entry_at)
        entry_at += ENTRY_BYTES
        partition = names[index]
        try:
            actual = crc32c(view[start:pos], crc32c(view[frame_at : frame_at + _CRC_AT]))
            if actual != crc:
                reason = f"crc mismatch (stored {crc:#010x}, computed {actual:#010x})"
                raise CorruptFrameError(position=0, offset=offset, reason=reason)
            time_ms, producer, key, attributes, payload, schema_id, schema_version = (
                decode_record_at(data, start, pos)
            )
        except FrameError as exc:
            log.warning("%s@%d: %s; nacked", partition, offset, exc)
            corrupt.append(MessageRef(partition, offset))
            continue
        out.append(
            received_message(
                partition,
                offset,
                payload,
                key,
                attributes,
                time_ms,
                producer,
                redelivery_count,
                schema_id,
                schema_version,
                consumer,
            )
        )
    if pos != end:
        raise ProtocolError(f"delivery batch: {count} entries, not as many whole frames")
    for ref in corrupt:
        consumer.corrupt(ref)
    return out, count

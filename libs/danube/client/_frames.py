"""Delivered messages from a delivery batch (``application/x-danube-frames``, the
``danube.frames.v1`` WebSocket subprotocol; layout in danube.wire.delivery): the frames as
the WAL holds them, checked here, where their records are decoded (the hops between only
carried them). A frame that fails its check was damaged on the way: it is left out and
nacked, so that it comes again, read afresh from where it is stored."""

from __future__ import annotations

import logging
from typing import Protocol

from danube.client.errors import ProtocolError
from danube.client.messages import Acknowledger, MessageRef, ReceivedMessage
from danube.frame import FrameError, decode_record_fields, verify_frame
from danube.wire.delivery import BatchFormatError, decode_batch

log = logging.getLogger(__name__)


class FrameChecker(Acknowledger, Protocol):
    """A consumer that takes back a message whose frame failed its check."""

    def corrupt(self, ref: MessageRef) -> None: ...


def decode_frames_batch(body: bytes, consumer: FrameChecker) -> tuple[list[ReceivedMessage], int]:
    """The messages of one delivery batch, in order, and how many the batch held; a corrupt
    one is handed to ``consumer.corrupt`` instead. ProtocolError when the layout is off."""
    try:
        delivered = decode_batch(body)
    except BatchFormatError as exc:
        raise ProtocolError(f"delivery batch: {exc.message}") from exc
    out: list[ReceivedMessage] = []
    for message in delivered:
        try:
            fields = decode_record_fields(verify_frame(message.frame))
        except FrameError as exc:
            log.warning("%s@%d: %s; nacked", message.partition, message.offset, exc)
            consumer.corrupt(MessageRef(message.partition, message.offset))
            continue
        out.append(
            ReceivedMessage(
                partition=message.partition,
                offset=message.offset,
                payload=fields.payload,
                key=fields.key,
                attributes=fields.attributes,
                publish_time_ms=fields.publish_time_ms,
                producer=fields.producer,
                redelivery_count=message.redelivery_count,
                schema_id=fields.schema_id,
                schema_version=fields.schema_version,
                _consumer=consumer,
            )
        )
    return out, len(delivered)

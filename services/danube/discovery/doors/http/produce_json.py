"""The JSON produce body (docs/http-api.md, "Produce"): its payloads decoded, its sequences
read (the rules of danube.admission.sequences), its messages encoded as records, and the
answer's results. The HTTP door's own: the produce path (danube.discovery.produce.producer) takes
encoded records and answers where they went."""

from __future__ import annotations

import base64
import binascii
import time
from collections.abc import Sequence

from danube.admission import Admitted, Sequencing, Stamp
from danube.admission.chunks import check_chunked
from danube.admission.sequences import INVALID_SEQUENCE, gap, mixed
from danube.discovery.doors.bodies.produce import MessageIn, ProduceRequest, ProduceResult
from danube.discovery.errors import BadRequestError, TooLargeError
from danube.discovery.produce.producer import Producer, Stored
from danube.frame import Record, encode_record
from danube.wire import codes


def decode_payload(message: MessageIn, index: int, max_payload_bytes: int) -> bytes:
    """The payload bytes of ``message``; BadRequestError for bad base64, TooLargeError over
    the limit."""
    if message.encoding == "base64":
        try:
            payload = base64.b64decode(message.payload, validate=True)
        except (binascii.Error, ValueError) as exc:
            raise BadRequestError(
                f"messages[{index}].payload is not valid base64", code="bad_encoding"
            ) from exc
    else:
        try:
            payload = message.payload.encode("utf-8")
        except UnicodeEncodeError as exc:  # a lone surrogate escaped in the JSON
            raise BadRequestError(
                f"messages[{index}].payload is not valid Unicode text", code="bad_encoding"
            ) from exc
    if len(payload) > max_payload_bytes:
        raise TooLargeError(
            f"messages[{index}].payload is {len(payload)} bytes, over the limit of "
            f"{max_payload_bytes}",
            code=codes.PAYLOAD_TOO_LARGE,
            limit=max_payload_bytes,
        )
    return payload


def encode_batch(
    request: ProduceRequest,
    *,
    max_payload_bytes: int,
    max_messages: int,
    publish_time_ms: int,
    schema: Stamp | None = None,
) -> list[bytes]:
    """Every message as an encoded record, in order, or the first message's error."""
    payloads = decode_payloads(
        request, max_payload_bytes=max_payload_bytes, max_messages=max_messages
    )
    return encode_records(request, payloads, publish_time_ms=publish_time_ms, schema=schema)


def decode_payloads(
    request: ProduceRequest, *, max_payload_bytes: int, max_messages: int
) -> list[bytes]:
    """Every message's payload bytes, in order, or the first message's error."""
    if len(request.messages) > max_messages:
        raise TooLargeError(
            f"{len(request.messages)} messages, over the limit of {max_messages} per request",
            code="too_many_messages",
            limit=max_messages,
        )
    return [decode_payload(m, i, max_payload_bytes) for i, m in enumerate(request.messages)]


def encode_records(
    request: ProduceRequest,
    payloads: Sequence[bytes],
    *,
    publish_time_ms: int,
    schema: Stamp | None = None,
) -> list[bytes]:
    """The messages with their decoded ``payloads`` as encoded records, stamped with the
    schema they were checked against; InvalidRecordError (400) names the field."""
    return [
        encode_record(
            Record(
                payload=payload,
                publish_time_ms=publish_time_ms,
                producer=request.producer,
                key=message.key,
                attributes=message.record_attributes(),
                schema_id=None if schema is None else schema.schema_id,
                schema_version=None if schema is None else schema.version,
                sequence=message.sequence,
                producer_epoch=0 if message.sequence is None else request.producer_epoch,
            )
        )
        for message, payload in zip(request.messages, payloads, strict=True)
    ]


class JsonMessages:
    """A JSON body's messages as admission reads them (danube.admission.Messages):
    the payloads are decoded (base64 or UTF-8) when admission asks for their sizes, the
    first bad or oversize one refused as they go."""

    __slots__ = ("_decoded", "request")

    def __init__(self, request: ProduceRequest) -> None:
        self.request = request
        self._decoded: list[bytes] = []

    def __len__(self) -> int:
        return len(self.request.messages)

    def sequencing(self) -> Sequencing | None:
        return json_sequencing(self.request)

    def payload_sizes(self, payload_bytes_max: int) -> Sequence[int]:
        messages = self.request.messages
        self._decoded = [decode_payload(m, i, payload_bytes_max) for i, m in enumerate(messages)]
        return [len(payload) for payload in self._decoded]

    def payloads(self) -> Sequence[bytes]:
        """The decoded payloads (once :meth:`payload_sizes` decoded them)."""
        return self._decoded

    def check_chunked(self, limit: int) -> None:
        check_chunked((m.attributes for m in self.request.messages), limit)


def json_sequencing(request: ProduceRequest) -> Sequencing | None:
    """The run of a JSON produce's sequences, None for an unsequenced one; 400
    ``invalid_sequence`` naming the first message that breaks the rules."""
    sequences = [message.sequence for message in request.messages]
    if sequences[0] is None:
        if any(s is not None for s in sequences):
            raise mixed(0)
        if request.producer_epoch:
            raise BadRequestError(
                "producer_epoch is for sequenced messages: give every message a sequence",
                code=INVALID_SEQUENCE,
            )
        return None
    first = sequences[0]
    for index, sequence in enumerate(sequences):
        if sequence is None:
            raise mixed(index)
        if sequence != first + index:
            raise gap(index, sequence, first + index)
    return Sequencing(request.producer, request.producer_epoch, first, len(sequences))


def results(stored: Stored) -> list[ProduceResult]:
    """One result per message of a stored batch, in message order (``duplicate`` only on
    an idempotent producer's resend)."""
    names, offsets, duplicates = stored.names, stored.offsets, stored.duplicates
    return [
        ProduceResult(partition=str(names[p]), offset=offsets[i], duplicate=True)
        if duplicates[i]
        else ProduceResult(partition=str(names[p]), offset=offsets[i])
        for i, p in enumerate(stored.routed)
    ]


async def store_json(
    producer: Producer, admitted: Admitted, messages: JsonMessages
) -> list[ProduceResult]:
    """Store a JSON batch ``admitted`` (danube.admission); one result per message, in
    message order."""
    request = messages.request
    records = encode_records(
        request, messages.payloads(), publish_time_ms=int(time.time() * 1000), schema=admitted.stamp
    )
    keys = [m.key for m in request.messages]
    return results(await producer.store(admitted, records, keys, dispatch=request.dispatch))

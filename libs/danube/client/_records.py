"""The producer's binary body (``application/vnd.danube.records``, docs/http-api.md): each
message a record framed as the WAL frames it, offset 0 (:mod:`danube.frame.produce`); and the
answer's runs of offsets read back as one :class:`SendResult` per message. The JSON body's
head and the query of a binary one, and the JSON answer read back, too.

The record carries the producer's name and the time of ``send()`` (``publish_time_ms``,
this host's clock); the server checks every frame's CRC and every record before storing
any, gives the offsets, and stamps the schema of a topic that has one.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

import orjson

from danube.client.errors import InvalidMessageError, ProtocolError
from danube.client.messages import Payload, SendResult
from danube.frame.compression import CODEC_NONE
from danube.frame.produce import encode_produce_frame
from danube.frame.record import (
    MAX_ATTRIBUTE_NAME_BYTES,
    MAX_ATTRIBUTE_VALUE_BYTES,
    MAX_ATTRIBUTES,
    MAX_KEY_BYTES,
)
from danube.wire import codes

RECORDS_TYPE = "application/vnd.danube.records"


def _utf8(what: str, value: object, limit_bytes: int) -> bytes:
    if not isinstance(value, str):
        raise InvalidMessageError(f"{what} must be str")
    try:
        raw = value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise InvalidMessageError(f"{what} is not valid Unicode: {exc.reason}") from exc
    if len(raw) > limit_bytes:
        raise InvalidMessageError(f"{what} over {limit_bytes} bytes")
    return raw


CheckedFields = tuple[bytes, bytes | None, list[tuple[bytes, bytes]]]
"""A message's payload, key and attributes as a record carries them (UTF-8), every limit
checked (a plain tuple: one is made per message)."""


def checked_fields(
    payload: Payload,
    key: str | None,
    attributes: Mapping[str, str] | None,
    *,
    max_payload_bytes: int,
) -> CheckedFields:
    """The fields of one message, checked against every limit of a record (as the JSON
    form is), so a bad message fails alone instead of failing its batch."""
    if isinstance(payload, bytes):
        raw = payload
    elif isinstance(payload, str):
        try:
            raw = payload.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise InvalidMessageError(f"payload is not valid Unicode: {exc.reason}") from exc
    elif isinstance(payload, bytearray | memoryview):
        raw = bytes(payload)
    else:
        raise InvalidMessageError(f"payload must be bytes or str, not {type(payload).__name__}")
    if len(raw) > max_payload_bytes:
        raise InvalidMessageError(
            f"payload of {len(raw)} bytes is over {max_payload_bytes}", code=codes.PAYLOAD_TOO_LARGE
        )
    raw_key = None if key is None else _utf8("key", key, MAX_KEY_BYTES)
    raw_attributes: list[tuple[bytes, bytes]] = []
    if attributes:
        if len(attributes) > MAX_ATTRIBUTES:
            raise InvalidMessageError(f"{len(attributes)} attributes, at most {MAX_ATTRIBUTES}")
        for name, value in attributes.items():
            raw_attributes.append(
                (
                    _utf8("attribute name", name, MAX_ATTRIBUTE_NAME_BYTES),
                    _utf8(f"attribute {name!r} value", value, MAX_ATTRIBUTE_VALUE_BYTES),
                )
            )
    return raw, raw_key, raw_attributes


def encode_checked(
    fields: CheckedFields,
    *,
    producer: bytes,
    codec: int,
    sequence: int | None = None,
    producer_epoch: int = 0,
) -> bytes:
    """The produced frame of checked ``fields``; ``sequence``: a sequenced record (format
    version 2) with ``producer_epoch``; ``codec``: its payload compressed when that makes it
    smaller (danube.frame.compression; ``CODEC_NONE``: as is). No default: every way a
    producer encodes a message says how, so none sends plain what should be compressed."""
    payload, key, attributes = fields
    return encode_produce_frame(
        payload,
        producer=producer,
        publish_time_ms=time.time_ns() // 1_000_000,
        key=key,
        attributes=attributes,
        sequence=sequence,
        producer_epoch=producer_epoch,
        codec=codec,
    )


def encode_frame(
    payload: Payload,
    key: str | None,
    attributes: Mapping[str, str] | None,
    *,
    producer: bytes,
    max_payload_bytes: int,
    sequenced: bool = False,
    codec: int = CODEC_NONE,
) -> bytes:
    """One message as a produced frame; checks every limit of the record first
    (:func:`checked_fields`). ``sequenced``: a sequenced record (format version 2) with
    epoch and sequence 0, stamped when its batch is planned
    (:func:`danube.client._sequencing.stamp`). ``codec``: as :func:`encode_checked`; the
    limit holds the message before compression, as the server does."""
    fields = checked_fields(payload, key, attributes, max_payload_bytes=max_payload_bytes)
    return encode_checked(fields, producer=producer, sequence=0 if sequenced else None, codec=codec)


def results_of_runs(answer: Any, count: int) -> list[SendResult]:
    """One result per message from ``{"runs": [{"partition", "offset", "count"}, ...]}``; a
    run with ``"duplicate": true`` was stored before (an idempotent producer's resend)."""
    runs = answer.get("runs") if isinstance(answer, dict) else None
    if not isinstance(runs, list) or len(runs) > count:
        raise ProtocolError(f"produce answered {answer!r:.200} for {count} messages")
    results: list[SendResult] = []
    for run in runs:
        if not isinstance(run, dict):
            raise ProtocolError(f"produce run {run!r:.200} is not an object")
        partition, first, size = run.get("partition"), run.get("offset"), run.get("count")
        if (
            not isinstance(partition, str)
            or not isinstance(first, int)
            or not isinstance(size, int)
            or not 1 <= size <= count - len(results)
        ):
            raise ProtocolError(f"produce run {run!r:.200} is not partition, offset, count")
        duplicate = run.get("duplicate") is True
        results += [
            SendResult(partition, offset, duplicate) for offset in range(first, first + size)
        ]
    if len(results) != count:
        raise ProtocolError(f"produce answered {len(results)} results for {count} messages")
    return results


def request_head(name: str, dispatch: str, producer_id: str | None) -> bytes:
    """The JSON produce body up to the messages."""
    parts = [b'{"producer":', orjson.dumps(name), b',"dispatch":']
    parts.append(orjson.dumps(dispatch))
    if producer_id is not None:
        parts += [b',"producer_id":', orjson.dumps(producer_id)]
    parts.append(b',"messages":[')
    return b"".join(parts)


def request_params(dispatch: str, producer_id: str | None) -> dict[str, str | int]:
    """The query parameters of a binary produce (the JSON body's fields around messages)."""
    params: dict[str, str | int] = {"dispatch": dispatch}
    if producer_id is not None:
        params["producer_id"] = producer_id
    return params


def json_results(answer: Any, count: int) -> list[SendResult]:
    """One result per message from a JSON produce's ``{"results": [...]}``."""
    results = answer.get("results") if isinstance(answer, dict) else None
    if not isinstance(results, list) or len(results) != count:
        raise ProtocolError(f"produce answered {answer!r:.200} for {count} messages")
    out = []
    for result in results:
        if not isinstance(result, dict):
            raise ProtocolError(f"produce result {result!r:.200} is not an object")
        partition, offset = result.get("partition"), result.get("offset")
        if not isinstance(partition, str) or not isinstance(offset, int):
            raise ProtocolError(f"produce result {result!r:.200} lacks partition or offset")
        out.append(SendResult(partition, offset, result.get("duplicate") is True))
    return out

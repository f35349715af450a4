"""Messages as the SDK hands them out and takes them in, and their JSON form on the wire.

Payloads are bytes inside the mesh. On the HTTP API a payload travels as text when it is
valid UTF-8 (``"encoding": "utf8"``; decoding then encoding valid UTF-8 gives the same
bytes back) and as base64 otherwise, so the common text payload costs no inflation.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any, Literal, Protocol

import orjson

from danube.client.errors import InvalidArgumentError, InvalidMessageError, ProtocolError
from danube.frame.record import (
    MAX_ATTRIBUTE_NAME_BYTES,
    MAX_ATTRIBUTE_VALUE_BYTES,
    MAX_ATTRIBUTES,
    MAX_KEY_BYTES,
    MAX_PRODUCER_NAME_BYTES,
)
from danube.names import InvalidNameError, TopicName
from danube.wire import codes

Payload = bytes | str
DEFAULT_NAMESPACE = "default"
# ingest.max_message_bytes' default; a server configured lower answers 413 for the batch.
DEFAULT_MAX_PAYLOAD_BYTES = 512 * 1024


def topic_name(topic: str | TopicName) -> TopicName:
    """``/<ns>/<topic>``, or a bare ``<topic>`` of the ``default`` namespace; raises
    :class:`InvalidArgumentError` (code ``invalid_name``) for anything else."""
    if isinstance(topic, TopicName):
        return topic
    try:
        if "/" not in topic:
            return TopicName(DEFAULT_NAMESPACE, topic)
        return TopicName.parse(topic)
    except InvalidNameError as exc:
        raise InvalidArgumentError(exc.message, code=exc.code) from exc


def topic_path(topic: TopicName) -> str:
    """``{ns}/{topic}`` as the routes spell it."""
    return f"{topic.namespace}/{topic.topic}"


@dataclass(frozen=True, slots=True)
class Timestamp:
    """A position by time: the first message published at or after ``ms`` (Unix
    milliseconds), in every partition."""

    ms: int

    def __post_init__(self) -> None:
        if isinstance(self.ms, bool) or not isinstance(self.ms, int) or self.ms < 0:
            raise InvalidArgumentError(f"a timestamp is Unix milliseconds >= 0, got {self.ms!r}")


# Where a new subscription starts, or where a seek moves it: "latest", "earliest", an offset
# (in every partition) or a Timestamp.
Position = Literal["latest", "earliest"] | int | Timestamp


def position_json(position: Position) -> str | dict[str, int]:
    """The API's form of a position; InvalidArgumentError for anything else."""
    if isinstance(position, Timestamp):
        return {"timestamp_ms": position.ms}
    if position in ("latest", "earliest"):
        return str(position)
    if isinstance(position, int) and not isinstance(position, bool) and 0 <= position < 2**64:
        return {"offset": position}
    raise InvalidArgumentError(
        f"a position is latest, earliest, an offset or a Timestamp, not {position!r}"
    )


@dataclass(frozen=True, slots=True)
class Message:
    """A message to produce. ``key`` routes it (one key, one partition, in order) and is
    stored with it; ``attributes`` is a string map stored as is."""

    payload: Payload
    key: str | None = None
    attributes: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class SendResult:
    """Where a produced message is stored: the partition's full name and its offset;
    ``duplicate``: an idempotent producer's resend of a message stored before, at that
    offset (nothing was stored again)."""

    partition: str
    offset: int
    duplicate: bool = False


@dataclass(frozen=True, slots=True)
class MessageRef:
    """A delivered message as acks and nacks name it."""

    partition: str
    offset: int


class Acknowledger(Protocol):
    """What a received message acks and nacks through (its consumer)."""

    def ack(self, message: ReceivedMessage) -> None: ...

    def nack(self, message: ReceivedMessage, delay_ms: int = 0) -> None: ...


@dataclass(frozen=True, slots=True)
class ReceivedMessage:
    """A delivered message. ``redelivery_count`` is 0 on the first delivery."""

    partition: str
    offset: int
    payload: bytes
    key: str | None
    attributes: Mapping[str, str]
    publish_time_ms: int
    producer: str
    redelivery_count: int
    schema_id: int | None = None  # the schema the payload was checked against, if any
    schema_version: int | None = None
    _consumer: Acknowledger | None = field(default=None, repr=False, compare=False)

    @property
    def ref(self) -> MessageRef:
        """The partition and offset that name this message."""
        return MessageRef(self.partition, self.offset)

    @property
    def text(self) -> str:
        """The payload decoded as UTF-8 (raises UnicodeDecodeError when it is not text)."""
        return self.payload.decode("utf-8")

    def ack(self) -> None:
        """Acknowledge through the consumer that received it (queued, sent in batches)."""
        self._acknowledger().ack(self)

    def nack(self, delay_ms: int = 0) -> None:
        """Ask for redelivery after ``delay_ms`` (queued, sent in batches)."""
        self._acknowledger().nack(self, delay_ms)

    def _acknowledger(self) -> Acknowledger:
        if self._consumer is None:
            raise InvalidMessageError("this message was not received through a consumer")
        return self._consumer


# The fields of ReceivedMessage in order, each set by position in received_message().
_RECEIVED_FIELDS = (
    "partition",
    "offset",
    "payload",
    "key",
    "attributes",
    "publish_time_ms",
    "producer",
    "redelivery_count",
    "schema_id",
    "schema_version",
    "_consumer",
)
if tuple(item.name for item in fields(ReceivedMessage)) != _RECEIVED_FIELDS:
    raise AssertionError("received_message() must set every field of ReceivedMessage")
_RECEIVED_SETTERS: tuple[Any, ...] = tuple(
    getattr(ReceivedMessage, name).__set__ for name in _RECEIVED_FIELDS
)


def received_message(
    partition: str,
    offset: int,
    payload: bytes,
    key: str | None,
    attributes: Mapping[str, str],
    publish_time_ms: int,
    producer: str,
    redelivery_count: int,
    schema_id: int | None,
    schema_version: int | None,
    consumer: Acknowledger | None,
) -> ReceivedMessage:
    """``ReceivedMessage(...)`` with every field given, built as a decoder of many messages
    needs it: the frozen dataclass's ``__init__`` goes through ``object.__setattr__`` once
    per field, which cost more than decoding the record; this sets the slots directly (the
    same object, equal to the one ``__init__`` builds)."""
    message: ReceivedMessage = object.__new__(ReceivedMessage)
    (
        set_partition,
        set_offset,
        set_payload,
        set_key,
        set_attributes,
        set_time,
        set_producer,
        set_redelivery,
        set_schema_id,
        set_schema_version,
        set_consumer,
    ) = _RECEIVED_SETTERS
    set_partition(message, partition)
    set_offset(message, offset)
    set_payload(message, payload)
    set_key(message, key)
    set_attributes(message, attributes)
    set_time(message, publish_time_ms)
    set_producer(message, producer)
    set_redelivery(message, redelivery_count)
    set_schema_id(message, schema_id)
    set_schema_version(message, schema_version)
    set_consumer(message, consumer)
    return message


def _utf8_len(what: str, value: str) -> int:
    try:
        return len(value.encode("utf-8"))
    except UnicodeEncodeError as exc:
        raise InvalidMessageError(f"{what} is not valid Unicode: {exc.reason}") from exc


def check_producer_name(name: str) -> str:
    """``name`` when it fits a record, else :class:`InvalidMessageError`."""
    if not 0 < _utf8_len("producer name", name) <= MAX_PRODUCER_NAME_BYTES:
        raise InvalidMessageError(f"producer name must be 1..{MAX_PRODUCER_NAME_BYTES} bytes")
    return name


def _check_attributes(attributes: Mapping[str, str]) -> None:
    if len(attributes) > MAX_ATTRIBUTES:
        raise InvalidMessageError(f"{len(attributes)} attributes, at most {MAX_ATTRIBUTES}")
    for name, value in attributes.items():
        if not isinstance(name, str) or not isinstance(value, str):
            raise InvalidMessageError(f"attribute {name!r}: names and values must be str")
        if _utf8_len("attribute name", name) > MAX_ATTRIBUTE_NAME_BYTES:
            raise InvalidMessageError(f"attribute name over {MAX_ATTRIBUTE_NAME_BYTES} bytes")
        if _utf8_len("attribute value", value) > MAX_ATTRIBUTE_VALUE_BYTES:
            raise InvalidMessageError(
                f"attribute {name!r}: value over {MAX_ATTRIBUTE_VALUE_BYTES} bytes"
            )


def encode_message(message: Message, *, max_payload_bytes: int) -> bytes:
    """The JSON object of one message of a produce body; checks every limit of the record
    first, so a bad message fails alone instead of failing the batch it would join."""
    payload = message.payload
    if isinstance(payload, str):
        size = _utf8_len("payload", payload)
        wire: dict[str, Any] = {"payload": payload}
    elif isinstance(payload, bytes | bytearray | memoryview):
        raw = bytes(payload)
        size = len(raw)
        try:
            wire = {"payload": raw.decode("utf-8")}
        except UnicodeDecodeError:
            wire = {"payload": base64.b64encode(raw).decode("ascii"), "encoding": "base64"}
    else:
        raise InvalidMessageError(f"payload must be bytes or str, not {type(payload).__name__}")
    if size > max_payload_bytes:
        raise InvalidMessageError(
            f"payload of {size} bytes is over {max_payload_bytes}", code=codes.PAYLOAD_TOO_LARGE
        )
    if message.key is not None:
        if not isinstance(message.key, str):
            raise InvalidMessageError("key must be str")
        if _utf8_len("key", message.key) > MAX_KEY_BYTES:
            raise InvalidMessageError(f"key over {MAX_KEY_BYTES} bytes")
        wire["key"] = message.key
    if message.attributes:
        _check_attributes(message.attributes)
        wire["attributes"] = dict(message.attributes)
    return orjson.dumps(wire)


def _field(data: Mapping[str, Any], name: str, kind: type | tuple[type, ...]) -> Any:
    value = data.get(name)
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise ProtocolError(f"message field {name!r} missing or not {kind}: {value!r}")
    return value


def _optional_int(data: Mapping[str, Any], name: str) -> int | None:
    value = data.get(name)
    return None if value is None else int(_field(data, name, int))


def decode_message(data: Any, consumer: Acknowledger | None = None) -> ReceivedMessage:
    """A delivered message from its JSON object (long-poll or stream frame)."""
    if not isinstance(data, dict):
        raise ProtocolError(f"a message is a JSON object, got {type(data).__name__}")
    text = _field(data, "payload", str)
    encoding = data.get("encoding", "utf8")
    if encoding == "utf8":
        payload = text.encode("utf-8")
    elif encoding == "base64":
        try:
            payload = base64.b64decode(text, validate=True)
        except (binascii.Error, ValueError) as exc:
            raise ProtocolError(f"message payload is not base64: {exc}") from exc
    else:
        raise ProtocolError(f"unknown payload encoding {encoding!r}")
    key = data.get("key")
    attributes = data.get("attributes") or {}
    if key is not None and not isinstance(key, str):
        raise ProtocolError(f"message key is not a string: {key!r}")
    if not isinstance(attributes, dict):
        raise ProtocolError(f"message attributes are not an object: {attributes!r}")
    return ReceivedMessage(
        partition=_field(data, "partition", str),
        offset=_field(data, "offset", int),
        payload=payload,
        key=key,
        attributes=attributes,
        publish_time_ms=_field(data, "publish_time_ms", int),
        producer=_field(data, "producer", str),
        redelivery_count=_field(data, "redelivery_count", int),
        schema_id=_optional_int(data, "schema_id"),
        schema_version=_optional_int(data, "schema_version"),
        _consumer=consumer,
    )

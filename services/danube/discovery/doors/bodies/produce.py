"""The JSON bodies of the produce route (``POST /v1/topics/{ns}/{topic}/messages``,
docs/http-api.md): the messages, each checked against the record's limits, and one result per
message. As every request body of the API (:mod:`danube.discovery.doors.bodies.api`): unknown
fields refused, JSON types taken as they are, every integer bounded."""

from __future__ import annotations

import time
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, model_validator

from danube.frame import (
    MAX_ATTRIBUTE_NAME_BYTES,
    MAX_ATTRIBUTE_VALUE_BYTES,
    MAX_ATTRIBUTES,
    MAX_KEY_BYTES,
    MAX_PRODUCER_NAME_BYTES,
)
from danube.meta.records import Dispatch
from danube.wire.consume.models import Encoding
from danube.wire.delay import (
    DELAY_MS_MAX,
    DELIVER_AFTER_ATTRIBUTE,
    DELIVER_AT_ATTRIBUTE,
    delay_attributes,
)
from danube.wire.delivery import TTL_ATTRIBUTE, TTL_MS_MAX
from danube.wire.produce_binary import ProducerId

# A hard cap on the list whatever the settings say; discovery.max_produce_messages is the
# configured limit (checked with its own 413).
PRODUCE_MESSAGES_CAP = 100_000
# An idempotent producer's numbers (danube.frame.record, format version 2).
SEQUENCE_MAX = 2**64 - 1
PRODUCER_EPOCH_MAX = 2**32 - 1


class _Request(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


class _Response(BaseModel):
    model_config = ConfigDict(frozen=True)


class MessageIn(_Request):
    """One message to produce. ``payload`` is text (``utf8``) or base64 (``base64``)."""

    payload: str
    encoding: Encoding = "utf8"
    key: Annotated[str, Field(max_length=MAX_KEY_BYTES)] | None = None
    attributes: Annotated[
        dict[
            Annotated[str, Field(max_length=MAX_ATTRIBUTE_NAME_BYTES)],
            Annotated[str, Field(max_length=MAX_ATTRIBUTE_VALUE_BYTES)],
        ],
        Field(max_length=MAX_ATTRIBUTES),
    ] = Field(default_factory=dict)
    # An idempotent producer's number for the message in its stream to the partition
    # (docs/http-api.md, "Idempotent produce"): every message of a request has one, or none.
    sequence: Annotated[int, Field(ge=0, le=SEQUENCE_MAX)] | None = None
    # Its own time to live (docs/policies.md, "Message TTL"): stored as the attribute
    # danube.ttl_ms, which it replaces when both are given.
    ttl_ms: Annotated[int, Field(ge=1, le=TTL_MS_MAX)] | None = None
    # Its delivery time (docs/policies.md, "Delayed delivery"): one of the two, stored as
    # the attribute danube.deliver_at_ms or danube.deliver_after_ms (replacing one given).
    deliver_at_ms: Annotated[int, Field(ge=0)] | None = None
    deliver_after_ms: Annotated[int, Field(ge=0, le=DELAY_MS_MAX)] | None = None

    @model_validator(mode="after")
    def _one_delivery_time(self) -> MessageIn:
        # DelayError is a ValueError: answered 400 invalid_request naming the message.
        delivery_attributes(self)
        return self

    def record_attributes(self) -> dict[str, str]:
        """Its attributes as stored: ``ttl_ms`` and the delivery time among them when given."""
        if self.ttl_ms is None and self.deliver_at_ms is None and self.deliver_after_ms is None:
            return self.attributes
        stored = dict(self.attributes)
        delay = delivery_attributes(self)
        if delay:  # one time given replaces both attributes: a record never carries two
            stored.pop(DELIVER_AT_ATTRIBUTE, None)
            stored.pop(DELIVER_AFTER_ATTRIBUTE, None)
            stored.update(delay)
        if self.ttl_ms is not None:
            stored[TTL_ATTRIBUTE] = str(self.ttl_ms)
        return stored


def delivery_attributes(message: MessageIn) -> dict[str, str]:
    """The delay attributes of ``message`` (DelayError for a refused time)."""
    if message.deliver_at_ms is None and message.deliver_after_ms is None:
        return {}
    return delay_attributes(
        deliver_at_ms=message.deliver_at_ms,
        deliver_after_ms=message.deliver_after_ms,
        now_ms=int(time.time() * 1000),
    )


class ProduceRequest(_Request):
    """``POST /v1/topics/{ns}/{topic}/messages``. ``dispatch`` is used only when the topic
    is auto-created by this request."""

    messages: Annotated[list[MessageIn], Field(min_length=1, max_length=PRODUCE_MESSAGES_CAP)]
    producer: Annotated[str, Field(max_length=MAX_PRODUCER_NAME_BYTES)] = "http"
    dispatch: Dispatch = "reliable"
    # The producer session sending (docs/producers.md): required to produce to a topic held
    # by an exclusive producer, which must be this one. Not a keep-alive.
    producer_id: ProducerId | None = None
    # The version of the topic's schema subject the payloads were written with (checked and
    # stamped on every record: docs/schemas.md); None: the latest. Ignored without a schema.
    schema_version: Annotated[int, Field(ge=1, le=2**31)] | None = None
    # The incarnation of ``producer`` sending sequenced messages (POST
    # …/producers/{name}/epoch hands them out); only with sequences.
    producer_epoch: Annotated[int, Field(ge=0, le=PRODUCER_EPOCH_MAX)] = 0


class ProduceResult(_Response):
    """Where a message is stored; ``duplicate`` (only when true): an idempotent producer's
    resend, stored before at this offset (nothing was appended)."""

    partition: str
    offset: int
    duplicate: bool | None = None


class ProduceResponse(_Response):
    """One result per message, in message order."""

    results: list[ProduceResult]

"""The JSON bodies of the consume routes (docs/http-api.md, "Consume"), on discovery and on a
dispatcher's consume door alike: ack and nack requests, the client frames of a stream, and
the polled messages. Requests refuse unknown fields and take JSON types as they are, as
every request body of the API (danube.discovery.doors.bodies.api)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from danube.errors import BadRequestError
from danube.names import MAX_TOPIC_NAME_CHARS, TOPIC_NAME_PATTERN

Encoding = Literal["utf8", "base64"]
# The dispatcher's own limits (danube.wire.dispatcher.protocol), checked here for a clean 400.
ACK_MESSAGES_CAP = 100_000
NACK_DELAY_MS_CAP = 24 * 3600 * 1000
# Credits one flow frame of a consumer stream may grant.
FLOW_CREDITS_CAP = 10_000
# Offsets and times: what a signed 64-bit integer holds (any JSON client can send it).
INT64_MAX = 2**63 - 1


class _Request(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


class _Response(BaseModel):
    model_config = ConfigDict(frozen=True)


# A partition's name as a poll answered it. The pattern is documented, and checked by the route
# (400 invalid_partition).
PolledPartition = Annotated[
    str,
    Field(
        min_length=1,
        max_length=MAX_TOPIC_NAME_CHARS,
        json_schema_extra={"pattern": TOPIC_NAME_PATTERN},
    ),
]


class MessageRefIn(_Request):
    """One delivered message: its partition (as polled) and offset."""

    partition: PolledPartition
    offset: Annotated[int, Field(ge=0, le=INT64_MAX)]


class RefRangeIn(_Request):
    """Delivered messages ``first..last`` (both included) of one partition (as polled)."""

    partition: PolledPartition
    first: Annotated[int, Field(ge=0, le=INT64_MAX)]
    last: Annotated[int, Field(ge=0, le=INT64_MAX)]

    @model_validator(mode="after")
    def _forwards(self) -> RefRangeIn:
        if self.last < self.first:
            raise ValueError(f"last ({self.last}) is below first ({self.first})")
        return self


class AckRequest(_Request):
    """``POST /v1/consumers/{id}/ack`` and ``/nack``: ``messages`` one by one and ``ranges``
    of consecutive offsets (a consumer that acks in delivery order sends a few ranges, not
    an object per message), at least one ref and at most ``ACK_MESSAGES_CAP`` in all;
    ``delay_ms`` only matters to a nack."""

    messages: Annotated[list[MessageRefIn], Field(max_length=ACK_MESSAGES_CAP)] = []
    ranges: Annotated[list[RefRangeIn], Field(max_length=ACK_MESSAGES_CAP)] = []
    delay_ms: Annotated[int, Field(ge=0, le=NACK_DELAY_MS_CAP)] = 0

    @model_validator(mode="after")
    def _some_refs(self) -> AckRequest:
        if not self.messages and not self.ranges:
            raise ValueError("name at least one message (messages or ranges)")
        runs = sum(r.last - r.first + 1 for r in self.ranges)
        if len(self.messages) + runs > ACK_MESSAGES_CAP:
            raise ValueError(f"at most {ACK_MESSAGES_CAP} messages in one request")
        return self


# --- WebSocket stream frames from the client (GET /v1/consumers/{id}/stream) -----------


class FlowFrame(_Request):
    """``{"type": "flow", "credits": N}``: the client may take ``N`` more messages."""

    type: Literal["flow"]
    credits: Annotated[int, Field(ge=1, le=FLOW_CREDITS_CAP)]


class AckFrame(AckRequest):
    """``{"type": "ack", "messages": [...]}``: the body of ``POST .../ack``, typed."""

    type: Literal["ack"]


class NackFrame(AckRequest):
    """``{"type": "nack", "messages": [...], "delay_ms": N}``: the body of ``POST .../nack``."""

    type: Literal["nack"]


ClientFrame = Annotated[FlowFrame | AckFrame | NackFrame, Field(discriminator="type")]


# --- responses -------------------------------------------------------------------------


class MessageRefOut(_Response):
    partition: str
    offset: int


class AckResult(_Response):
    """An ack that did nothing for some refs: those, as sent."""

    not_in_flight: list[MessageRefOut]


class MessageOut(_Response):
    """One delivered message; ``payload`` is text when it is valid UTF-8, else base64."""

    partition: str
    offset: int
    payload: str
    encoding: Encoding
    key: str | None
    attributes: dict[str, str]
    publish_time_ms: int
    producer: str
    redelivery_count: int
    # The schema the payload was checked against, when the topic has one (docs/schemas.md).
    schema_id: int | None = None
    schema_version: int | None = None


class MessagesOut(_Response):
    """A poll's messages, in delivery order (offset order within a partition)."""

    messages: list[MessageOut]


def violation(
    exc: ValidationError,
    *,
    error: type[BadRequestError],
    code: str,
    what: str,
) -> BadRequestError:
    """The refusal of a stream frame or a request body (``what``) that does not validate:
    an ``error``: ``invalid_json``, ``unknown_field``, else ``code``, naming the
    first bad field by its path."""
    errors = exc.errors()
    kinds = {str(e.get("type", "")) for e in errors}
    if "json_invalid" in kinds:
        return error(f"the {what} is not JSON", code="invalid_json")
    first = errors[0]
    where = ".".join(str(part) for part in first.get("loc", ())) or what
    more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
    kind = "unknown_field" if "extra_forbidden" in kinds else code
    return error(f"{where}: {first.get('msg', 'invalid')}{more}", code=kind)


def parse_ack_body(body: bytes) -> AckRequest:
    """An ack or nack request's body; BadRequestError ``invalid_json``, ``unknown_field``
    or ``invalid_request`` (the first bad field named) when it is not one."""
    try:
        return AckRequest.model_validate_json(body)
    except ValidationError as exc:
        raise violation(exc, error=BadRequestError, code="invalid_request", what="body") from None

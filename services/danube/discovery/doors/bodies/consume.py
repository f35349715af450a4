"""The JSON bodies of a consumer's attach (``POST /v1/topics/{ns}/{topic}/subscriptions/{sub}
/consumers``, docs/http-api.md) and the start position it and a seek name. The bodies of
polls, acks and streams are :mod:`danube.wire.consume.models`'s, one definition for discovery
and a dispatcher's consume door."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag

from danube.meta.failure_policy import FailurePolicyIn
from danube.wire.consume.models import INT64_MAX
from danube.wire.opens import ConsumerOpen


class _Request(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


class _Response(BaseModel):
    model_config = ConfigDict(frozen=True)


class StartOffset(_Request):
    """Start every partition of a new subscription at this offset."""

    offset: Annotated[int, Field(ge=0, le=INT64_MAX)]


class StartTimestamp(_Request):
    """Start at the first message published at or after this time (Unix milliseconds), in
    every partition."""

    timestamp_ms: Annotated[int, Field(ge=0, le=INT64_MAX)]


# Union tags start with UNION_TAG_MARK (danube.wire.validation), which error messages leave out.


def _position_kind(value: Any) -> str | None:
    # Picks the one shape a position is meant to be, so an error names that shape's field
    # (``start.timestamp_ms: ... less than or equal to``), not every shape's complaint.
    if isinstance(value, StartOffset | StartTimestamp):
        return "~timestamp" if isinstance(value, StartTimestamp) else "~offset"
    if isinstance(value, dict):
        return "~timestamp" if "timestamp_ms" in value else "~offset"
    if value in ("latest", "earliest"):
        return "~named"
    return None


Position = Annotated[
    Annotated[Literal["latest", "earliest"], Tag("~named")]
    | Annotated[StartOffset, Tag("~offset")]
    | Annotated[StartTimestamp, Tag("~timestamp")],
    Discriminator(
        _position_kind,
        custom_error_type="invalid_position",
        custom_error_message='expected "latest", "earliest", {"offset": N} or {"timestamp_ms": T}',
    ),
]


class AttachRequest(ConsumerOpen):
    """``POST /v1/topics/{ns}/{topic}/subscriptions/{sub}/consumers``. ``type`` and
    ``start`` matter to the first attach, which creates the subscription (its name, type
    and key filters: danube.wire.opens, the rules every door's attach shares)."""

    start: Position = "latest"
    # Applied when this attach creates the subscription; another one: 409 policy_conflict.
    failure_policy: FailurePolicyIn | None = None


class AttachResponse(_Response):
    """The id to poll, ack, nack and detach with (it names topic and subscription), and
    the consume door of the dispatcher that owns the subscription: the same routes there,
    without discovery (docs/http-api.md, "Direct consume"; None: it has none)."""

    consumer_id: str
    url: str | None = None

"""What a client asks for when it opens a producer or a consumer, held to one set of rules
by every door that takes it: discovery's HTTP API (its bodies), the gRPC doors of discovery
and of the ingest leaders (danube.grpc_door.requests builds these models from a Danube
request's fields, so both refuse a bad value with the same code and message), and the
dispatcher's bus attach (danube.wire.dispatcher.protocol.AttachRequest), which every door's
attach becomes."""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, model_validator

from danube.meta.records import PRODUCER_NAME_CHARS_MAX, AccessMode, SubscriptionType

CONSUMER_NAME_CHARS_MAX = 128
# A key-shared consumer's key filters (glob patterns): how many, and how long each.
FILTERS_MAX = 32
FILTER_CHARS_MAX = 256

ConsumerName = Annotated[str, Field(min_length=1, max_length=CONSUMER_NAME_CHARS_MAX)]


class ProducerOpen(BaseModel):
    """``POST /v1/topics/{ns}/{topic}/producers``: open a producer session."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    name: Annotated[str, Field(min_length=1, max_length=PRODUCER_NAME_CHARS_MAX)]
    access_mode: AccessMode = "shared"


class ConsumerOpen(BaseModel):
    """A consumer's name, subscription type and key filters: what every door's attach
    takes (discovery's HTTP attach adds its start position and failure policy)."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    name: ConsumerName
    type: SubscriptionType = "exclusive"
    # key_shared only: glob patterns (fnmatch: *, ?, [...]) of the keys this consumer takes.
    key_filters: Annotated[
        list[Annotated[str, Field(min_length=1, max_length=FILTER_CHARS_MAX)]],
        Field(max_length=FILTERS_MAX),
    ] = []
    # It keeps a delayed message handed to it before its time until then (the SDK does): a
    # shared subscription hands such consumers delayed messages early (docs/policies.md,
    # "Delayed delivery"); others are never given one before its time.
    hold_delayed: bool = False

    @model_validator(mode="after")
    def _filters_need_key_shared(self) -> ConsumerOpen:
        if self.key_filters and self.type != "key_shared":
            raise ValueError(f"key_filters are for key_shared subscriptions, not {self.type}")
        return self

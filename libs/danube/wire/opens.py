"""What a client asks for when it opens a producer or a consumer, held to one set of rules
by every door that takes it: discovery's HTTP API (its bodies), and the gRPC doors of
discovery and of the ingest leaders (danube.grpc_door.requests builds these models from a
Danube request's fields, so both refuse a bad value with the same code and message)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from danube.meta.records import PRODUCER_NAME_CHARS_MAX, AccessMode
from danube.wire.dispatcher.protocol import FILTER_CHARS_MAX, FILTERS_MAX

CONSUMER_NAME_CHARS_MAX = 128


class ProducerOpen(BaseModel):
    """``POST /v1/topics/{ns}/{topic}/producers``: open a producer session."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    name: Annotated[str, Field(min_length=1, max_length=PRODUCER_NAME_CHARS_MAX)]
    access_mode: AccessMode = "shared"


class ConsumerOpen(BaseModel):
    """A consumer's name, subscription type and key filters: what every door's attach
    takes (discovery's HTTP attach adds its start position and failure policy)."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    name: Annotated[str, Field(min_length=1, max_length=CONSUMER_NAME_CHARS_MAX)]
    type: Literal["exclusive", "shared", "failover", "key_shared"] = "exclusive"
    # key_shared only: glob patterns (fnmatch: *, ?, [...]) of the keys this consumer takes.
    key_filters: Annotated[
        list[Annotated[str, Field(min_length=1, max_length=FILTER_CHARS_MAX)]],
        Field(max_length=FILTERS_MAX),
    ] = []

    @model_validator(mode="after")
    def _filters_need_key_shared(self) -> ConsumerOpen:
        if self.key_filters and self.type != "key_shared":
            raise ValueError(f"key_filters are for key_shared subscriptions, not {self.type}")
        return self

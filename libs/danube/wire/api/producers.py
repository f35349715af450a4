"""The answers of the producer session routes (docs/http-api.md, docs/producers.md)."""

from __future__ import annotations

from collections.abc import Sequence

from pydantic import BaseModel, ConfigDict

from danube.meta.records import AccessMode


class ProducerOpened(BaseModel):
    """The session opened: keep it alive at least every ``session_ttl_ms`` (better: a third
    of it) with ``POST …/producers/{producer_id}/keepalive``."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    producer_id: str
    access_mode: AccessMode
    session_ttl_ms: int


class ProducerOut(BaseModel):
    """One open producer session of a topic; ``topic`` names the partition when it was
    opened on one (as Danube's clients do)."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    producer_id: str
    topic: str
    name: str
    access_mode: AccessMode
    created_ms: int


class ProducerList(BaseModel):
    """The open producer sessions of a topic."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    producers: Sequence[ProducerOut]


class ProducerEpochOut(BaseModel):
    """``POST …/producers/{name}/epoch``: the producer's new epoch on the topic."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    producer: str
    epoch: int

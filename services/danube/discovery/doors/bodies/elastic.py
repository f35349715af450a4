"""The request body of the elasticity routes (docs/http-api.md, "Reassignments and drains"):
reassign a partition; the answers are :mod:`danube.wire.api.elastic`'s."""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, model_validator

from danube.meta.records import REPLICAS_MAX

NodeIdIn = Annotated[str, Field(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9._-]+$")]


class ReassignRequest(BaseModel):
    """``POST /v1/partitions/{ns}/{partition}/reassign``: the ingest nodes that keep the
    partition once the reassignment is done, preferred leader first (as many as it has
    now); ``catchup_bytes_s`` caps what the leader sends the new replicas (omitted: the
    cluster's ``ingest.catchup_bytes_s``)."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    replicas: Annotated[list[NodeIdIn], Field(min_length=1, max_length=REPLICAS_MAX)]
    catchup_bytes_s: Annotated[int, Field(ge=1024, le=2**40)] | None = None

    @model_validator(mode="after")
    def _distinct(self) -> ReassignRequest:
        if len(set(self.replicas)) != len(self.replicas):
            raise ValueError(f"replicas must be distinct nodes: {self.replicas}")
        return self

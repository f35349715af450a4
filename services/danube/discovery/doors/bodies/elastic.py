"""Bodies of the elasticity routes (docs/http-api.md, "Reassignments and drains"):
reassign a partition, list reassignments with their progress, drain a node."""

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


class _Response(BaseModel):
    model_config = ConfigDict(frozen=True)


class AssignmentOut(_Response):
    """A partition's replica set; while ``adding`` or ``removing`` is not empty a
    reassignment from ``original`` to ``target`` is under way."""

    partition: str
    replicas: list[str]
    target: list[str]
    original: list[str]
    adding: list[str]
    removing: list[str]
    catchup_bytes_s: int | None
    assigned_ms: int
    changed: bool = True  # False: it already was so (a repeated request)


class ReplicaProgress(_Response):
    """A replica being added: in the ISR yet, and how far behind the leader (messages;
    null when the leader did not answer)."""

    node_id: str
    in_isr: bool
    end: int | None
    lag: int | None


class ReassignmentOut(_Response):
    partition: str
    replicas: list[str]
    target: list[str]
    original: list[str]
    adding: list[str]
    removing: list[str]
    leader: str | None
    isr: list[str]
    catchup_bytes_s: int | None
    assigned_ms: int
    progress: list[ReplicaProgress]


class ReassignmentList(_Response):
    """Every partition with a reassignment under way (``truncated``: more than listed)."""

    reassignments: list[ReassignmentOut]
    truncated: bool


class DrainOut(_Response):
    """A node's drain: when it was asked (null: not drained), the partitions it still holds
    a replica of and those leaving it now, the subscriptions it still serves (a dispatcher);
    ``done`` once drained and holding nothing."""

    node_id: str
    drained: bool
    requested_ms: int | None
    replicas: list[str]
    leaving: list[str]
    subscriptions: list[str]  # (a dispatcher) the subscriptions it still serves
    kinds: list[str]  # the kinds it is drained as: ingest, dispatcher
    done: bool

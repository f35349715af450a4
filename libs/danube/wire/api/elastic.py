"""The answers of the elasticity routes (docs/http-api.md, "Reassignments and drains"): a
partition's replica set, the reassignments under way with their progress, a node's drain."""

from __future__ import annotations

from collections.abc import Sequence

from pydantic import BaseModel, ConfigDict


class _Response(BaseModel):
    model_config = ConfigDict(frozen=True, extra="ignore")


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
    progress: Sequence[ReplicaProgress]


class ReassignmentList(_Response):
    """Every partition with a reassignment under way (``truncated``: more than listed)."""

    reassignments: Sequence[ReassignmentOut]
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

"""The request bodies of the public HTTP API (docs/http-api.md): namespaces, topics,
subscriptions (sought, skipped), partitions (moved, uploads skipped), and the error and
readiness answers; those of produce (:mod:`~danube.discovery.doors.bodies.produce`), attach
(:mod:`~danube.discovery.doors.bodies.consume`), policies, schemas, elasticity and the
console are beside it; the answers, which the SDK reads too, are :mod:`danube.wire.api`'s.
Requests refuse unknown fields (``extra="forbid"``), so a typo is a 400 rather than a
silently ignored setting, and take JSON types as they are (``strict``: ``true`` is not an
integer, ``"10"`` is not a number). Every integer has both bounds, given in the OpenAPI;
past them it is a 400 naming the field's path, before anything is stored or encoded."""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, model_validator

from danube.discovery.doors.bodies.consume import Position
from danube.discovery.doors.bodies.policies import PoliciesSpec
from danube.discovery.errors import BadRequestError
from danube.meta.records import (
    REPLICAS_MAX,
    Dispatch,
    Durability,
    NamespacePolicy,
    RetentionPolicy,
    TopicConfig,
)
from danube.names import PARTITIONS_MAX
from danube.wire.consume.models import INT64_MAX

# Retention so that the time in milliseconds and the size in bytes stay 64-bit integers.
RETENTION_MINUTES_MAX = INT64_MAX // 60_000
RETENTION_MB_MAX = INT64_MAX // 2**20


class _Request(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


class _Response(BaseModel):
    model_config = ConfigDict(frozen=True)


# --- requests --------------------------------------------------------------------------


class RetentionSpec(_Request):
    """How long a topic's data stays in object storage (``null``: no limit)."""

    time_minutes: Annotated[int, Field(ge=1, le=RETENTION_MINUTES_MAX)] | None = None
    size_mb: Annotated[int, Field(ge=1, le=RETENTION_MB_MAX)] | None = None

    def policy(self) -> RetentionPolicy:
        """The stored form."""
        return RetentionPolicy(time_minutes=self.time_minutes, size_mb=self.size_mb)


class NamespaceSpec(_Request):
    """``PUT /v1/namespaces/{ns}`` (the body may be omitted: the defaults apply)."""

    max_topics: Annotated[int, Field(ge=0, le=1_000_000)] = 10_000
    retention: RetentionSpec = RetentionSpec()
    # The defaults of the namespace's new topics (docs/replication.md); null: the cluster's.
    replication_factor: Annotated[int, Field(ge=1, le=REPLICAS_MAX)] | None = None
    min_insync_replicas: Annotated[int, Field(ge=1, le=REPLICAS_MAX)] | None = None
    # What the namespace's topics hold to where they set nothing (docs/policies.md).
    policies: PoliciesSpec = PoliciesSpec()

    def stored(self) -> NamespacePolicy:
        """The policy it asks for (its ``created_ms`` is the catalog's to set)."""
        return NamespacePolicy(
            created_ms=0,
            max_topics=self.max_topics,
            retention=self.retention.policy(),
            replication_factor=self.replication_factor,
            min_insync_replicas=self.min_insync_replicas,
            policies=self.policies.stored(),
        )


class NamespacePatch(_Request):
    """``PATCH /v1/namespaces/{ns}``: the fields given replace the stored ones (``retention``
    as a whole; ``null`` resets a replication default to the cluster's); the rest stay."""

    max_topics: Annotated[int, Field(ge=0, le=1_000_000)] | None = None
    retention: RetentionSpec | None = None
    replication_factor: Annotated[int, Field(ge=1, le=REPLICAS_MAX)] | None = None
    min_insync_replicas: Annotated[int, Field(ge=1, le=REPLICAS_MAX)] | None = None
    # The policy fields given replace the stored ones; null unsets one.
    policies: PoliciesSpec | None = None

    def changed(self) -> list[str]:
        """The fields it changes, sorted."""
        fields = ("max_topics", "replication_factor", "min_insync_replicas", "retention")
        given = self.model_fields_set
        return sorted(
            [f for f in fields if f in given] + ["policies"] * (self.policies is not None)
        )

    def applied_to(self, current: NamespacePolicy) -> NamespacePolicy:
        """``current`` with the fields given replaced (``retention`` as a whole; ``null``
        resets a replication default); 400 when ``max_topics`` is null."""
        given = self.model_fields_set
        if "max_topics" in given and self.max_topics is None:
            raise BadRequestError("max_topics cannot be null", code="invalid_request")
        changes: dict[str, object] = {
            field: getattr(self, field)
            for field in ("max_topics", "replication_factor", "min_insync_replicas")
            if field in given
        }
        if "retention" in given:
            retention = self.retention
            changes["retention"] = RetentionPolicy() if retention is None else retention.policy()
        if self.policies is not None:
            changes["policies"] = self.policies.applied_to(current.policies)
        return NamespacePolicy.model_validate({**current.model_dump(), **changes})


class TopicSpec(_Request):
    """``PUT /v1/topics/{ns}/{topic}``: 0 partitions is one unpartitioned topic."""

    partitions: Annotated[int, Field(ge=0, le=PARTITIONS_MAX)] = 0
    dispatch: Dispatch = "reliable"
    durability: Durability = "fsync"
    retention: RetentionSpec = RetentionSpec()
    # Copies of each partition's log and how many must hold a message before it is
    # acknowledged (docs/replication.md); null: the namespace's, else the cluster's.
    replication_factor: Annotated[int, Field(ge=1, le=REPLICAS_MAX)] | None = None
    min_insync_replicas: Annotated[int, Field(ge=1, le=REPLICAS_MAX)] | None = None
    # Its limits (docs/policies.md); what it leaves unset: the namespace's, else none.
    policies: PoliciesSpec = PoliciesSpec()

    def stored(self) -> TopicConfig:
        """The config it asks for (its ``created_ms`` is the catalog's to set)."""
        return TopicConfig(
            partitions=self.partitions,
            dispatch=self.dispatch,
            durability=self.durability,
            retention=self.retention.policy(),
            created_ms=0,
            replication_factor=self.replication_factor,
            min_insync_replicas=self.min_insync_replicas,
            policies=self.policies.stored(),
        )


class SeekRequest(_Request):
    """``POST /v1/topics/{ns}/{topic}/subscriptions/{sub}/seek``: move the cursor of every
    partition (unacked messages included)."""

    position: Position


class SkipRequest(_Request):
    """``POST /v1/topics/{ns}/{topic}/subscriptions/{sub}/skip``: move one partition's cursor
    forward past offsets on purpose (damaged ones). ``partition`` is its index (omit it for an
    unpartitioned topic); ``to_offset`` omitted: past the damage that stops the partition."""

    partition: Annotated[int, Field(ge=0, le=2**31 - 1)] | None = None
    to_offset: Annotated[int, Field(ge=0, le=2**64 - 1)] | None = None


class MoveRequest(_Request):
    """``POST /v1/partitions/{ns}/{partition}/move``: the ingest nodes that keep the
    partition from now on; ``unclean`` accepts giving up what only the old replicas held."""

    replicas: Annotated[
        list[Annotated[str, Field(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9._-]+$")]],
        Field(min_length=1, max_length=REPLICAS_MAX),
    ]
    unclean: bool = False

    @model_validator(mode="after")
    def _distinct(self) -> MoveRequest:
        if len(set(self.replicas)) != len(self.replicas):
            raise ValueError(f"replicas must be distinct nodes: {self.replicas}")
        return self


class SkipUploadRequest(_Request):
    """``POST /v1/partitions/{ns}/{partition}/uploads/skip``: let uploads go on past the
    damaged range they stopped at (``to_offset`` omitted: its end)."""

    to_offset: Annotated[int, Field(ge=1, le=2**64 - 1)] | None = None


# --- responses -------------------------------------------------------------------------


class ErrorDetail(_Response):
    code: str
    message: str


class ErrorBody(_Response):
    """Every error answer: ``{"error": {"code": "...", "message": "..."}}``."""

    error: ErrorDetail


class ReadyOut(_Response):
    """``GET /readyz``: whether the bus is connected and etcd answers."""

    ready: bool

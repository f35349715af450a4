"""The JSON bodies of the public HTTP API (docs/http-api.md): namespaces, topics, lookups,
subscriptions (listed, sought, skipped), partitions (moved, uploads skipped), the cluster and
errors; those of produce (:mod:`~danube.discovery.doors.bodies.produce`), attach
(:mod:`~danube.discovery.doors.bodies.consume`), policies, producers, schemas, elasticity
and the console are beside it. Requests refuse unknown fields (``extra="forbid"``), so a
typo is a 400 rather than a silently ignored setting, and take JSON types as they are
(``strict``: ``true`` is not an integer, ``"10"`` is not a number). Every integer has both
bounds, given in the OpenAPI; past them it is a 400 naming the field's path, before
anything is stored or encoded."""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, model_validator

from danube.discovery.doors.bodies.consume import Position
from danube.discovery.doors.bodies.policies import PoliciesSpec
from danube.discovery.doors.bodies.producers import ProducerOut
from danube.discovery.errors import BadRequestError
from danube.meta.failure_policy import FailurePolicy
from danube.meta.records import (
    REPLICAS_MAX,
    Dispatch,
    Durability,
    NamespacePolicy,
    Policies,
    RetentionPolicy,
    SubscriptionType,
    TopicConfig,
)
from danube.names import PARTITIONS_MAX
from danube.wire.consume.models import INT64_MAX

# doors/http/multi_session.py reads MessageOut from here (defined once, in
# danube.wire.consume.models).
from danube.wire.consume.models import MessageOut as MessageOut

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


class NamespaceOut(_Response):
    name: str
    max_topics: int
    retention: RetentionPolicy
    created_ms: int
    replication_factor: int | None = None
    min_insync_replicas: int | None = None
    policies: Policies = Policies()


class NamespaceList(_Response):
    namespaces: list[str]


class TopicList(_Response):
    namespace: str
    topics: list[str]


class OwnerOut(_Response):
    node_id: str
    epoch: int


class PartitionOut(_Response):
    name: str
    owner: OwnerOut | None


class LookupPartitionOut(PartitionOut):
    # Where producers reach the owner's data door (DESIGN §10): None when it has none or
    # nobody owns the partition now.
    url: str | None


class TopicConfigOut(_Response):
    partitions: int
    dispatch: Dispatch
    durability: Durability
    retention: RetentionPolicy
    created_ms: int
    replication_factor: int | None = None
    min_insync_replicas: int | None = None
    # The topic's own policies, and those in effect (the namespace's where it sets none).
    policies: Policies = Policies()
    effective_policies: Policies = Policies()


class TopicOut(_Response):
    """``PUT`` answer: the topic's name and config."""

    name: str
    config: TopicConfigOut


class FollowerOut(_Response):
    """A follower as its leader sees it: its durable end and how far behind it is
    (``null`` until it fetched in this leader's epoch)."""

    end: int | None
    lag: int | None


class UploadDamageOut(_Response):
    """Uploads of the partition stop at ``from_offset``: the WAL has no intact copy of
    ``[from_offset, to_offset)``; ``file`` is the damaged segment."""

    from_offset: int
    to_offset: int
    file: str


class DroppedOut(_Response):
    messages: int
    size_bytes: int


class RetentionDroppedOut(_Response):
    """What retention removed from the partition's tiers so far, by tier and reason:
    ``*_acked`` every subscription had acknowledged (queue retention), ``*_limits`` the time
    and size limits took (docs/retention.md, "Accounting")."""

    wal_acked: DroppedOut
    wal_limits: DroppedOut
    cloud_acked: DroppedOut
    cloud_limits: DroppedOut


class OffsetsOut(_Response):
    """Offsets and replication from the partition's leader (``null`` when it does not
    answer), and how far the partition is in object storage (``null`` before the first
    upload). ``next_offset`` is the high watermark: the end every in-sync replica holds,
    the end readers see."""

    wal_start: int | None
    next_offset: int | None
    uploaded_through: int | None
    leader_epoch: int | None = None
    replicas: list[str] = []
    isr: list[str] = []
    leader_end: int | None = None
    followers: dict[str, FollowerOut] = {}
    upload_damaged: UploadDamageOut | None = None
    upload_skipped_offsets: int = 0
    retention_dropped: RetentionDroppedOut | None = None  # null: retention removed nothing yet


class PartitionDetail(_Response):
    name: str
    owner: OwnerOut | None
    offsets: OffsetsOut


class SubscriptionPartitionOut(_Response):
    """A subscription in one partition: its cursor (every offset below it is acked; ``null``
    before its first write), the acks beyond it, the partition's end (ingest's next durable
    offset; ``null`` when its owner does not answer) and the backlog between them."""

    name: str
    cursor: int | None
    acked_beyond: int
    end_offset: int | None
    backlog: int | None
    # A poison message holds the partition (failure policy "block"): its offset.
    blocked_offset: int | None = None


class SubscriptionConsumerOut(_Response):
    """An attached consumer: its public id, name and messages it holds unacked."""

    consumer_id: str
    name: str
    unacked: int


class SubscriptionOut(_Response):
    """A subscription; ``backlog`` sums the partitions whose backlog is known; ``owner`` is
    the dispatcher serving it (``null``: none right now, and then no consumers)."""

    name: str
    type: SubscriptionType
    created_ms: int
    owner: OwnerOut | None
    backlog: int
    partitions: list[SubscriptionPartitionOut]
    consumers: list[SubscriptionConsumerOut]
    # As set (null: the cluster's) and, when a dispatcher serves it, as in effect there.
    failure_policy: FailurePolicy | None = None
    effective_failure_policy: FailurePolicy | None = None
    # Messages let go past their TTL since its dispatcher serves it (null: not served).
    expired: int | None = None
    # Delayed messages its dispatcher holds, not due or not acked yet (null: not served).
    delayed: int | None = None


class SubscriptionList(_Response):
    topic: str
    subscriptions: list[SubscriptionOut]


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


class SkipUploadOut(_Response):
    """Uploads go on at ``to_offset``; ``[from_offset, to_offset)`` is never uploaded."""

    partition: str
    from_offset: int
    to_offset: int
    skipped: int


class MoveOut(_Response):
    """What a move did. Unclean: the log continues at ``continues_at``; offsets from
    ``given_up_from`` (the cloud tier's end) on that only the old replicas held are given up
    (those below ``continues_at`` are a gap readers skip)."""

    partition: str
    previous_replicas: list[str]
    replicas: list[str]
    unclean: bool
    continues_at: int | None = None
    given_up_from: int | None = None


class SeekPartitionOut(_Response):
    name: str
    offset: int


class SkipResponse(_Response):
    """What a skip did: ``partition``'s cursor moved from ``from_offset`` to ``to_offset``;
    the ``skipped`` offsets between are never delivered to this subscription."""

    partition: str
    from_offset: int
    to_offset: int
    skipped: int


class SeekResponse(_Response):
    """Where the seek put the cursor of each partition."""

    partitions: list[SeekPartitionOut]


class TopicDetail(_Response):
    name: str
    config: TopicConfigOut
    partitions: list[PartitionDetail]
    subscriptions: list[SubscriptionOut]
    producers: list[ProducerOut] = []


class SubscriptionLookupOut(_Response):
    """Who owns a subscription now, and its consume door (DESIGN §10): None when nobody
    owns it (the next attach claims it) or its owner serves none."""

    name: str
    owner: str | None
    url: str | None


class LookupOut(_Response):
    name: str
    dispatch: Dispatch
    partitions: list[LookupPartitionOut]
    # Asked with ?subscription=: that subscription's owner and consume door.
    subscription: SubscriptionLookupOut | None = None


class NodeOut(_Response):
    node_id: str
    address: str | None
    started_ms: int
    drained: bool = False  # an operator drained it (ingest: docs/operations.md)


class ControllerOut(_Response):
    leader: str | None


class ClusterOut(_Response):
    nodes: dict[str, list[NodeOut]]
    controller: ControllerOut

"""The JSON bodies of the public HTTP API (docs/http-api.md). Requests refuse unknown
fields (``extra="forbid"``), so a typo is a 400 rather than a silently ignored setting, and
take JSON types as they are (``strict``: ``true`` is not an integer, ``"10"`` is not a
number). Every integer has both bounds, given in the OpenAPI; past them it is a 400 naming
the field's path, before anything is stored or encoded."""

from __future__ import annotations

import time
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag, model_validator

from danube.discovery.doors.bodies.policies import PoliciesSpec
from danube.discovery.doors.bodies.producers import ProducerId, ProducerOut
from danube.discovery.errors import BadRequestError
from danube.frame import (
    MAX_ATTRIBUTE_NAME_BYTES,
    MAX_ATTRIBUTE_VALUE_BYTES,
    MAX_ATTRIBUTES,
    MAX_KEY_BYTES,
    MAX_PRODUCER_NAME_BYTES,
)
from danube.meta.failure_policy import FailurePolicy, FailurePolicyIn
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
from danube.wire.consume.models import (
    ACK_MESSAGES_CAP as ACK_MESSAGES_CAP,
)
from danube.wire.consume.models import (
    FLOW_CREDITS_CAP as FLOW_CREDITS_CAP,
)
from danube.wire.consume.models import INT64_MAX as INT64_MAX
from danube.wire.consume.models import (
    NACK_DELAY_MS_CAP as NACK_DELAY_MS_CAP,
)
from danube.wire.consume.models import AckFrame as AckFrame
from danube.wire.consume.models import AckRequest as AckRequest
from danube.wire.consume.models import AckResult as AckResult
from danube.wire.consume.models import ClientFrame as ClientFrame
from danube.wire.consume.models import Encoding
from danube.wire.consume.models import FlowFrame as FlowFrame
from danube.wire.consume.models import MessageOut as MessageOut
from danube.wire.consume.models import MessageRefIn as MessageRefIn
from danube.wire.consume.models import MessageRefOut as MessageRefOut
from danube.wire.consume.models import MessagesOut as MessagesOut
from danube.wire.consume.models import NackFrame as NackFrame
from danube.wire.consume.models import RefRangeIn as RefRangeIn
from danube.wire.delay import (
    DELAY_MS_MAX,
    DELIVER_AFTER_ATTRIBUTE,
    DELIVER_AT_ATTRIBUTE,
    delay_attributes,
)
from danube.wire.delivery import TTL_ATTRIBUTE, TTL_MS_MAX
from danube.wire.opens import ConsumerOpen

# A hard cap on the list whatever the settings say; discovery.max_produce_messages is the
# configured limit (checked with its own 413).
PRODUCE_MESSAGES_CAP = 100_000
# An idempotent producer's numbers (danube.frame.record, format version 2).
SEQUENCE_MAX = 2**64 - 1
PRODUCER_EPOCH_MAX = 2**32 - 1
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


class MessageIn(_Request):
    """One message to produce. ``payload`` is text (``utf8``) or base64 (``base64``)."""

    payload: str
    encoding: Encoding = "utf8"
    key: Annotated[str, Field(max_length=MAX_KEY_BYTES)] | None = None
    attributes: Annotated[
        dict[
            Annotated[str, Field(max_length=MAX_ATTRIBUTE_NAME_BYTES)],
            Annotated[str, Field(max_length=MAX_ATTRIBUTE_VALUE_BYTES)],
        ],
        Field(max_length=MAX_ATTRIBUTES),
    ] = Field(default_factory=dict)
    # An idempotent producer's number for the message in its stream to the partition
    # (docs/http-api.md, "Idempotent produce"): every message of a request has one, or none.
    sequence: Annotated[int, Field(ge=0, le=SEQUENCE_MAX)] | None = None
    # Its own time to live (docs/policies.md, "Message TTL"): stored as the attribute
    # danube.ttl_ms, which it replaces when both are given.
    ttl_ms: Annotated[int, Field(ge=1, le=TTL_MS_MAX)] | None = None
    # Its delivery time (docs/policies.md, "Delayed delivery"): one of the two, stored as
    # the attribute danube.deliver_at_ms or danube.deliver_after_ms (replacing one given).
    deliver_at_ms: Annotated[int, Field(ge=0)] | None = None
    deliver_after_ms: Annotated[int, Field(ge=0, le=DELAY_MS_MAX)] | None = None

    @model_validator(mode="after")
    def _one_delivery_time(self) -> MessageIn:
        # DelayError is a ValueError: answered 400 invalid_request naming the message.
        delivery_attributes(self)
        return self

    def record_attributes(self) -> dict[str, str]:
        """Its attributes as stored: ``ttl_ms`` and the delivery time among them when given."""
        if self.ttl_ms is None and self.deliver_at_ms is None and self.deliver_after_ms is None:
            return self.attributes
        stored = dict(self.attributes)
        delay = delivery_attributes(self)
        if delay:  # one time given replaces both attributes: a record never carries two
            stored.pop(DELIVER_AT_ATTRIBUTE, None)
            stored.pop(DELIVER_AFTER_ATTRIBUTE, None)
            stored.update(delay)
        if self.ttl_ms is not None:
            stored[TTL_ATTRIBUTE] = str(self.ttl_ms)
        return stored


def delivery_attributes(message: MessageIn) -> dict[str, str]:
    """The delay attributes of ``message`` (DelayError for a refused time)."""
    if message.deliver_at_ms is None and message.deliver_after_ms is None:
        return {}
    return delay_attributes(
        deliver_at_ms=message.deliver_at_ms,
        deliver_after_ms=message.deliver_after_ms,
        now_ms=int(time.time() * 1000),
    )


class ProduceRequest(_Request):
    """``POST /v1/topics/{ns}/{topic}/messages``. ``dispatch`` is used only when the topic
    is auto-created by this request."""

    messages: Annotated[list[MessageIn], Field(min_length=1, max_length=PRODUCE_MESSAGES_CAP)]
    producer: Annotated[str, Field(max_length=MAX_PRODUCER_NAME_BYTES)] = "http"
    dispatch: Dispatch = "reliable"
    # The producer session sending (docs/producers.md): required to produce to a topic held
    # by an exclusive producer, which must be this one. Not a keep-alive.
    producer_id: ProducerId | None = None
    # The version of the topic's schema subject the payloads were written with (checked and
    # stamped on every record: docs/schemas.md); None: the latest. Ignored without a schema.
    schema_version: Annotated[int, Field(ge=1, le=2**31)] | None = None
    # The incarnation of ``producer`` sending sequenced messages (POST
    # …/producers/{name}/epoch hands them out); only with sequences.
    producer_epoch: Annotated[int, Field(ge=0, le=PRODUCER_EPOCH_MAX)] = 0


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


class ProduceResult(_Response):
    """Where a message is stored; ``duplicate`` (only when true): an idempotent producer's
    resend, stored before at this offset (nothing was appended)."""

    partition: str
    offset: int
    duplicate: bool | None = None


class ProduceResponse(_Response):
    """One result per message, in message order."""

    results: list[ProduceResult]


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


class AttachResponse(_Response):
    """The id to poll, ack, nack and detach with (it names topic and subscription), and
    the consume door of the dispatcher that owns the subscription: the same routes there,
    without discovery (docs/http-api.md, "Direct consume"; None: it has none)."""

    consumer_id: str
    url: str | None = None

"""The answers of the admin routes (docs/http-api.md): the cluster, namespaces, topics and
their partitions (owner, offsets, replication), lookups, a topic's subscriptions (cursors,
backlog, consumers, failure policy), seeks and skips, partition moves and upload skips."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from pydantic import BaseModel, ConfigDict

from danube.meta.failure_policy import FailurePolicy
from danube.meta.records import Dispatch, Durability, Policies, RetentionPolicy, SubscriptionType
from danube.wire.api.producers import ProducerOut


class _Response(BaseModel):
    model_config = ConfigDict(frozen=True, extra="ignore")


# --- namespaces and topics -------------------------------------------------------------


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


# --- partitions ------------------------------------------------------------------------


class OwnerOut(_Response):
    node_id: str
    epoch: int


class PartitionOut(_Response):
    name: str
    owner: OwnerOut | None


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
    followers: Mapping[str, FollowerOut] = {}
    upload_damaged: UploadDamageOut | None = None
    upload_skipped_offsets: int = 0
    retention_dropped: RetentionDroppedOut | None = None  # null: retention removed nothing yet


class PartitionDetail(_Response):
    name: str
    owner: OwnerOut | None
    offsets: OffsetsOut


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


class SkipUploadOut(_Response):
    """Uploads go on at ``to_offset``; ``[from_offset, to_offset)`` is never uploaded."""

    partition: str
    from_offset: int
    to_offset: int
    skipped: int


# --- subscriptions ---------------------------------------------------------------------


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
    partitions: Sequence[SubscriptionPartitionOut]
    consumers: Sequence[SubscriptionConsumerOut]
    # As set (null: the cluster's) and, when a dispatcher serves it, as in effect there.
    failure_policy: FailurePolicy | None = None
    effective_failure_policy: FailurePolicy | None = None
    # Messages let go past their TTL since its dispatcher serves it (null: not served).
    expired: int | None = None
    # Delayed messages its dispatcher holds, not due or not acked yet (null: not served).
    delayed: int | None = None


class SubscriptionList(_Response):
    topic: str
    subscriptions: Sequence[SubscriptionOut]


class SeekPartitionOut(_Response):
    name: str
    offset: int


class SeekResponse(_Response):
    """Where the seek put the cursor of each partition."""

    partitions: Sequence[SeekPartitionOut]


class SkipResponse(_Response):
    """What a skip did: ``partition``'s cursor moved from ``from_offset`` to ``to_offset``;
    the ``skipped`` offsets between are never delivered to this subscription."""

    partition: str
    from_offset: int
    to_offset: int
    skipped: int


class FailurePolicyOut(BaseModel):
    """A subscription's failure policy: as set (``null``: never set, every field the
    cluster's; a field ``null``: that one the cluster's) and as in effect."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    subscription: str
    policy: FailurePolicy | None
    effective: FailurePolicy


# --- a topic described, looked up -----------------------------------------------------


class TopicDetail(_Response):
    name: str
    config: TopicConfigOut
    partitions: Sequence[PartitionDetail]
    subscriptions: Sequence[SubscriptionOut]
    producers: Sequence[ProducerOut] = []


class LookupPartitionOut(PartitionOut):
    # Where producers reach the owner's data door (DESIGN §10): None when it has none or
    # nobody owns the partition now.
    url: str | None


class SubscriptionLookupOut(_Response):
    """Who owns a subscription now, and its consume door (DESIGN §10): None when nobody
    owns it (the next attach claims it) or its owner serves none."""

    name: str
    owner: str | None
    url: str | None


class LookupOut(_Response):
    name: str
    dispatch: Dispatch
    partitions: Sequence[LookupPartitionOut]
    # Asked with ?subscription=: that subscription's owner and consume door.
    subscription: SubscriptionLookupOut | None = None


# --- the cluster -----------------------------------------------------------------------


class NodeOut(_Response):
    node_id: str
    address: str | None
    started_ms: int
    drained: bool = False  # an operator drained it (ingest: docs/operations.md)


class ControllerOut(_Response):
    leader: str | None


class ClusterOut(_Response):
    nodes: Mapping[str, Sequence[NodeOut]]
    controller: ControllerOut

"""The values stored under the keys of :mod:`danube.meta.keys`: small JSON documents.

Each model is checked when it is written (:meth:`MetaStore.put_model`) and again when it is
read (:meth:`MetaStore.get_model`). Unknown fields are ignored on read so that an older
service can read what a newer one wrote during a rolling upgrade; times are Unix
milliseconds (``_ms``); offsets are u64 message offsets.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from danube.config.model import CompatibilityModeName
from danube.meta.failure_policy import FailurePolicy
from danube.meta.keys import OFFSET_MAX, ServiceKind
from danube.names import PARTITIONS_MAX

Offset = Annotated[int, Field(ge=0, le=OFFSET_MAX)]
TimeMs = Annotated[int, Field(ge=0)]

Dispatch = Literal["reliable", "non_reliable"]
# "fsync": acknowledge after the group commit's fsync; "interval": acknowledge once written,
# fsync on the WAL's periodic cadence (a crash may lose the last interval).
Durability = Literal["fsync", "interval"]
SubscriptionType = Literal["exclusive", "shared", "failover", "key_shared"]
# Shared: any number of producers; exclusive: one, refusing every other (docs/producers.md).
AccessMode = Literal["shared", "exclusive"]
PRODUCER_NAME_CHARS_MAX = 256


class _Record(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)


class RetentionPolicy(_Record):
    """How long a topic's data stays in object storage (``None``: no limit)."""

    time_minutes: Annotated[int, Field(ge=1)] | None = None
    size_mb: Annotated[int, Field(ge=1)] | None = None


# Bounds of the policies (docs/policies.md); what a limit may be set to at most.
POLICY_COUNT_MAX = 1_000_000  # producers, subscriptions, consumers
RATE_MSGS_MAX = 10_000_000  # messages per second
RATE_BYTES_MAX = 10 * 2**30  # bytes per second
BACKLOG_MESSAGES_MAX = 2**62
MESSAGE_ID_WINDOW_MAX_S = 86_400
CHUNKED_BYTES_MAX = 1 << 30  # max_chunked_message_bytes' bound (danube.wire.chunks too)
MESSAGE_TTL_MAX_S = 10 * 365 * 86_400  # ten years: the bound of a TTL, policy or message
BacklogPolicy = Literal["refuse", "evict_oldest"]
# "time_size": data leaves by the time and size limits only; "queue": also once every
# subscription has acknowledged it (docs/retention.md, "Queue retention").
RetentionMode = Literal["time_size", "queue"]
PolicyCount = Annotated[int, Field(ge=1, le=POLICY_COUNT_MAX)]


class Policies(_Record):
    """The limits a topic holds to (docs/policies.md). ``None``: not set here, so the
    namespace's value applies, else the cluster's (no limit, and ``ingest.max_message_bytes``
    for the message size)."""

    max_producers: PolicyCount | None = None
    max_subscriptions: PolicyCount | None = None
    max_consumers_per_subscription: PolicyCount | None = None
    publish_rate_msgs_s: Annotated[int, Field(ge=1, le=RATE_MSGS_MAX)] | None = None
    publish_rate_bytes_s: Annotated[int, Field(ge=1, le=RATE_BYTES_MAX)] | None = None
    max_message_bytes: Annotated[int, Field(ge=1)] | None = None
    backlog_quota_messages: Annotated[int, Field(ge=1, le=BACKLOG_MESSAGES_MAX)] | None = None
    backlog_quota_policy: BacklogPolicy | None = None
    # A repeated `danube.message_id` within this many seconds is answered with the first
    # one's offset (docs/client.md, "Exactly once into the log").
    message_id_window_s: Annotated[int, Field(ge=1, le=MESSAGE_ID_WINDOW_MAX_S)] | None = None
    # A message older than this (publish time + TTL before now) is not delivered: the
    # dispatcher acknowledges it for the subscription and counts it (docs/policies.md).
    message_ttl_s: Annotated[int, Field(ge=1, le=MESSAGE_TTL_MAX_S)] | None = None
    # The largest message sent as chunks (danube.wire.chunks): a chunk claiming a larger
    # total is refused at the front door. Unset: 100 MiB (docs/policies.md).
    max_chunked_message_bytes: Annotated[int, Field(ge=1, le=CHUNKED_BYTES_MAX)] | None = None
    # "queue": retention also drops what every subscription has acknowledged (unset:
    # "time_size", the limits only).
    retention_mode: RetentionMode | None = None

    def over(self, fallback: Policies | None) -> Policies:
        """Each field this one leaves unset taken from ``fallback`` (topic over namespace)."""
        if fallback is None:
            return self
        mine = self.model_dump(exclude_none=True)
        return Policies.model_validate({**fallback.model_dump(exclude_none=True), **mine})


REPLICAS_MAX = 7
ReplicationFactor = Annotated[int, Field(ge=1, le=REPLICAS_MAX)]
NodeId = Annotated[str, Field(min_length=1, max_length=128)]


class NamespacePolicy(_Record):
    """A namespace: its limits and the defaults its new topics take (``None``: the
    cluster's, ``ingest.replication_factor`` and ``ingest.min_insync_replicas``)."""

    created_ms: TimeMs
    max_topics: Annotated[int, Field(ge=0, le=1_000_000)] = 10_000
    retention: RetentionPolicy = RetentionPolicy()
    replication_factor: ReplicationFactor | None = None
    min_insync_replicas: ReplicationFactor | None = None
    # What its topics hold to where they set nothing of their own.
    policies: Policies = Policies()


class TopicConfig(_Record):
    """A topic: ``partitions`` 0 means one unpartitioned topic; N means ``-part-0..N-1``."""

    partitions: Annotated[int, Field(ge=0, le=PARTITIONS_MAX)] = 0
    dispatch: Dispatch = "reliable"
    durability: Durability = "fsync"
    retention: RetentionPolicy = RetentionPolicy()
    created_ms: TimeMs
    # Copies of each partition's log, and how many of them (leader included) must hold a
    # message durably before it is acknowledged. None: the namespace's, else the cluster's.
    replication_factor: ReplicationFactor | None = None
    min_insync_replicas: ReplicationFactor | None = None
    # Its own limits; what it leaves unset comes from its namespace (Policies.over).
    policies: Policies = Policies()


class Owner(_Record):
    """Who serves a partition or subscription. ``epoch`` rises by one at every reassignment,
    so a write fenced on the epoch (or on this key's mod revision) fails for a stale owner."""

    node_id: Annotated[str, Field(min_length=1, max_length=128)]
    epoch: Annotated[int, Field(ge=1)]
    assigned_ms: TimeMs


class Assignment(_Record):
    """A partition's replica set: the ingest nodes that keep a copy of its log, the
    **preferred leader first** (the leader hands leadership to it once it is in sync:
    docs/replication.md, "Moving partitions").

    A reassignment (KIP-455's shape) is written here too, so it survives any restart:
    ``replicas`` is then the union of the old and the new set (the new set first, in its
    order), ``adding`` the nodes that are catching up and ``removing`` the nodes that leave
    once the new set is in sync and leads. The partition's leader completes it (writes
    ``replicas`` = the target, ``retired`` = the nodes that left, whose copies are then
    deleted); a cancel is a reassignment back to the original set. ``catchup_bytes_s`` caps
    the bytes/s the leader sends to replicas outside the ISR (None: ``ingest.catchup_bytes_s``).
    """

    replicas: Annotated[tuple[NodeId, ...], Field(min_length=1, max_length=2 * REPLICAS_MAX)]
    min_insync_replicas: ReplicationFactor = 1
    assigned_ms: TimeMs
    adding: Annotated[tuple[NodeId, ...], Field(max_length=REPLICAS_MAX)] = ()
    removing: Annotated[tuple[NodeId, ...], Field(max_length=REPLICAS_MAX)] = ()
    retired: Annotated[tuple[NodeId, ...], Field(max_length=2 * REPLICAS_MAX)] = ()
    catchup_bytes_s: Annotated[int, Field(ge=1024)] | None = None

    @model_validator(mode="after")
    def _distinct(self) -> Assignment:
        if len(set(self.replicas)) != len(self.replicas):
            raise ValueError(f"replicas must be distinct nodes: {list(self.replicas)}")
        if not set(self.adding) <= set(self.replicas) or not set(self.removing) <= set(
            self.replicas
        ):
            raise ValueError("adding and removing must be replicas")
        if set(self.adding) & set(self.removing):
            raise ValueError("a replica cannot be both added and removed")
        if set(self.retired) & set(self.replicas):
            raise ValueError("a retired node cannot be a replica")
        if len(self.target) > REPLICAS_MAX:
            raise ValueError(f"at most {REPLICAS_MAX} replicas")
        if self.min_insync_replicas > len(self.target):
            raise ValueError(
                f"min_insync_replicas {self.min_insync_replicas} is more than the "
                f"{len(self.target)} replicas"
            )
        return self

    @property
    def target(self) -> tuple[str, ...]:
        """The replica set once the reassignment (if any) is done."""
        return tuple(n for n in self.replicas if n not in self.removing)

    @property
    def original(self) -> tuple[str, ...]:
        """The replica set before the reassignment (if any) began."""
        return tuple(n for n in self.replicas if n not in self.adding)

    @property
    def moving(self) -> bool:
        """A reassignment is under way."""
        return bool(self.adding or self.removing)

    @property
    def preferred(self) -> str:
        """The replica that should lead (the first of the target set)."""
        return self.target[0]


class PartitionState(_Record):
    """Who leads a partition and which replicas are in sync (hold everything committed).

    Changed only by compare-and-swap transactions: a replica of the ISR claiming leadership
    (``leader_epoch`` + 1), or the leader of ``leader_epoch`` shrinking or growing the ISR.
    A new leader is only ever chosen from ``isr``."""

    leader: NodeId
    leader_epoch: Annotated[int, Field(ge=1)]
    isr: Annotated[tuple[NodeId, ...], Field(min_length=1, max_length=REPLICAS_MAX)]
    updated_ms: TimeMs
    # Where the leader's log ended when it claimed ``leader_epoch``: every offset below it
    # was handed out, so an unclean move never reuses one (None: written before it existed).
    epoch_start: Offset | None = None
    # Set only by an operator's unclean move (docs/replication.md): the replicas of ``isr``
    # start an empty log at this offset and one of them claims; that claim clears it.
    restart_at: Offset | None = None
    # A controlled leadership transfer (docs/replication.md): the leader of ``leader_epoch``
    # stopped appending, saw ``transfer_to`` hold its whole log, deleted its owner key and
    # wrote these. Only ``transfer_to`` may claim until ``transfer_ms`` is
    # ``TRANSFER_HOLD_MS`` old (then any in-sync replica may: the target died).
    transfer_to: NodeId | None = None
    transfer_ms: TimeMs | None = None
    # The leader that handed over stays a replica (a preferred-leader transfer): it held the
    # whole log, so ``transfer_to``'s claim keeps it in the ISR (it follows at once). False
    # (it leaves: a shutdown, a reassignment away): the claim drops it, as after a death.
    transfer_from_stays: bool = False


TRANSFER_HOLD_MS = 3000


class DrainRecord(_Record):
    """An operator's drain of a node (``drains/<kind>/<node_id>``): the controller moves
    every replica (ingest) or subscription (dispatcher) off it and places nothing new there,
    until the key is deleted (undrain)."""

    node_id: NodeId
    requested_ms: TimeMs


class ProducerRecord(_Record):
    """An open producer session (``producers/<ns>/<t>/<id>``), on the session's lease: it
    lives as long as its client keeps the lease alive through any discovery instance."""

    name: Annotated[str, Field(min_length=1, max_length=PRODUCER_NAME_CHARS_MAX)]
    access_mode: AccessMode
    created_ms: TimeMs


class NodeRecord(_Record):
    """A live service process, registered under its lease."""

    node_id: Annotated[str, Field(min_length=1, max_length=128)]
    kind: ServiceKind
    address: str | None = None  # where it serves health/metrics, "host:port"
    # Where clients reach its data door, "http(s)://host:port" (ingest: the produce of the
    # partitions it leads; DESIGN §10); None: it serves none.
    data_url: Annotated[str, Field(max_length=300)] | None = None
    # Where Danube's clients reach its gRPC door, "http(s)://host:port" (ingest: the
    # partitions it leads, TopicLookup redirects there; discovery: its client API, any
    # topic in proxy mode); None: it serves none.
    grpc_url: Annotated[str, Field(max_length=300)] | None = None
    started_ms: TimeMs
    version: str = ""
    # How busy the node is, in whatever unit all nodes of a kind share (ingest: appended
    # bytes/s); None until the node reports it. The controller breaks count ties by it.
    load: Annotated[float, Field(ge=0)] | None = None


class DamagedRange(_Record):
    """Offsets ``[from_offset, to_offset)`` the WAL holds no intact copy of; ``file`` is the
    damaged segment."""

    from_offset: Annotated[int, Field(ge=0, le=OFFSET_MAX)]
    to_offset: Annotated[int, Field(ge=1, le=OFFSET_MAX)]
    file: Annotated[str, Field(max_length=1024)]


class UploaderCheckpoint(_Record):
    """Every offset up to ``uploaded_through`` (inclusive) is in object storage; -1: none yet.

    ``pending_end`` is an upload under way: the object for ``(uploaded_through, pending_end]``
    is being written. Recorded before the object, so an uploader that takes over after a crash
    writes the same object for the same range (never an overlapping one).

    ``damaged``: uploads stopped right after ``uploaded_through`` because the WAL's copy of
    that range is damaged; they go on once it reads intact again, or once an operator skips
    it (``danube admin partitions skip-upload``), which moves ``uploaded_through`` past it
    and adds the range to ``skipped_offsets``."""

    uploaded_through: Annotated[int, Field(ge=-1, le=OFFSET_MAX)]
    pending_end: Annotated[int, Field(ge=0, le=OFFSET_MAX)] | None = None
    last_object_key: str | None = None
    updated_ms: TimeMs
    damaged: DamagedRange | None = None
    skipped_offsets: Annotated[int, Field(ge=0)] = 0


class DroppedCount(_Record):
    """Messages and bytes that left one tier for one reason."""

    messages: Annotated[int, Field(ge=0)] = 0
    size_bytes: Annotated[int, Field(ge=0)] = 0

    def plus(self, messages: int, size_bytes: int) -> DroppedCount:
        """This count with ``messages`` and ``size_bytes`` more."""
        return DroppedCount(
            messages=self.messages + messages, size_bytes=self.size_bytes + size_bytes
        )


class RetentionTally(_Record):
    """What retention removed from a partition's tiers since the partition was created:
    ``*_acked`` every subscription had acknowledged (queue retention), ``*_limits`` the time
    and size limits took (some subscription may not have acknowledged it, or there was
    none). ``cloud_*`` is written in the transaction that deletes each descriptor, so it is
    exact; ``wal_*`` right after ingest answers a drop (a leader that dies in between loses
    that one drop's count). Data leaves the WAL only once uploaded, so what a topic has lost
    for good is what left its cloud tier (docs/retention.md)."""

    wal_acked: DroppedCount = DroppedCount()
    wal_limits: DroppedCount = DroppedCount()
    cloud_acked: DroppedCount = DroppedCount()
    cloud_limits: DroppedCount = DroppedCount()
    updated_ms: TimeMs = 0


class SubscriptionConfig(_Record):
    """A subscription: its delivery type, where a cursor-less partition starts and its
    failure policy."""

    type: SubscriptionType
    initial_position: Literal["latest", "earliest"] = "latest"
    created_ms: TimeMs
    # None: the cluster's (danube.meta.failure_policy); set at the first attach or by admin.
    failure_policy: FailurePolicy | None = None


# Sealed delay snapshots kept per partition of a subscription (docs/dispatcher.md, "Delayed
# delivery"): ~a second of the log each, at most the delay range of it.
DELAY_SNAPSHOTS_MAX = 256


class DelaySnapshotRef(_Record):
    """A delay snapshot in object storage (docs/formats.md, "Delay snapshots"): it holds every
    delayed message read in ``[from_offset, to_offset)`` of the partition, each due at or
    before ``due_max_ms``; referenced only once written whole."""

    key: Annotated[str, Field(min_length=1, max_length=1024)]
    from_offset: Offset
    to_offset: Offset
    due_max_ms: TimeMs
    head_bytes: Annotated[int, Field(ge=0)]
    size_bytes: Annotated[int, Field(ge=0)]


class SubscriptionCursor(_Record):
    """Every offset below ``next_offset`` in this partition is acknowledged, and so are the
    offsets in ``acked_beyond`` (out-of-order acks, lowest first; bounded: dropping some only
    causes a redelivery after a restart, never a loss)."""

    next_offset: Offset
    acked_beyond: Annotated[tuple[Offset, ...], Field(max_length=10_000)] = ()
    updated_ms: TimeMs
    # Delayed messages (docs/dispatcher.md, "Delayed delivery") are acked in the cursor when
    # read; those not delivered and acked yet lie at or above ``delay_from`` (below
    # ``next_offset``), each due at or after ``delay_due_ms``: read again on a resume. So
    # the log from ``delay_from`` on is still needed (retention's floor is the lower one).
    delay_from: Offset | None = None
    delay_due_ms: Annotated[int, Field(ge=0)] | None = None
    # Where the delayed messages at and above ``delay_from`` are kept beside the log: a new
    # owner loads them from these instead of reading their ranges again.
    delay_snapshots: (
        Annotated[tuple[DelaySnapshotRef, ...], Field(max_length=DELAY_SNAPSHOTS_MAX)] | None
    ) = None


# --- the schema registry (docs/schemas.md) ---------------------------------------------

SchemaTypeName = Literal["bytes", "string", "number", "json_schema", "avro", "protobuf"]
ValidationPolicy = Literal["none", "warn", "enforce"]
SchemaId = Annotated[int, Field(ge=1, le=2**63 - 1)]
SchemaVersionNumber = Annotated[int, Field(ge=1, le=10**10 - 1)]
SCHEMA_TAGS_MAX = 32


class SchemaSubject(_Record):
    """A subject: its schema id (shared by all its versions), type, compatibility mode
    (None: the cluster's default) and the number its next version takes (never reused)."""

    schema_id: SchemaId
    schema_type: SchemaTypeName
    compatibility_mode: CompatibilityModeName | None = None
    next_version: SchemaVersionNumber
    created_ms: TimeMs


class SchemaVersionRecord(_Record):
    """One version of a subject, immutable once written (but for ``deleted_ms``: a deleted
    version stays readable by id and version, for the records that carry it)."""

    version: SchemaVersionNumber
    schema_type: SchemaTypeName
    definition: Annotated[str, Field(max_length=256 * 1024)]
    fingerprint: Annotated[str, Field(pattern=r"^[0-9a-f]{64}$")]
    description: Annotated[str, Field(max_length=4096)] = ""
    created_by: Annotated[str, Field(max_length=256)] = ""
    tags: Annotated[
        tuple[Annotated[str, Field(max_length=128)], ...], Field(max_length=SCHEMA_TAGS_MAX)
    ] = ()
    created_ms: TimeMs
    deleted_ms: TimeMs | None = None


class TopicSchemaRecord(_Record):
    """A topic bound to a subject: payloads are checked against the subject's versions by
    ``validation_policy`` (none, warn, enforce) when ``payload_validation`` is on."""

    subject: Annotated[str, Field(min_length=1, max_length=255)]
    validation_policy: ValidationPolicy = "none"
    payload_validation: bool = False
    updated_ms: TimeMs


# --- the cluster ----------------------------------------------------------------------

CLOUD_KEYS_MAX = 32


class ObjectStoreRecord(_Record):
    """Where the cluster's objects are: the ``wal_cloud.cloud`` section of the service that
    recorded it without its credentials (danube.storage.location.public_settings), so that
    a reader given only etcd (the Spark backfills) finds the objects."""

    cloud: Annotated[dict[str, str | bool], Field(max_length=CLOUD_KEYS_MAX)]
    recorded_by: NodeId
    updated_ms: TimeMs

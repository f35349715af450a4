"""The admin routes of the HTTP API (docs/http-api.md): cluster, namespaces, topics, lookup,
subscriptions (list with backlog, delete, seek).

Answers are parsed into frozen models that ignore fields they do not know, so a newer
server does not break an older client. Reads and idempotent writes (``PUT``) are retried on
429, 503 and transport failures within the client's timeout; a ``DELETE`` is tried once
(its answer may be lost after it took effect, and the retry would then answer 404).

A new route is one method: build the path, call :meth:`AsyncAdmin._call`, parse the model.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from danube.client._answers import parse_answer as _parse
from danube.client._http import Answer, HttpCore
from danube.client.elastic import ElasticAdmin
from danube.client.errors import InvalidArgumentError, ProtocolError
from danube.client.messages import Position, position_json, topic_name, topic_path
from danube.names import InvalidNameError, TopicName, validate_segment

Dispatch = Literal["reliable", "non_reliable"]
Durability = Literal["fsync", "interval"]


class _Model(BaseModel):
    model_config = ConfigDict(frozen=True, extra="ignore")


class Retention(_Model):
    """How long data stays in object storage (None: no limit)."""

    time_minutes: int | None = None
    size_mb: int | None = None


class Policies(_Model):
    """A topic's or namespace's limits (docs/policies.md); None: not set (inherited from
    the namespace, else the cluster's: no limit)."""

    max_producers: int | None = None
    max_subscriptions: int | None = None
    max_consumers_per_subscription: int | None = None
    publish_rate_msgs_s: int | None = None
    publish_rate_bytes_s: int | None = None
    max_message_bytes: int | None = None
    backlog_quota_messages: int | None = None
    backlog_quota_policy: Literal["refuse", "evict_oldest"] | None = None
    message_id_window_s: int | None = None
    message_ttl_s: int | None = None
    max_chunked_message_bytes: int | None = None
    retention_mode: Literal["time_size", "queue"] | None = None

    def body(self) -> dict[str, Any]:
        """The fields set, as a request body (a PATCH replaces exactly these)."""
        return self.model_dump(exclude_unset=True)


class Node(_Model):
    node_id: str
    address: str | None = None
    started_ms: int
    drained: bool = False


class Controller(_Model):
    leader: str | None = None


class Cluster(_Model):
    """Live nodes by service kind, and the controller's leader."""

    nodes: dict[str, list[Node]]
    controller: Controller


class Namespace(_Model):
    name: str
    max_topics: int
    retention: Retention
    created_ms: int
    replication_factor: int | None = None
    min_insync_replicas: int | None = None
    policies: Policies = Policies()


class TopicConfig(_Model):
    partitions: int
    dispatch: Dispatch
    durability: Durability
    retention: Retention
    created_ms: int
    replication_factor: int | None = None
    min_insync_replicas: int | None = None
    policies: Policies = Policies()  # the topic's own
    effective_policies: Policies = Policies()  # in effect: the namespace's where unset


class Topic(_Model):
    """A topic as created: its name and config; ``created`` is False when it existed
    already with the same config (the create is idempotent)."""

    name: str
    config: TopicConfig
    created: bool = True


class Owner(_Model):
    node_id: str
    epoch: int


class Follower(_Model):
    end: int | None = None
    lag: int | None = None


class UploadDamage(_Model):
    """Uploads stop at ``from_offset``: the WAL copy of ``[from_offset, to_offset)`` is
    damaged (``file``)."""

    from_offset: int
    to_offset: int
    file: str


class Dropped(_Model):
    messages: int = 0
    size_bytes: int = 0


class RetentionDropped(_Model):
    """What retention removed from a partition's tiers so far: ``*_acked`` every
    subscription had acknowledged (queue retention), ``*_limits`` the time and size limits
    took (docs/retention.md, "Accounting")."""

    wal_acked: Dropped = Dropped()
    wal_limits: Dropped = Dropped()
    cloud_acked: Dropped = Dropped()
    cloud_limits: Dropped = Dropped()


class Offsets(_Model):
    """``None`` where the leader did not answer, or nothing is uploaded yet. ``next_offset``
    is the high watermark (what readers see); ``leader_end`` the leader's own durable end."""

    wal_start: int | None = None
    next_offset: int | None = None
    uploaded_through: int | None = None
    leader_epoch: int | None = None
    replicas: list[str] = []
    isr: list[str] = []
    leader_end: int | None = None
    followers: dict[str, Follower] = {}
    upload_damaged: UploadDamage | None = None
    upload_skipped_offsets: int = 0
    retention_dropped: RetentionDropped | None = None


class PartitionInfo(_Model):
    name: str
    owner: Owner | None = None
    offsets: Offsets = Offsets()


class SubscriptionPartition(_Model):
    """A subscription in one partition: ``cursor`` (every offset below it is acked; None
    before its first write), acks beyond it, the partition's end and the backlog between."""

    name: str
    cursor: int | None = None
    acked_beyond: int = 0
    end_offset: int | None = None
    backlog: int | None = None
    blocked_offset: int | None = None  # a poison message holds it (failure policy "block")


class Backoff(_Model):
    """The redelivery backoff of a failure policy (None: the cluster's)."""

    kind: Literal["fixed", "exponential"] = "exponential"
    base_ms: int | None = None
    max_ms: int | None = None


class FailurePolicy(_Model):
    """A subscription's failure policy (docs/http-api.md, "Failure policy"); a field None
    takes the cluster's value."""

    max_redeliveries: int | None = None
    ack_timeout_ms: int | None = None
    backoff: Backoff | None = None
    poison_policy: Literal["block", "drop", "dead_letter"] | None = None
    dead_letter_topic: str | None = None

    def body(self) -> dict[str, Any]:
        """The policy as a request body gives it (unset fields left out)."""
        return self.model_dump(exclude_none=True)


class FailurePolicyInfo(_Model):
    """A subscription's failure policy as set (None: never set) and as in effect."""

    subscription: str
    policy: FailurePolicy | None = None
    effective: FailurePolicy


class SubscriptionConsumer(_Model):
    consumer_id: str
    name: str
    unacked: int


class Subscription(_Model):
    """A subscription: its type, the dispatcher serving it (None: none now), its backlog
    (sum of the partitions whose backlog is known), partitions and attached consumers."""

    name: str
    type: str
    created_ms: int
    owner: Owner | None = None
    backlog: int = 0
    partitions: list[SubscriptionPartition] = []
    consumers: list[SubscriptionConsumer] = []
    failure_policy: FailurePolicy | None = None  # as set (None: the cluster's)
    effective_failure_policy: FailurePolicy | None = None  # in effect, when served
    expired: int | None = None  # let go past their TTL while served there (None: not served)


class SeekPartition(_Model):
    """Where a seek put one partition's cursor."""

    name: str
    offset: int


class ProducerInfo(_Model):
    """An open producer session of a topic (docs/producers.md); ``topic`` names the
    partition when it was opened on one."""

    producer_id: str
    topic: str = ""
    name: str
    access_mode: Literal["shared", "exclusive"]
    created_ms: int


class TopicDescription(_Model):
    """Config, partitions (owner, offsets), subscriptions and producers of a topic."""

    name: str
    config: TopicConfig
    partitions: list[PartitionInfo]
    subscriptions: list[Subscription] = []
    producers: list[ProducerInfo] = []


class LookupPartition(PartitionInfo):
    """A partition as a lookup names it: with ``url``, its leader's data door (None: none
    known, docs/http-api.md "Direct produce")."""

    url: str | None = None


class Lookup(_Model):
    """The partitions of a topic, who owns each and where its producers post."""

    name: str
    dispatch: Dispatch
    partitions: list[LookupPartition]


def _namespace(ns: str) -> str:
    try:
        return validate_segment("namespace", ns)
    except InvalidNameError as exc:
        raise InvalidArgumentError(exc.message, code=exc.code) from exc


class AsyncAdmin(ElasticAdmin):
    """Cluster, namespace and topic administration through one server; reassignments and
    drains (:class:`danube.client.elastic.ElasticAdmin`)."""

    def __init__(self, http: HttpCore) -> None:
        self._http = http

    async def _call(self, method: str, path: str, body: Any = None) -> Answer:
        if method == "DELETE":
            return await self._http.request(method, path, body=body)
        return await self._http.request_retrying(
            method, path, body=body, timeout_s=self._http.timeout_s
        )

    async def cluster(self) -> Cluster:
        """Registered nodes by service kind, and the controller's leader."""
        return _parse(Cluster, (await self._call("GET", "/v1/cluster")).body, "cluster")

    async def namespaces(self) -> list[str]:
        """Every namespace's name."""
        body = (await self._call("GET", "/v1/namespaces")).body
        names = body.get("namespaces") if isinstance(body, dict) else None
        if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
            raise ProtocolError(f"namespaces: unexpected answer {body!r:.200}")
        return names

    async def namespace(self, ns: str) -> Namespace:
        """One namespace's policy; NotFoundError ``namespace_not_found``."""
        path = f"/v1/namespaces/{_namespace(ns)}"
        return _parse(Namespace, (await self._call("GET", path)).body, "namespace")

    async def create_namespace(
        self,
        ns: str,
        *,
        max_topics: int | None = None,
        retention: Retention | None = None,
        replication_factor: int | None = None,
        min_insync_replicas: int | None = None,
        policies: Policies | None = None,
    ) -> Namespace:
        """Create a namespace (idempotent); ConflictError ``namespace_exists`` when it
        exists with another policy. The replication settings and ``policies`` are its
        topics' defaults."""
        body: dict[str, Any] = {}
        if policies is not None:
            body["policies"] = policies.body()
        if max_topics is not None:
            body["max_topics"] = max_topics
        if retention is not None:
            body["retention"] = retention.model_dump()
        if replication_factor is not None:
            body["replication_factor"] = replication_factor
        if min_insync_replicas is not None:
            body["min_insync_replicas"] = min_insync_replicas
        answer = await self._call("PUT", f"/v1/namespaces/{_namespace(ns)}", body)
        return _parse(Namespace, answer.body, "create namespace")

    async def update_namespace(self, ns: str, **changes: Any) -> Namespace:
        """Change a namespace's policy: each keyword given (``max_topics``, ``retention`` —
        a :class:`Retention` —, ``replication_factor``, ``min_insync_replicas``; None resets
        a replication default; ``policies`` — a :class:`Policies` whose fields set replace
        the stored ones) replaces the stored value; topics that set none of their own
        follow it."""
        body = {
            key: value.model_dump()
            if isinstance(value, Retention)
            else value.body()
            if isinstance(value, Policies)
            else value
            for key, value in changes.items()
        }
        answer = await self._call("PATCH", f"/v1/namespaces/{_namespace(ns)}", body)
        return _parse(Namespace, answer.body, "update namespace")

    async def delete_namespace(self, ns: str) -> None:
        """Delete an empty namespace (``namespace_not_empty``, ``namespace_protected``)."""
        await self._call("DELETE", f"/v1/namespaces/{_namespace(ns)}")

    async def topics(self, ns: str = "default") -> list[str]:
        """The topics of a namespace (topic names, not partitions)."""
        body = (await self._call("GET", f"/v1/namespaces/{_namespace(ns)}/topics")).body
        topics = body.get("topics") if isinstance(body, dict) else None
        if not isinstance(topics, list) or not all(isinstance(t, str) for t in topics):
            raise ProtocolError(f"topics: unexpected answer {body!r:.200}")
        return topics

    async def create_topic(
        self,
        topic: str | TopicName,
        *,
        partitions: int = 0,
        dispatch: Dispatch = "reliable",
        durability: Durability = "fsync",
        retention: Retention | None = None,
        replication_factor: int | None = None,
        min_insync_replicas: int | None = None,
        policies: Policies | None = None,
    ) -> Topic:
        """Create a topic (idempotent: ``created`` False when it existed with this config);
        ConflictError ``topic_exists`` when it exists with another. A replication setting
        or policy left None takes the namespace's (or the cluster's) default."""
        body: dict[str, Any] = {
            "partitions": partitions,
            "dispatch": dispatch,
            "durability": durability,
        }
        if policies is not None:
            body["policies"] = policies.body()
        if retention is not None:
            body["retention"] = retention.model_dump()
        if replication_factor is not None:
            body["replication_factor"] = replication_factor
        if min_insync_replicas is not None:
            body["min_insync_replicas"] = min_insync_replicas
        answer = await self._call("PUT", f"/v1/topics/{_topic_path(topic)}", body)
        created = _parse(Topic, answer.body, "create topic")
        return created.model_copy(update={"created": answer.status == 201})

    async def update_topic(
        self,
        topic: str | TopicName,
        *,
        partitions: int | None = None,
        policies: Policies | None = None,
    ) -> Topic:
        """Change a topic in place: grow it to ``partitions`` (never fewer: ConflictError
        ``partitions_cannot_shrink``, and ``not_partitioned`` for an unpartitioned topic;
        keyed messages then route over the new count, docs/client.md "Growing a topic"),
        and the fields set in ``policies`` replace the stored ones."""
        body: dict[str, Any] = {}
        if partitions is not None:
            body["partitions"] = partitions
        if policies is not None:
            body["policies"] = policies.body()
        if not body:
            raise InvalidArgumentError("update_topic: give partitions or policies")
        answer = await self._call("PATCH", f"/v1/topics/{_topic_path(topic)}", body)
        return _parse(Topic, answer.body, "update topic")

    async def update_topic_policies(self, topic: str | TopicName, policies: Policies) -> Topic:
        """Change a topic's policies in place: the fields set in ``policies`` replace the
        stored ones (set one to None to unset it: the namespace's applies again)."""
        body = {"policies": policies.body()}
        answer = await self._call("PATCH", f"/v1/topics/{_topic_path(topic)}", body)
        return _parse(Topic, answer.body, "update topic")

    async def describe_topic(self, topic: str | TopicName) -> TopicDescription:
        """Config, partitions with owners and offsets, subscriptions."""
        answer = await self._call("GET", f"/v1/topics/{_topic_path(topic)}")
        return _parse(TopicDescription, answer.body, "describe topic")

    async def delete_topic(self, topic: str | TopicName) -> None:
        """Delete a topic, its WAL and its subscriptions."""
        await self._call("DELETE", f"/v1/topics/{_topic_path(topic)}")

    async def lookup(self, topic: str | TopicName) -> Lookup:
        """The partitions of a topic and the owner of each."""
        answer = await self._call("GET", f"/v1/lookup/{_topic_path(topic)}")
        return _parse(Lookup, answer.body, "lookup")

    async def subscriptions(self, topic: str | TopicName) -> list[Subscription]:
        """Every subscription of a topic: type, cursors, backlog, consumers."""
        answer = await self._call("GET", f"/v1/topics/{_topic_path(topic)}/subscriptions")
        return _parse(_SubscriptionList, answer.body, "subscriptions").subscriptions

    async def producers(self, topic: str | TopicName) -> list[ProducerInfo]:
        """The open producer sessions of a topic."""
        answer = await self._call("GET", f"/v1/topics/{_topic_path(topic)}/producers")
        return _parse(_ProducerList, answer.body, "producers").producers

    async def delete_subscription(self, topic: str | TopicName, subscription: str) -> None:
        """Delete a subscription: its consumers are detached, its cursors removed;
        NotFoundError ``subscription_not_found``."""
        path = f"/v1/topics/{_topic_path(topic)}/subscriptions/{_subscription(subscription)}"
        await self._call("DELETE", path)

    async def failure_policy(self, topic: str | TopicName, subscription: str) -> FailurePolicyInfo:
        """The subscription's failure policy, as set and as in effect; NotFoundError
        ``subscription_not_found``."""
        path = f"/v1/topics/{_topic_path(topic)}/subscriptions/{_subscription(subscription)}"
        answer = await self._call("GET", f"{path}/failure-policy")
        return _parse(FailurePolicyInfo, answer.body, "failure policy")

    async def set_failure_policy(
        self, topic: str | TopicName, subscription: str, policy: FailurePolicy
    ) -> FailurePolicyInfo:
        """Replace the subscription's failure policy (fields None: the cluster's); the
        dispatcher serving it applies it at once. A value out of bounds: ApiError 400."""
        path = f"/v1/topics/{_topic_path(topic)}/subscriptions/{_subscription(subscription)}"
        answer = await self._call("PUT", f"{path}/failure-policy", body=policy.body())
        return _parse(FailurePolicyInfo, answer.body, "set failure policy")

    async def move_partition(
        self, partition: str | TopicName, replicas: list[str], *, unclean: bool = False
    ) -> Move:
        """Give a partition that has no leader a new replica set (docs/replication.md).
        When that gives up what only its old replicas held, the server refuses
        (``unclean_required``) unless ``unclean``; the answer tells where the log continues
        and from which offset data was given up."""
        body = {"replicas": [_node(n) for n in replicas], "unclean": unclean}
        # Not retried: a move whose answer was lost happened; a second finds a leader or
        # moves again.
        path = f"/v1/partitions/{_topic_path(partition)}/move"
        answer = await self._http.request("POST", path, body=body)
        return _parse(Move, answer.body, "move partition")

    async def skip_upload(
        self, partition: str | TopicName, *, to_offset: int | None = None
    ) -> Skip:
        """Let a partition's uploads go on past the damaged WAL range they stopped at (to
        ``to_offset``; None: its end). The range is never uploaded."""
        body = {} if to_offset is None else {"to_offset": to_offset}
        path = f"/v1/partitions/{_topic_path(partition)}/uploads/skip"
        answer = await self._http.request("POST", path, body=body)
        return _parse(Skip, answer.body, "skip upload")

    async def seek(
        self, topic: str | TopicName, subscription: str, position: Position
    ) -> list[SeekPartition]:
        """Move the subscription's cursor in every partition to ``position`` (``"earliest"``,
        ``"latest"``, an offset, or a :class:`Timestamp`); unacked messages are dropped,
        acked ones after it come again. Returns where each cursor now is."""
        path = f"/v1/topics/{_topic_path(topic)}/subscriptions/{_subscription(subscription)}"
        body = {"position": position_json(position)}
        # Not retried: a seek whose answer was lost moved the cursor; a second one would
        # drop what was delivered in between.
        answer = await self._http.request("POST", f"{path}/seek", body=body)
        return _parse(_SeekAnswer, answer.body, "seek").partitions

    async def skip(
        self,
        topic: str | TopicName,
        subscription: str,
        *,
        partition: int | None = None,
        to_offset: int | None = None,
    ) -> Skip:
        """Move one partition's cursor forward on purpose (``partition`` is its index;
        None for an unpartitioned topic): to ``to_offset``, or, when None, past the range
        no copy holds intact that stops it (``data_damaged``). The offsets skipped are never
        delivered to this subscription."""
        path = f"/v1/topics/{_topic_path(topic)}/subscriptions/{_subscription(subscription)}"
        body: dict[str, int] = {}
        if partition is not None:
            body["partition"] = partition
        if to_offset is not None:
            body["to_offset"] = to_offset
        # Not retried: a skip whose answer was lost moved the cursor.
        answer = await self._http.request("POST", f"{path}/skip", body=body)
        return _parse(Skip, answer.body, "skip")


class Skip(_Model):
    """What a skip did (see :meth:`AsyncAdmin.skip`)."""

    partition: str
    from_offset: int
    to_offset: int
    skipped: int


class Move(_Model):
    """What a partition move did (see :meth:`AsyncAdmin.move_partition`)."""

    partition: str
    previous_replicas: list[str]
    replicas: list[str]
    unclean: bool
    continues_at: int | None = None
    given_up_from: int | None = None


class _ProducerList(_Model):
    producers: list[ProducerInfo]


class _SubscriptionList(_Model):
    subscriptions: list[Subscription]


class _SeekAnswer(_Model):
    partitions: list[SeekPartition]


def _node(node_id: str) -> str:
    try:
        return validate_segment("node", node_id)
    except InvalidNameError as exc:
        raise InvalidArgumentError(exc.message, code=exc.code) from exc


def _subscription(name: str) -> str:
    try:
        return validate_segment("subscription", name)
    except InvalidNameError as exc:
        raise InvalidArgumentError(exc.message, code=exc.code) from exc


def _topic_path(topic: str | TopicName) -> str:
    return topic_path(topic_name(topic))

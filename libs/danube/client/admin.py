"""The admin routes of the HTTP API (docs/http-api.md): cluster, namespaces, topics, lookup,
producers, partition moves; a topic's subscriptions are :mod:`danube.client.subscriptions`'s,
reassignments and drains :mod:`danube.client.elastic`'s.

Answers are parsed into frozen models that ignore fields they do not know, so a newer
server does not break an older client. Reads and idempotent writes (``PUT``) are retried on
429, 503 and transport failures within the client's timeout; a ``DELETE`` is tried once
(its answer may be lost after it took effect, and the retry would then answer 404).

A new route is one method: build the path, call :meth:`AsyncAdmin._call`, parse the model.
"""

from __future__ import annotations

from typing import Any

from pydantic import Field

from danube.client._answers import parse_answer as _parse
from danube.client._http import HttpCore
from danube.client.elastic import ElasticAdmin
from danube.client.errors import InvalidArgumentError, ProtocolError
from danube.client.messages import topic_name, topic_path
from danube.client.subscriptions import (
    Owner,
    Skip,
    Subscription,
    SubscriptionAdmin,
)
from danube.meta import records

# Re-exported: the SDK's callers (danube.client.sync) name a topic's settings from here.
from danube.meta.records import Dispatch as Dispatch
from danube.meta.records import Durability as Durability
from danube.names import InvalidNameError, TopicName, validate_segment
from danube.wire.api import catalog as api
from danube.wire.api import producers

# The answers are danube.wire.api's, as in danube.client.subscriptions: each model here
# subclasses the one the server answers with and states only what a client tolerates beyond
# it (a field an older server may leave out, the SDK's own models where answers nest).


class Retention(records.RetentionPolicy):
    """How long data stays in object storage (None: no limit). Built as given: the server
    checks the bounds (a 400 naming the field)."""

    time_minutes: int | None = None
    size_mb: int | None = None


class Policies(records.Policies):
    """A topic's or namespace's limits (docs/policies.md); None: not set (inherited from
    the namespace, else the cluster's: no limit). Built as given: the server checks the
    bounds (a 400 naming the field)."""

    max_producers: int | None = None
    max_subscriptions: int | None = None
    max_consumers_per_subscription: int | None = None
    publish_rate_msgs_s: int | None = None
    publish_rate_bytes_s: int | None = None
    max_message_bytes: int | None = None
    backlog_quota_messages: int | None = None
    message_id_window_s: int | None = None
    message_ttl_s: int | None = None
    max_chunked_message_bytes: int | None = None

    def body(self) -> dict[str, Any]:
        """The fields set, as a request body (a PATCH replaces exactly these)."""
        return self.model_dump(exclude_unset=True)


class Node(api.NodeOut):
    address: str | None = None


class Controller(api.ControllerOut):
    leader: str | None = None


class Cluster(api.ClusterOut):
    """Live nodes by service kind, and the controller's leader."""

    nodes: dict[str, list[Node]]
    controller: Controller


class Namespace(api.NamespaceOut):
    retention: Retention
    policies: Policies = Policies()


class TopicConfig(api.TopicConfigOut):
    retention: Retention
    policies: Policies = Policies()  # the topic's own
    effective_policies: Policies = Policies()  # in effect: the namespace's where unset


class Topic(api.TopicOut):
    """A topic as created: its name and config; ``created`` is False when it existed
    already with the same config (the create is idempotent)."""

    config: TopicConfig
    created: bool = True  # the client's: the answer's status (201 or 200)


class Follower(api.FollowerOut):
    end: int | None = None
    lag: int | None = None


class UploadDamage(api.UploadDamageOut):
    """Uploads stop at ``from_offset``: the WAL copy of ``[from_offset, to_offset)`` is
    damaged (``file``)."""


class Dropped(api.DroppedOut):
    messages: int = 0
    size_bytes: int = 0


class RetentionDropped(api.RetentionDroppedOut):
    """What retention removed from a partition's tiers so far: ``*_acked`` every
    subscription had acknowledged (queue retention), ``*_limits`` the time and size limits
    took (docs/retention.md, "Accounting")."""

    wal_acked: Dropped = Dropped()
    wal_limits: Dropped = Dropped()
    cloud_acked: Dropped = Dropped()
    cloud_limits: Dropped = Dropped()


class Offsets(api.OffsetsOut):
    """``None`` where the leader did not answer, or nothing is uploaded yet. ``next_offset``
    is the high watermark (what readers see); ``leader_end`` the leader's own durable end."""

    wal_start: int | None = None
    next_offset: int | None = None
    uploaded_through: int | None = None
    followers: dict[str, Follower] = Field(default_factory=dict)
    upload_damaged: UploadDamage | None = None
    retention_dropped: RetentionDropped | None = None


class PartitionInfo(api.PartitionDetail):
    owner: Owner | None = None
    offsets: Offsets = Offsets()


class ProducerInfo(producers.ProducerOut):
    """An open producer session of a topic (docs/producers.md); ``topic`` names the
    partition when it was opened on one."""

    topic: str = ""


class TopicDescription(api.TopicDetail):
    """Config, partitions (owner, offsets), subscriptions and producers of a topic."""

    config: TopicConfig
    partitions: list[PartitionInfo]
    subscriptions: list[Subscription] = Field(default_factory=list)
    producers: list[ProducerInfo] = Field(default_factory=list)


class LookupPartition(api.LookupPartitionOut):
    """A partition as a lookup names it: with ``url``, its leader's data door (None: none
    known, docs/http-api.md "Direct produce")."""

    owner: Owner | None = None
    offsets: Offsets = Offsets()  # the client's: a lookup answers none
    url: str | None = None


class Lookup(api.LookupOut):
    """The partitions of a topic, who owns each and where its producers post."""

    partitions: list[LookupPartition]


def _namespace(ns: str) -> str:
    try:
        return validate_segment("namespace", ns)
    except InvalidNameError as exc:
        raise InvalidArgumentError(exc.message, code=exc.code) from exc


class AsyncAdmin(SubscriptionAdmin, ElasticAdmin):
    """Cluster, namespace and topic administration through one server; subscriptions
    (:class:`danube.client.subscriptions.SubscriptionAdmin`), reassignments and drains
    (:class:`danube.client.elastic.ElasticAdmin`)."""

    def __init__(self, http: HttpCore) -> None:
        self._http = http

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

    async def producers(self, topic: str | TopicName) -> list[ProducerInfo]:
        """The open producer sessions of a topic."""
        answer = await self._call("GET", f"/v1/topics/{_topic_path(topic)}/producers")
        return _parse(_ProducerList, answer.body, "producers").producers

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


class Move(api.MoveOut):
    """What a partition move did (see :meth:`AsyncAdmin.move_partition`)."""


class _ProducerList(producers.ProducerList):
    producers: list[ProducerInfo]


def _node(node_id: str) -> str:
    try:
        return validate_segment("node", node_id)
    except InvalidNameError as exc:
        raise InvalidArgumentError(exc.message, code=exc.code) from exc


def _topic_path(topic: str | TopicName) -> str:
    return topic_path(topic_name(topic))

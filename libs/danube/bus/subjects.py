"""The NATS subjects of the mesh, built and parsed with no I/O.

Topic names and their rules (segments, length limits, the ``-part-N`` suffix of a partition) are
those of :mod:`danube.names`; this module adds the tokens only subjects have: the subject prefix
(a segment) and dispatcher operation names (segments of at most :data:`MAX_OP_CHARS`).

Every subject has a fixed number of tokens so it parses without guessing::

    <prefix>.<kind>.<namespace>.<base>.<partition>[.<subscription>[.<op>]]

``<kind>`` is one or two tokens (``produce``, ``wal.fetch``...; see :class:`Kind`), ``<base>`` is
the topic without its ``-part-N`` suffix and ``<partition>`` is ``N``, or ``_`` for a topic that is
not a partition. Giving the partition a token of its own is what lets one NATS wildcard cover all
the partitions of a topic (``...<ns>.<base>.*``), which a suffix inside one token could not.
``docs/bus.md`` has the table of who serves and who calls each subject.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from enum import StrEnum
from typing import TypeAlias

from danube.bus.errors import InvalidSubjectError
from danube.names import InvalidNameError, TopicName, topic_name, validate_segment

DEFAULT_PREFIX = "danube"

MAX_OP_CHARS = 64
"""Limit on a dispatcher operation token; the mesh's own are a few characters."""

NO_PARTITION = "_"
"""The partition token of a topic that is not a partition of a partitioned topic."""

CLOUD_READER_QUEUE = "cloud_reader"
"""The queue group every cloud_reader joins, so each fetch goes to one of them."""

_PARTITION_TOKEN = re.compile(r"0|[1-9][0-9]*")

TopicLike: TypeAlias = TopicName | str
"""What the builders accept: a :class:`~danube.names.TopicName` or its string form."""


class Kind(StrEnum):
    """What a subject is for; the value is its token(s) after the prefix."""

    PRODUCE = "produce"  # request: discovery -> the ingest owning the partition
    LIVE = "live"  # publish: ingest -> dispatchers, messages once durable
    WAL_FETCH = "wal.fetch"  # request: read a range of the partition's WAL
    WAL_DROP_BELOW = "wal.drop"  # request: retention -> ingest, drop segments below an offset
    WAL_STATS = "wal.stats"  # request: offsets and sizes of the partition's WAL
    WAL_TIME = "wal.time"  # request: the first offset published at or after a time
    WAL_DELETE = "wal.delete"  # publish: discovery -> every ingest, a topic was deleted
    REPL_FETCH = "repl.fetch"  # request: follower -> leader, frames from an offset (long poll)
    REPL_EPOCHS = "repl.epochs"  # request: follower -> leader, its leader-epoch history
    REPL_LEAVE = "repl.leave"  # request: follower -> leader, it stops: out of the ISR now
    # request: a replica -> one named replica (leader or follower), a range of that copy:
    # reading around, and repairing, a damaged copy (docs/replication.md, "Damaged copies")
    REPL_READ = "repl.read"
    CLOUD_FETCH = "cloud.fetch"  # request: read a range from object storage (queue group)
    CLOUD_TIME = "cloud.time"  # request: the first uploaded offset published at or after a time
    OWNERSHIP = "ctl.owner"  # publish: controller -> all, a partition changed owner
    # request: a producer -> every ingest node (no queue group: the first answer wins, so a
    # frozen node that holds its subscription cannot swallow it), can the partition lead?
    LEADER_PROBE = "ctl.probe"
    SUBSCRIPTION_OWNERSHIP = "ctl.subowner"  # publish: controller -> all, a subscription moved
    # publish: a dispatcher -> every dispatcher, it claimed (or reclaimed) a subscription: a
    # dispatcher serving it without its lease stops (docs/dispatcher.md, "Through an etcd outage")
    SUBSCRIPTION_CLAIMED = "ctl.subclaimed"
    DISPATCH = "disp"  # request: discovery -> the dispatcher owning a subscription

    @property
    def extra_tokens(self) -> int:
        """How many tokens follow the topic: 0, 1 (subscription) or 2 (subscription, op)."""
        if self is Kind.DISPATCH:
            return 2
        if self in (Kind.SUBSCRIPTION_OWNERSHIP, Kind.SUBSCRIPTION_CLAIMED, Kind.REPL_READ):
            return 1  # the subscription; the replica's node (Subjects.repl_read)
        return 0


_KINDS_BY_TOKENS: dict[tuple[str, ...], Kind] = {tuple(k.value.split(".")): k for k in Kind}


class DispatchOp(StrEnum):
    """The operations a dispatcher serves for a subscription (the last token of a subject).

    Any token that passes :func:`validate_op` is accepted by :meth:`Subjects.dispatch`; these are
    the ones the mesh uses, named once here so the two sides cannot drift apart.
    """

    ATTACH = "attach"
    DETACH = "detach"
    POLL = "poll"
    ACK = "ack"
    NACK = "nack"
    SEEK = "seek"
    SKIP = "skip"
    STATS = "stats"
    DELETE = "delete"
    POLICY = "policy"  # read or replace the subscription's failure policy


def node_token(node_id: str) -> str:
    """The subject token naming a node: its id when that is a valid segment, else a hash of
    it (node ids are free text up to 128 characters; both sides compute the same token)."""
    try:
        return validate_segment("node", node_id)
    except InvalidNameError:
        return "n-" + hashlib.blake2b(node_id.encode(), digest_size=12).hexdigest()


def validate_op(op: str) -> str:
    """Return ``op`` if it is a valid dispatcher operation token, else raise InvalidNameError."""
    return validate_segment("operation", op, max_chars=MAX_OP_CHARS)


@dataclass(frozen=True, slots=True)
class ParsedSubject:
    """A subject taken apart by :meth:`Subjects.parse`."""

    kind: Kind
    name: TopicName
    subscription: str | None = None
    op: str | None = None

    @property
    def namespace(self) -> str:
        """The topic's namespace."""
        return self.name.namespace

    @property
    def topic(self) -> str:
        """The topic segment, partition suffix included (``orders-part-3``)."""
        return self.name.topic


class Subjects:
    """Builds and parses the mesh's subjects under one prefix (``BusConfig.subject_prefix``)."""

    def __init__(self, prefix: str = DEFAULT_PREFIX) -> None:
        validate_segment("subject prefix", prefix)
        self.prefix = prefix

    def _topic_tokens(self, topic: TopicLike) -> str:
        name = topic_name(topic)
        index = name.partition
        partition = NO_PARTITION if index is None else str(index)
        return f"{name.namespace}.{name.base}.{partition}"

    def for_topic(self, kind: Kind, topic: TopicLike) -> str:
        """The subject of a topic-level ``kind`` (one with no subscription token) for ``topic``."""
        if kind.extra_tokens:
            raise InvalidNameError(
                kind="subject kind",
                value=kind.value,
                reason="this kind needs a subscription; use its method",
            )
        return f"{self.prefix}.{kind.value}.{self._topic_tokens(topic)}"

    def produce(self, topic: TopicLike) -> str:
        """Requests to append messages, served by the ingest that owns the partition."""
        return self.for_topic(Kind.PRODUCE, topic)

    def live(self, topic: TopicLike) -> str:
        """Messages published by ingest once they are durable."""
        return self.for_topic(Kind.LIVE, topic)

    def wal_fetch(self, topic: TopicLike) -> str:
        """Requests to read the partition's WAL, served by its ingest owner."""
        return self.for_topic(Kind.WAL_FETCH, topic)

    def wal_drop_below(self, topic: TopicLike) -> str:
        """Requests to drop WAL segments below an offset, served by the ingest owner."""
        return self.for_topic(Kind.WAL_DROP_BELOW, topic)

    def wal_stats(self, topic: TopicLike) -> str:
        """Requests for the partition's WAL offsets and sizes, served by the ingest owner."""
        return self.for_topic(Kind.WAL_STATS, topic)

    def wal_offset_for_time(self, topic: TopicLike) -> str:
        """Requests for the first offset published at or after a time, served by the owner."""
        return self.for_topic(Kind.WAL_TIME, topic)

    def wal_delete(self, topic: TopicLike) -> str:
        """Broadcast when a topic is deleted: every ingest node drops its WAL of the partition."""
        return self.for_topic(Kind.WAL_DELETE, topic)

    def repl_fetch(self, topic: TopicLike) -> str:
        """Follower fetches of a partition's frames, served by its leader."""
        return self.for_topic(Kind.REPL_FETCH, topic)

    def repl_epochs(self, topic: TopicLike) -> str:
        """Followers ask the leader for its leader-epoch history (to find where they diverge)."""
        return self.for_topic(Kind.REPL_EPOCHS, topic)

    def repl_leave(self, topic: TopicLike) -> str:
        """A follower that stops cleanly asks the leader to take it out of the ISR."""
        return self.for_topic(Kind.REPL_LEAVE, topic)

    def repl_read(self, topic: TopicLike, node_id: str) -> str:
        """A range of one replica's copy (``node_id``'s), whether it leads or follows."""
        kind = Kind.REPL_READ.value
        return f"{self.prefix}.{kind}.{self._topic_tokens(topic)}.{node_token(node_id)}"

    def cloud_fetch(self, topic: TopicLike) -> str:
        """Requests to read from object storage, served by the cloud_reader queue group."""
        return self.for_topic(Kind.CLOUD_FETCH, topic)

    def cloud_offset_for_time(self, topic: TopicLike) -> str:
        """Requests for the first uploaded offset published at or after a time, served by
        the cloud_reader queue group."""
        return self.for_topic(Kind.CLOUD_TIME, topic)

    def ownership(self, topic: TopicLike) -> str:
        """Announcements that a partition changed owner, published by the controller."""
        return self.for_topic(Kind.OWNERSHIP, topic)

    def leader_probe(self, topic: TopicLike) -> str:
        """Requests asking whether the partition has, or may get, a leader; every ingest
        node answers (the first answer wins)."""
        return self.for_topic(Kind.LEADER_PROBE, topic)

    def subscription_ownership(self, topic: TopicLike, subscription: str) -> str:
        """Announcements that a subscription moved to another dispatcher."""
        validate_segment("subscription", subscription)
        kind = Kind.SUBSCRIPTION_OWNERSHIP.value
        return f"{self.prefix}.{kind}.{self._topic_tokens(topic)}.{subscription}"

    def subscription_claimed(self, topic: TopicLike, subscription: str) -> str:
        """Where a dispatcher announces that it claimed ``subscription`` of ``topic``."""
        validate_segment("subscription", subscription)
        kind = Kind.SUBSCRIPTION_CLAIMED.value
        return f"{self.prefix}.{kind}.{self._topic_tokens(topic)}.{subscription}"

    def dispatch(self, topic: TopicLike, subscription: str, op: str) -> str:
        """Requests ``op`` on a subscription, served by the dispatcher that owns it."""
        validate_segment("subscription", subscription)
        validate_op(op)
        return (
            f"{self.prefix}.{Kind.DISPATCH.value}.{self._topic_tokens(topic)}.{subscription}.{op}"
        )

    def dispatch_all_ops(self, topic: TopicLike, subscription: str) -> str:
        """Wildcard over every operation of one subscription (what its owner subscribes to)."""
        validate_segment("subscription", subscription)
        return f"{self.prefix}.{Kind.DISPATCH.value}.{self._topic_tokens(topic)}.{subscription}.*"

    def all_partitions(self, kind: Kind, topic: TopicLike) -> str:
        """Wildcard over every partition of ``topic`` (also matches it unpartitioned)."""
        name = topic_name(topic)
        if name.partition is not None:
            raise InvalidNameError(
                kind="topic", value=str(name), reason="expected a topic, got one of its partitions"
            )
        tail = ".*" * kind.extra_tokens
        return f"{self.prefix}.{kind.value}.{name.namespace}.{name.topic}.*{tail}"

    def all_topics(self, kind: Kind, namespace: str) -> str:
        """Wildcard over every topic and partition of ``namespace``."""
        validate_segment("namespace", namespace)
        return f"{self.prefix}.{kind.value}.{namespace}.>"

    def all_of_kind(self, kind: Kind) -> str:
        """Wildcard over every subject of ``kind`` (what a queue group member subscribes to)."""
        return f"{self.prefix}.{kind.value}.>"

    def parse(self, subject: str) -> ParsedSubject:
        """Take a concrete subject of this prefix apart; raise InvalidSubjectError otherwise."""
        tokens = subject.split(".")
        if tokens[0] != self.prefix:
            raise InvalidSubjectError(subject, f"does not start with {self.prefix!r}")
        kind = _KINDS_BY_TOKENS.get(tuple(tokens[1:3])) or _KINDS_BY_TOKENS.get(tuple(tokens[1:2]))
        if kind is None:
            raise InvalidSubjectError(subject, "unknown kind")
        rest = tokens[1 + len(kind.value.split(".")) :]
        if len(rest) != 3 + kind.extra_tokens:
            raise InvalidSubjectError(
                subject, f"{kind.value!r} takes {3 + kind.extra_tokens} tokens after the kind"
            )
        namespace, base, partition = rest[:3]
        if partition != NO_PARTITION and not _PARTITION_TOKEN.fullmatch(partition):
            raise InvalidSubjectError(subject, f"bad partition token {partition!r}")
        topic = base if partition == NO_PARTITION else f"{base}-part-{partition}"
        try:
            name = TopicName(namespace, topic)
            if partition == NO_PARTITION and name.partition is not None:
                # "/ns/t-part-3" is always written with its own partition token, never as "_".
                raise InvalidNameError(
                    kind="topic", value=topic, reason="a partition's name in the base token"
                )
            # For REPL_READ the extra token is the replica's node token, not a subscription.
            subscription = (
                validate_segment("subscription", rest[3]) if kind.extra_tokens >= 1 else None
            )
            op = validate_op(rest[4]) if kind.extra_tokens >= 2 else None
        except InvalidNameError as exc:
            raise InvalidSubjectError(subject, exc.reason) from exc
        return ParsedSubject(kind=kind, name=name, subscription=subscription, op=op)

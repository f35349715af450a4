"""Topic names and the NATS subjects of the mesh, built and parsed with no I/O.

A topic name is ``/<namespace>/<topic>``; each segment is letters, digits, ``_`` and ``-``, and the
whole name is at most :data:`MAX_TOPIC_NAME_CHARS` characters. Partition ``N`` of a partitioned
topic ``/<ns>/<t>`` is the topic ``/<ns>/<t>-part-N`` (``N`` in decimal, no leading zero).

Every subject has a fixed number of tokens so it parses without guessing::

    <prefix>.<kind>.<namespace>.<base>.<partition>[.<subscription>[.<op>]]

``<kind>`` is one or two tokens (``produce``, ``wal.fetch``...; see :class:`Kind`), ``<base>`` is
the topic without its ``-part-N`` suffix and ``<partition>`` is ``N``, or ``_`` for a topic that is
not a partition. Giving the partition a token of its own is what lets one NATS wildcard cover all
the partitions of a topic (``...<ns>.<base>.*``), which a suffix inside one token could not.
``docs/bus.md`` has the table of who serves and who calls each subject.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import StrEnum
from typing import TypeAlias

from danube.bus.errors import InvalidNameError, InvalidSubjectError

DEFAULT_PREFIX = "danube"

MAX_TOPIC_NAME_CHARS = 255
"""Limit on a whole topic name, ``/<ns>/<topic>`` included; keeps subjects and etcd keys short."""

MAX_NAME_CHARS = 255
"""Limit on a namespace, subscription or prefix on its own."""

MAX_OP_CHARS = 64

NO_PARTITION = "_"
"""The partition token of a topic that is not a partition of a partitioned topic."""

CLOUD_READER_QUEUE = "cloud_reader"
"""The queue group every cloud_reader joins, so each fetch goes to one of them."""

_SEGMENT = re.compile(r"[A-Za-z0-9_-]+")
_PARTITION_SUFFIX = re.compile(r"(?P<base>[A-Za-z0-9_-]+)-part-(?P<index>0|[1-9][0-9]*)")
_PARTITION_TOKEN = re.compile(r"0|[1-9][0-9]*")


class Kind(StrEnum):
    """What a subject is for; the value is its token(s) after the prefix."""

    PRODUCE = "produce"  # request: discovery -> the ingest owning the partition
    LIVE = "live"  # publish: ingest -> dispatchers, messages once durable
    WAL_FETCH = "wal.fetch"  # request: read a range of the partition's WAL
    WAL_DROP_BELOW = "wal.drop"  # request: retention -> ingest, drop segments below an offset
    WAL_STATS = "wal.stats"  # request: offsets and sizes of the partition's WAL
    CLOUD_FETCH = "cloud.fetch"  # request: read a range from object storage (queue group)
    OWNERSHIP = "ctl.owner"  # publish: controller -> all, a partition changed owner
    SUBSCRIPTION_OWNERSHIP = "ctl.subowner"  # publish: controller -> all, a subscription moved
    DISPATCH = "disp"  # request: discovery -> the dispatcher owning a subscription

    @property
    def extra_tokens(self) -> int:
        """How many tokens follow the topic: 0, 1 (subscription) or 2 (subscription, op)."""
        if self is Kind.DISPATCH:
            return 2
        if self is Kind.SUBSCRIPTION_OWNERSHIP:
            return 1
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
    STATS = "stats"
    DELETE = "delete"


def _check_segment(value: str, what: str, limit: int) -> None:
    if not value:
        raise InvalidNameError(value, f"{what} is empty")
    if len(value) > limit:
        raise InvalidNameError(value, f"{what} is longer than {limit} characters")
    if not _SEGMENT.fullmatch(value):
        raise InvalidNameError(value, f"{what} may hold only letters, digits, '_' and '-'")


def validate_namespace(namespace: str) -> str:
    """Return ``namespace`` if it is a valid namespace name, else raise InvalidNameError."""
    _check_segment(namespace, "namespace", MAX_NAME_CHARS)
    return namespace


def validate_subscription(subscription: str) -> str:
    """Return ``subscription`` if it is a valid subscription name, else raise InvalidNameError."""
    _check_segment(subscription, "subscription name", MAX_NAME_CHARS)
    return subscription


def validate_op(op: str) -> str:
    """Return ``op`` if it is a valid dispatcher operation token, else raise InvalidNameError."""
    _check_segment(op, "operation", MAX_OP_CHARS)
    return op


@dataclass(frozen=True, slots=True)
class TopicName:
    """A validated topic name, ``/<namespace>/<topic>``; construction checks every rule."""

    namespace: str
    topic: str

    def __post_init__(self) -> None:
        _check_segment(self.namespace, "namespace", MAX_NAME_CHARS)
        _check_segment(self.topic, "topic", MAX_NAME_CHARS)
        if len(str(self)) > MAX_TOPIC_NAME_CHARS:
            raise InvalidNameError(
                str(self), f"topic name is longer than {MAX_TOPIC_NAME_CHARS} characters"
            )

    @classmethod
    def parse(cls, name: str) -> TopicName:
        """Parse ``/<namespace>/<topic>``; raise InvalidNameError for anything else."""
        if len(name) > MAX_TOPIC_NAME_CHARS:
            raise InvalidNameError(
                name[:64] + "...", f"topic name is longer than {MAX_TOPIC_NAME_CHARS} characters"
            )
        parts = name.split("/")
        if len(parts) != 3 or parts[0] != "":
            raise InvalidNameError(name, "a topic name is '/<namespace>/<topic>'")
        return cls(parts[1], parts[2])

    @property
    def base(self) -> str:
        """The topic without its ``-part-N`` suffix (the topic itself when not a partition)."""
        match = _PARTITION_SUFFIX.fullmatch(self.topic)
        return self.topic if match is None else match["base"]

    @property
    def partition(self) -> int | None:
        """``N`` when this is partition ``N`` of a partitioned topic, else ``None``."""
        match = _PARTITION_SUFFIX.fullmatch(self.topic)
        return None if match is None else int(match["index"])

    def partition_name(self, index: int) -> TopicName:
        """The name of partition ``index`` of this (partitioned) topic: ``/<ns>/<t>-part-N``."""
        if self.partition is not None:
            raise InvalidNameError(str(self), "a partition has no partitions of its own")
        if index < 0:
            raise InvalidNameError(str(self), f"partition index {index} is negative")
        return TopicName(self.namespace, f"{self.topic}-part-{index}")

    def __str__(self) -> str:
        return f"/{self.namespace}/{self.topic}"


TopicLike: TypeAlias = TopicName | str


def topic_name(topic: TopicLike) -> TopicName:
    """Accept a :class:`TopicName` or its string form; raise InvalidNameError if invalid."""
    return topic if isinstance(topic, TopicName) else TopicName.parse(topic)


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
        _check_segment(prefix, "subject prefix", MAX_NAME_CHARS)
        self.prefix = prefix

    def _topic_tokens(self, topic: TopicLike) -> str:
        name = topic_name(topic)
        index = name.partition
        partition = NO_PARTITION if index is None else str(index)
        return f"{name.namespace}.{name.base}.{partition}"

    def for_topic(self, kind: Kind, topic: TopicLike) -> str:
        """The subject of a topic-level ``kind`` (one with no subscription token) for ``topic``."""
        if kind.extra_tokens:
            raise InvalidNameError(kind.value, "this kind needs a subscription; use its method")
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

    def cloud_fetch(self, topic: TopicLike) -> str:
        """Requests to read from object storage, served by the cloud_reader queue group."""
        return self.for_topic(Kind.CLOUD_FETCH, topic)

    def ownership(self, topic: TopicLike) -> str:
        """Announcements that a partition changed owner, published by the controller."""
        return self.for_topic(Kind.OWNERSHIP, topic)

    def subscription_ownership(self, topic: TopicLike, subscription: str) -> str:
        """Announcements that a subscription moved to another dispatcher."""
        validate_subscription(subscription)
        kind = Kind.SUBSCRIPTION_OWNERSHIP.value
        return f"{self.prefix}.{kind}.{self._topic_tokens(topic)}.{subscription}"

    def dispatch(self, topic: TopicLike, subscription: str, op: str) -> str:
        """Requests ``op`` on a subscription, served by the dispatcher that owns it."""
        validate_subscription(subscription)
        validate_op(op)
        return (
            f"{self.prefix}.{Kind.DISPATCH.value}.{self._topic_tokens(topic)}.{subscription}.{op}"
        )

    def dispatch_all_ops(self, topic: TopicLike, subscription: str) -> str:
        """Wildcard over every operation of one subscription (what its owner subscribes to)."""
        validate_subscription(subscription)
        return f"{self.prefix}.{Kind.DISPATCH.value}.{self._topic_tokens(topic)}.{subscription}.*"

    def all_partitions(self, kind: Kind, topic: TopicLike) -> str:
        """Wildcard over every partition of ``topic`` (also matches it unpartitioned)."""
        name = topic_name(topic)
        if name.partition is not None:
            raise InvalidNameError(str(name), "expected a topic, got one of its partitions")
        tail = ".*" * kind.extra_tokens
        return f"{self.prefix}.{kind.value}.{name.namespace}.{name.topic}.*{tail}"

    def all_topics(self, kind: Kind, namespace: str) -> str:
        """Wildcard over every topic and partition of ``namespace``."""
        validate_namespace(namespace)
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
                raise InvalidNameError(topic, "a partition's name in the base token")
            subscription = validate_subscription(rest[3]) if kind.extra_tokens >= 1 else None
            op = validate_op(rest[4]) if kind.extra_tokens >= 2 else None
        except InvalidNameError as exc:
            raise InvalidSubjectError(subject, exc.reason) from exc
        return ParsedSubject(kind=kind, name=name, subscription=subscription, op=op)

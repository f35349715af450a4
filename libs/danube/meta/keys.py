"""The etcd key layout of the mesh: every key a service reads or writes, as pure functions.

Keys are relative to the store prefix (``metadata.prefix``, default ``/danube``), which
:class:`~danube.meta.store.MetaStore` adds, so one etcd can hold several clusters or tests::

    namespaces/<ns>                                        NamespacePolicy
    topics/<ns>/<topic>                                    TopicConfig
    partitions/<ns>/<partition>/owner                      Owner        (ingest node + epoch)
    partitions/<ns>/<partition>/reservation                OffsetReservation
    partitions/<ns>/<partition>/uploader                   Owner        (uploader node + epoch)
    storage/<ns>/<partition>/objects/<start:020>           ObjectDescriptor
    storage/<ns>/<partition>/checkpoint                    UploaderCheckpoint
    subscriptions/<ns>/<topic>/<sub>/config                SubscriptionConfig
    subscriptions/<ns>/<topic>/<sub>/owner                 Owner        (dispatcher node + epoch)
    subscriptions/<ns>/<topic>/<sub>/cursors/<partition>   SubscriptionCursor
    nodes/<kind>/<node_id>                                 NodeRecord   (leased)
    elections/<name>                                       candidate id (leased)

``<partition>`` is the topic segment of a partition: the topic itself when it is not
partitioned, ``<topic>-part-<i>`` when it is. Records of one kind sit at one depth and every
prefix helper ends in ``/``, so a prefix range never catches a sibling (``orders`` vs
``orders2``). docs/metadata.md gives the writers, readers and leases of each key.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal, Protocol, get_args

from danube.meta.errors import InvalidNameError

# The same limits and rules as danube.bus.subjects, so both accept exactly the same names.
MAX_NAME_CHARS = 255
MAX_TOPIC_NAME_CHARS = 255
# Names users choose: namespaces, topics, subscriptions; also election names and node ids.
_SEGMENT_RE = re.compile(r"[A-Za-z0-9_-]+")
# Node ids are often host names, so dots are allowed too.
_NODE_ID_RE = re.compile(r"[A-Za-z0-9._-]+")
_PARTITION_RE = re.compile(r"(?P<base>[A-Za-z0-9_-]+)-part-(?P<index>0|[1-9][0-9]*)")
# Object descriptors sort by start offset because offsets are zero-padded to the u64 width.
OFFSET_DIGITS = 20
OFFSET_MAX = 2**64 - 1

ServiceKind = Literal["discovery", "ingest", "uploader", "retention", "cloud_reader", "dispatcher"]
SERVICE_KINDS: tuple[ServiceKind, ...] = get_args(ServiceKind)

CONTROLLER_ELECTION = "controller"
RETENTION_ELECTION = "retention"

NAMESPACES_PREFIX = "namespaces/"
NODES_PREFIX = "nodes/"
ELECTIONS_PREFIX = "elections/"


def validate_segment(kind: str, value: str) -> str:
    """Return ``value`` if it is a valid name segment (letters, digits, ``_``, ``-``)."""
    return _validate(kind, value, _SEGMENT_RE, "letters, digits, '_' and '-'")


def validate_node_id(node_id: str) -> str:
    """Return ``node_id`` if valid: letters, digits, ``.``, ``_``, ``-``."""
    return _validate("node id", node_id, _NODE_ID_RE, "letters, digits, '.', '_' and '-'")


def _validate(kind: str, value: str, pattern: re.Pattern[str], allowed: str) -> str:
    if not value:
        raise InvalidNameError(kind=kind, value=value, reason="empty")
    if len(value) > MAX_NAME_CHARS:
        raise InvalidNameError(
            kind=kind, value=value[:64] + "...", reason=f"longer than {MAX_NAME_CHARS} characters"
        )
    if pattern.fullmatch(value) is None:
        raise InvalidNameError(kind=kind, value=value, reason=f"only {allowed} are allowed")
    return value


class TopicLike(Protocol):
    """Any topic name with a namespace and a topic segment (this module's :class:`TopicName`,
    or ``danube.bus.TopicName``, which follows the same rules)."""

    @property
    def namespace(self) -> str: ...

    @property
    def topic(self) -> str: ...


def _segments(topic: TopicLike) -> str:
    """``<ns>/<topic>`` for a key, checked again: any :class:`TopicLike` is accepted."""
    return (
        f"{validate_segment('namespace', topic.namespace)}/{validate_segment('topic', topic.topic)}"
    )


@dataclass(frozen=True, slots=True)
class TopicName:
    """A validated topic name ``/<namespace>/<topic>``; also names one partition of a topic."""

    namespace: str
    topic: str

    def __post_init__(self) -> None:
        validate_segment("namespace", self.namespace)
        validate_segment("topic", self.topic)
        if len(str(self)) > MAX_TOPIC_NAME_CHARS:
            raise InvalidNameError(
                kind="topic name",
                value=str(self)[:64] + "...",
                reason=f"longer than {MAX_TOPIC_NAME_CHARS} characters",
            )

    @classmethod
    def parse(cls, name: str) -> TopicName:
        """Parse ``/<ns>/<topic>``; raise :class:`InvalidNameError` on anything else."""
        parts = name.split("/")
        if len(parts) != 3 or parts[0] != "":
            raise InvalidNameError(kind="topic name", value=name, reason="not /<namespace>/<topic>")
        return cls(parts[1], parts[2])

    def __str__(self) -> str:
        return f"/{self.namespace}/{self.topic}"

    @property
    def base(self) -> str:
        """The topic segment without its ``-part-N`` suffix (itself when not a partition)."""
        match = _PARTITION_RE.fullmatch(self.topic)
        return self.topic if match is None else match["base"]

    @property
    def partition(self) -> int | None:
        """``N`` when this is partition ``N`` (``<topic>-part-N``) of a topic, else ``None``."""
        match = _PARTITION_RE.fullmatch(self.topic)
        return None if match is None else int(match["index"])

    @property
    def parent(self) -> TopicName:
        """The partitioned topic this partition belongs to (itself when not a partition)."""
        return self if self.partition is None else TopicName(self.namespace, self.base)

    def partition_name(self, index: int) -> TopicName:
        """The name of partition ``index`` of this (partitioned) topic: ``<topic>-part-N``."""
        if self.partition is not None:
            raise InvalidNameError(
                kind="topic", value=str(self), reason="a partition has no partitions of its own"
            )
        if index < 0:
            raise InvalidNameError(kind="partition", value=str(index), reason="negative index")
        return TopicName(self.namespace, f"{self.topic}-part-{index}")

    def partitions(self, count: int) -> list[TopicName]:
        """The partitions a topic with ``count`` partitions is served as (itself when 0)."""
        if count < 0:
            raise InvalidNameError(kind="partition count", value=str(count), reason="negative")
        return [self] if count == 0 else [self.partition_name(i) for i in range(count)]


# --- namespaces and topics -----------------------------------------------------------


def namespace_key(namespace: str) -> str:
    """``namespaces/<ns>``: the namespace and its policies."""
    return NAMESPACES_PREFIX + validate_segment("namespace", namespace)


def topic_key(topic: TopicLike) -> str:
    """``topics/<ns>/<topic>``: the topic's config (partitions, dispatch, durability...)."""
    return "topics/" + _segments(topic)


def topics_prefix(namespace: str | None = None) -> str:
    """All topic configs, or those of one namespace."""
    if namespace is None:
        return "topics/"
    return f"topics/{validate_segment('namespace', namespace)}/"


def parse_topic_key(key: str) -> TopicName:
    """The topic of a ``topics/<ns>/<topic>`` key."""
    parts = key.split("/")
    if len(parts) != 3 or parts[0] != "topics":
        raise InvalidNameError(kind="topic key", value=key, reason="not topics/<ns>/<topic>")
    return TopicName(parts[1], parts[2])


# --- partitions: ownership, offset reservations, uploader assignment ------------------


def partitions_prefix(namespace: str | None = None) -> str:
    """All partition records, or those of one namespace."""
    if namespace is None:
        return "partitions/"
    return f"partitions/{validate_segment('namespace', namespace)}/"


def partition_prefix(partition: TopicLike) -> str:
    """Every record of one partition."""
    return "partitions/" + _segments(partition) + "/"


def partition_owner_key(partition: TopicLike) -> str:
    """``partitions/<ns>/<p>/owner``: the ingest node that owns the partition, with its epoch."""
    return partition_prefix(partition) + "owner"


def offset_reservation_key(partition: TopicLike) -> str:
    """``partitions/<ns>/<p>/reservation``: the offsets the owner may assign, up to an end."""
    return partition_prefix(partition) + "reservation"


def uploader_assignment_key(partition: TopicLike) -> str:
    """``partitions/<ns>/<p>/uploader``: the uploader node that moves the partition's WAL."""
    return partition_prefix(partition) + "uploader"


def parse_partition_key(key: str) -> tuple[TopicName, str]:
    """The partition and the record name (``owner``...) of a ``partitions/...`` key."""
    parts = key.split("/")
    if len(parts) != 4 or parts[0] != "partitions":
        raise InvalidNameError(
            kind="partition key", value=key, reason="not partitions/<ns>/<p>/<record>"
        )
    return TopicName(parts[1], parts[2]), parts[3]


# --- object storage: descriptors and the uploader checkpoint -------------------------


def format_offset(offset: int) -> str:
    """An offset as the 20 zero-padded digits that make keys sort by offset."""
    if not 0 <= offset <= OFFSET_MAX:
        raise InvalidNameError(kind="offset", value=str(offset), reason="outside 0..2**64-1")
    return f"{offset:0{OFFSET_DIGITS}d}"


def object_descriptors_prefix(partition: TopicLike) -> str:
    """All object descriptors of a partition, sorted by start offset."""
    return "storage/" + _segments(partition) + "/objects/"


def object_descriptor_key(partition: TopicLike, start_offset: int) -> str:
    """``storage/<ns>/<p>/objects/<start:020>``: the object whose first offset is ``start``."""
    return object_descriptors_prefix(partition) + format_offset(start_offset)


def parse_object_descriptor_key(key: str) -> tuple[TopicName, int]:
    """The partition and start offset of an object descriptor key."""
    parts = key.split("/")
    if (
        len(parts) != 5
        or parts[0] != "storage"
        or parts[3] != "objects"
        or len(parts[4]) != OFFSET_DIGITS
        or not parts[4].isdigit()
        or not parts[4].isascii()
    ):
        raise InvalidNameError(
            kind="object descriptor key", value=key, reason="not storage/<ns>/<p>/objects/<020>"
        )
    start = int(parts[4])
    format_offset(start)  # the 20 digits may still exceed u64
    return TopicName(parts[1], parts[2]), start


def uploader_checkpoint_key(partition: TopicLike) -> str:
    """``storage/<ns>/<p>/checkpoint``: how far the partition's WAL is uploaded."""
    return "storage/" + _segments(partition) + "/checkpoint"


# --- subscriptions: config, dispatcher assignment, cursors ---------------------------


def subscriptions_prefix(topic: TopicLike) -> str:
    """Every record of every subscription of a topic."""
    return "subscriptions/" + _segments(topic) + "/"


def subscription_prefix(topic: TopicLike, subscription: str) -> str:
    """Every record of one subscription."""
    return subscriptions_prefix(topic) + validate_segment("subscription", subscription) + "/"


def subscription_key(topic: TopicLike, subscription: str) -> str:
    """``subscriptions/<ns>/<t>/<sub>/config``: the subscription's type and start."""
    return subscription_prefix(topic, subscription) + "config"


def subscription_owner_key(topic: TopicLike, subscription: str) -> str:
    """``subscriptions/<ns>/<t>/<sub>/owner``: the dispatcher node serving it, with its epoch."""
    return subscription_prefix(topic, subscription) + "owner"


def subscription_cursors_prefix(topic: TopicLike, subscription: str) -> str:
    """The cursors of one subscription, one per partition."""
    return subscription_prefix(topic, subscription) + "cursors/"


def subscription_cursor_key(topic: TopicLike, subscription: str, partition: TopicLike) -> str:
    """``subscriptions/<ns>/<t>/<sub>/cursors/<p>``: the subscription's position in ``p``."""
    own = TopicName(partition.namespace, partition.topic)
    if own.parent != TopicName(topic.namespace, topic.topic):
        raise InvalidNameError(
            kind="partition", value=str(own), reason=f"not a partition of /{_segments(topic)}"
        )
    return subscription_cursors_prefix(topic, subscription) + own.topic


def parse_subscription_key(key: str) -> tuple[TopicName, str, str]:
    """The topic, subscription and record (``config``, ``owner``, ``cursors/<p>``) of a key."""
    parts = key.split("/", 4)
    if len(parts) != 5 or parts[0] != "subscriptions":
        raise InvalidNameError(
            kind="subscription key", value=key, reason="not subscriptions/<ns>/<t>/<sub>/..."
        )
    return TopicName(parts[1], parts[2]), validate_segment("subscription", parts[3]), parts[4]


# --- nodes and elections ---------------------------------------------------------------


def _validate_kind(kind: str) -> ServiceKind:
    for known in SERVICE_KINDS:
        if kind == known:
            return known
    raise InvalidNameError(kind="service kind", value=kind, reason=f"not one of {SERVICE_KINDS}")


def nodes_prefix(kind: ServiceKind | None = None) -> str:
    """Every registered node, or those of one service kind."""
    return NODES_PREFIX if kind is None else f"{NODES_PREFIX}{_validate_kind(kind)}/"


def node_key(kind: ServiceKind, node_id: str) -> str:
    """``nodes/<kind>/<node_id>``: a live node of a service, attached to the node's lease."""
    return nodes_prefix(kind) + validate_node_id(node_id)


def parse_node_key(key: str) -> tuple[ServiceKind, str]:
    """The service kind and node id of a ``nodes/<kind>/<node_id>`` key."""
    parts = key.split("/")
    if len(parts) != 3 or parts[0] != "nodes":
        raise InvalidNameError(kind="node key", value=key, reason="not nodes/<kind>/<node_id>")
    return _validate_kind(parts[1]), validate_node_id(parts[2])


def election_key(name: str) -> str:
    """``elections/<name>``: the leader of ``name``; its value is the leader's candidate id."""
    return ELECTIONS_PREFIX + validate_segment("election", name)

"""The etcd key layout of the mesh: every key a service reads or writes, as pure functions.

Keys are relative to the store prefix (``metadata.prefix``, default ``/danube``), which
:class:`~danube.meta.store.MetaStore` adds, so one etcd can hold several clusters or tests::

    namespaces/<ns>                                        NamespacePolicy
    topics/<ns>/<topic>                                    TopicConfig
    partitions/<ns>/<partition>/owner                      Owner        (leader + epoch, leased)
    partitions/<ns>/<partition>/state                      PartitionState (leader, epoch, ISR)
    partitions/<ns>/<partition>/assignment                 Assignment   (the replica set)
    partitions/<ns>/<partition>/uploader                   Owner        (uploader node + epoch)
    storage/<ns>/<partition>/objects/<start:020>           storage.ObjectDescriptor
    storage/<ns>/<partition>/checkpoint                    UploaderCheckpoint
    cluster/object_store                                   ObjectStoreRecord (no secrets)
    subscriptions/<ns>/<topic>/<sub>/config                SubscriptionConfig
    subscriptions/<ns>/<topic>/<sub>/owner                 Owner        (dispatcher node + epoch)
    subscriptions/<ns>/<topic>/<sub>/cursors/<partition>   SubscriptionCursor
    producers/<ns>/<topic>/<scope>_<producer_id>           ProducerRecord (session lease)
    producers/<ns>/<topic>/x_<scope>                       producer id  (session lease)
    producer_epochs/<ns>/<topic>/<producer name, quoted>   the producer's epoch (decimal)
    schemas/next_id                                        the next schema id (a counter)
    schemas/ids/<schema_id:020>                            the subject of a schema id
    schemas/subjects/<subject>/subject                     SchemaSubject (id, type, mode)
    schemas/subjects/<subject>/versions/<version:010>      SchemaVersionRecord
    schemas/subjects/<subject>/fingerprints/<sha256>       version number (live versions)
    schemas/topics/<ns>/<topic>                            TopicSchemaRecord (binding)
    security/roles/<role>                                  security.Role
    security/bindings/<binding_id>                         security.Binding
    security/api_keys/<key_id>                             security.apikeys.ApiKeyRecord
    nodes/<kind>/<node_id>                                 NodeRecord   (leased)
    drains/<kind>/<node_id>                                DrainRecord  (an operator's drain)
    elections/<name>                                       candidate id (leased)

``<scope>`` is ``all`` (a producer of the whole topic) or ``p<N>`` (of its partition ``N``).
``<partition>`` is the topic segment of a partition: the topic itself when it is not
partitioned, ``<topic>-part-<i>`` when it is. Records of one kind sit at one depth and every
prefix helper ends in ``/``, so a prefix range never catches a sibling (``orders`` vs
``orders2``). docs/metadata.md gives the writers, readers and leases of each key.

``<ns>``, ``<topic>``, ``<sub>`` and election names follow the rules of :mod:`danube.names`
(which also defines :class:`~danube.names.TopicName`); node ids may also hold ``.``. A bad
name, or a key that is not one of these, raises :class:`~danube.names.InvalidNameError`.
"""

from __future__ import annotations

import re
from typing import Literal, get_args
from urllib.parse import quote

from danube.names import (
    MAX_NAME_CHARS,
    InvalidNameError,
    TopicName,
    validate_segment,
    validate_subject,
)

# Node ids are often host names, so dots are allowed too (the one departure from the segment
# rule of danube.names, which names every other key segment here).
_NODE_ID_RE = re.compile(r"[A-Za-z0-9._-]+")
# Object descriptors sort by start offset because offsets are zero-padded to the u64 width.
OFFSET_DIGITS = 20
OFFSET_MAX = 2**64 - 1

ServiceKind = Literal["discovery", "ingest", "uploader", "retention", "cloud_reader", "dispatcher"]
SERVICE_KINDS: tuple[ServiceKind, ...] = get_args(ServiceKind)

CONTROLLER_ELECTION = "controller"
RETENTION_ELECTION = "retention"

NAMESPACES_PREFIX = "namespaces/"
SUBSCRIPTIONS_PREFIX = "subscriptions/"
PRODUCERS_PREFIX = "producers/"
PRODUCER_EPOCHS_PREFIX = "producer_epochs/"
# Before the scope in an exclusive holder's key (``x_all``, ``x_p3``); no scope starts with x.
EXCLUSIVE_PREFIX = "x_"
NODES_PREFIX = "nodes/"
DRAINS_PREFIX = "drains/"
SCHEMAS_PREFIX = "schemas/"
SCHEMA_NEXT_ID_KEY = "schemas/next_id"
VERSION_DIGITS = 10
ELECTIONS_PREFIX = "elections/"
SECURITY_PREFIX = "security/"
SECURITY_ROLES_PREFIX = "security/roles/"
SECURITY_BINDINGS_PREFIX = "security/bindings/"
SECURITY_API_KEYS_PREFIX = "security/api_keys/"
# Where the cluster's objects are (wal_cloud.cloud without credentials), for readers given
# only etcd; "cluster/" is no namespace's or partition's prefix.
OBJECT_STORE_KEY = "cluster/object_store"
# Role and binding names, API key ids (hex): one segment each.
_SECURITY_NAME_RE = re.compile(r"[A-Za-z0-9_-]{1,128}")


def validate_node_id(node_id: str) -> str:
    """Return ``node_id`` if valid: letters, digits, ``.``, ``_``, ``-``; at most
    :data:`~danube.names.MAX_NAME_CHARS` characters."""
    if not node_id:
        raise InvalidNameError(kind="node id", value=node_id, reason="empty")
    if len(node_id) > MAX_NAME_CHARS:
        raise InvalidNameError(
            kind="node id",
            value=node_id[:64] + "...",
            reason=f"longer than {MAX_NAME_CHARS} characters",
        )
    if _NODE_ID_RE.fullmatch(node_id) is None:
        allowed = "only letters, digits, '.', '_' and '-' are allowed"
        raise InvalidNameError(kind="node id", value=node_id, reason=allowed)
    return node_id


def _segments(topic: TopicName) -> str:
    """``<ns>/<topic>`` for a key (a :class:`TopicName` is valid by construction)."""
    return f"{topic.namespace}/{topic.topic}"


# --- namespaces and topics -----------------------------------------------------------


def namespace_key(namespace: str) -> str:
    """``namespaces/<ns>``: the namespace and its policies."""
    return NAMESPACES_PREFIX + validate_segment("namespace", namespace)


def topic_key(topic: TopicName) -> str:
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


# --- partitions: replicas, leadership, uploader assignment ----------------------------


def partitions_prefix(namespace: str | None = None) -> str:
    """All partition records, or those of one namespace."""
    if namespace is None:
        return "partitions/"
    return f"partitions/{validate_segment('namespace', namespace)}/"


def partition_prefix(partition: TopicName) -> str:
    """Every record of one partition."""
    return "partitions/" + _segments(partition) + "/"


def partition_owner_key(partition: TopicName) -> str:
    """``partitions/<ns>/<p>/owner``: the partition's leader and its epoch, under the
    leader's node lease (its vanishing is how followers learn the leader is gone)."""
    return partition_prefix(partition) + "owner"


def partition_state_key(partition: TopicName) -> str:
    """``partitions/<ns>/<p>/state``: leader, leader epoch and in-sync replicas."""
    return partition_prefix(partition) + "state"


def partition_assignment_key(partition: TopicName) -> str:
    """``partitions/<ns>/<p>/assignment``: the partition's replica set (ingest node ids)."""
    return partition_prefix(partition) + "assignment"


def uploader_assignment_key(partition: TopicName) -> str:
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


def storage_prefix(partition: TopicName) -> str:
    """Everything the cloud tier records for a partition: descriptors, checkpoint, and the
    retention tally."""
    return "storage/" + _segments(partition) + "/"


def object_descriptors_prefix(partition: TopicName) -> str:
    """All object descriptors of a partition, sorted by start offset."""
    return "storage/" + _segments(partition) + "/objects/"


def object_descriptor_key(partition: TopicName, start_offset: int) -> str:
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


def retention_tally_key(partition: TopicName) -> str:
    """``storage/<ns>/<p>/dropped``: what retention removed from the partition's tiers."""
    return "storage/" + _segments(partition) + "/dropped"


def uploader_checkpoint_key(partition: TopicName) -> str:
    """``storage/<ns>/<p>/checkpoint``: how far the partition's WAL is uploaded."""
    return "storage/" + _segments(partition) + "/checkpoint"


# --- subscriptions: config, dispatcher assignment, cursors ---------------------------


def subscriptions_prefix(topic: TopicName) -> str:
    """Every record of every subscription of a topic."""
    return SUBSCRIPTIONS_PREFIX + _segments(topic) + "/"


def subscription_prefix(topic: TopicName, subscription: str) -> str:
    """Every record of one subscription."""
    return subscriptions_prefix(topic) + validate_segment("subscription", subscription) + "/"


def subscription_key(topic: TopicName, subscription: str) -> str:
    """``subscriptions/<ns>/<t>/<sub>/config``: the subscription's type and start."""
    return subscription_prefix(topic, subscription) + "config"


def subscription_owner_key(topic: TopicName, subscription: str) -> str:
    """``subscriptions/<ns>/<t>/<sub>/owner``: the dispatcher node serving it, with its epoch."""
    return subscription_prefix(topic, subscription) + "owner"


def subscription_cursors_prefix(topic: TopicName, subscription: str) -> str:
    """The cursors of one subscription, one per partition."""
    return subscription_prefix(topic, subscription) + "cursors/"


def subscription_cursor_key(topic: TopicName, subscription: str, partition: TopicName) -> str:
    """``subscriptions/<ns>/<t>/<sub>/cursors/<p>``: the subscription's position in ``p`` (a
    partition of ``t``, or ``t`` itself: a subscription of one partition, as Danube's clients
    make them, reads only it)."""
    if partition != topic and partition.parent != topic:
        raise InvalidNameError(
            kind="partition", value=str(partition), reason=f"not a partition of {topic}"
        )
    return subscription_cursors_prefix(topic, subscription) + partition.topic


def parse_subscription_key(key: str) -> tuple[TopicName, str, str]:
    """The topic, subscription and record (``config``, ``owner``, ``cursors/<p>``) of a key."""
    parts = key.split("/", 4)
    if len(parts) != 5 or parts[0] != "subscriptions":
        raise InvalidNameError(
            kind="subscription key", value=key, reason="not subscriptions/<ns>/<t>/<sub>/..."
        )
    return TopicName(parts[1], parts[2]), validate_segment("subscription", parts[3]), parts[4]


# --- producer sessions: every session of a topic and of its partitions under one prefix -


def _producer_scope(topic: TopicName) -> str:
    """``all`` for a whole topic, ``p<N>`` for its partition ``N``."""
    return "all" if topic.partition is None else f"p{topic.partition}"


def _parse_producer_scope(base: TopicName, scope: str) -> TopicName:
    if scope == "all":
        return base
    digits = scope[1:]
    if (
        scope[:1] != "p"
        or not digits.isascii()
        or not digits.isdigit()
        or str(int(digits)) != digits
    ):
        raise InvalidNameError(kind="producer scope", value=scope, reason="not all or p<N>")
    return base.partition_name(int(digits))


def producers_prefix(topic: TopicName) -> str:
    """``producers/<ns>/<t>/``: the sessions of a topic *and of its partitions* (a partition
    names its topic's prefix), so one range compare sees every producer of the topic."""
    return PRODUCERS_PREFIX + _segments(topic.parent) + "/"


def producer_scope_prefix(topic: TopicName) -> str:
    """The sessions opened on exactly ``topic`` (a whole topic, or one partition)."""
    return producers_prefix(topic) + _producer_scope(topic) + "_"


def producer_key(topic: TopicName, producer_id: str) -> str:
    """``producers/<ns>/<t>/<scope>_<producer_id>``: one session (scope ``all``, or ``p<N>``
    for one partition), on the session's lease."""
    return producer_scope_prefix(topic) + validate_segment("producer id", producer_id)


def exclusive_producers_prefix(topic: TopicName) -> str:
    """The exclusive holders of a topic and of its partitions."""
    return producers_prefix(topic) + EXCLUSIVE_PREFIX


def exclusive_producer_key(topic: TopicName) -> str:
    """``producers/<ns>/<t>/x_<scope>``: the id of the exclusive producer of ``topic`` (the
    whole topic, or one partition), on that producer's session lease."""
    return exclusive_producers_prefix(topic) + _producer_scope(topic)


def parse_producer_key(key: str) -> tuple[TopicName, str | None]:
    """The topic or partition of a producer key, and its producer id (``None`` for an
    exclusive holder's key, whose value is the id)."""
    parts = key.split("/")
    if len(parts) != 4 or parts[0] != "producers":
        raise InvalidNameError(
            kind="producer key", value=key, reason="not producers/<ns>/<t>/<scope>_<id>"
        )
    base, last = TopicName(parts[1], parts[2]), parts[3]
    if last.startswith(EXCLUSIVE_PREFIX):
        return _parse_producer_scope(base, last.removeprefix(EXCLUSIVE_PREFIX)), None
    scope, _, producer_id = last.partition("_")
    return _parse_producer_scope(base, scope), validate_segment("producer id", producer_id)


# --- idempotent producers' epochs (docs/producers.md, "Epochs") ------------------------


def producer_epochs_prefix(topic: TopicName) -> str:
    """``producer_epochs/<ns>/<t>/``: the epochs of a topic's producers (its partitions
    share them: a partition names its topic's prefix)."""
    return PRODUCER_EPOCHS_PREFIX + _segments(topic.parent) + "/"


def producer_epoch_key(topic: TopicName, producer: str) -> str:
    """``producer_epochs/<ns>/<t>/<producer>``: the newest epoch handed to the producer of
    that name. The name is any text (a record's producer field), so it is percent-encoded
    (UTF-8; every byte but letters, digits and ``_.-~``): one segment, never a ``/``."""
    if not producer:
        raise InvalidNameError(kind="producer name", value=producer, reason="empty")
    return producer_epochs_prefix(topic) + quote(producer, safe="")


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


def drains_prefix(kind: ServiceKind | None = None) -> str:
    """Every drained node, or those of one service kind."""
    return DRAINS_PREFIX if kind is None else f"{DRAINS_PREFIX}{_validate_kind(kind)}/"


def drain_key(kind: ServiceKind, node_id: str) -> str:
    """``drains/<kind>/<node_id>``: the operator asked to move everything off the node."""
    return drains_prefix(kind) + validate_node_id(node_id)


def election_key(name: str) -> str:
    """``elections/<name>``: the leader of ``name``; its value is the leader's candidate id."""
    return ELECTIONS_PREFIX + validate_segment("election", name)


# --- the schema registry (docs/schemas.md) ---------------------------------------------


def schema_id_key(schema_id: int) -> str:
    """``schemas/ids/<schema_id:020>``: the subject the schema id names."""
    return f"{SCHEMAS_PREFIX}ids/{format_offset(schema_id)}"


def subject_prefix(subject: str) -> str:
    """Every record of one subject."""
    return f"{SCHEMAS_PREFIX}subjects/{validate_subject(subject)}/"


def subject_key(subject: str) -> str:
    """``schemas/subjects/<subject>/subject``: its schema id, type and mode."""
    return subject_prefix(subject) + "subject"


def schema_versions_prefix(subject: str) -> str:
    """The versions of a subject, in version order."""
    return subject_prefix(subject) + "versions/"


def schema_version_key(subject: str, version: int) -> str:
    """``schemas/subjects/<subject>/versions/<version:010>``: one version (immutable)."""
    if not 1 <= version < 10**VERSION_DIGITS:
        raise InvalidNameError(kind="version", value=str(version), reason="outside 1..10**10-1")
    return f"{schema_versions_prefix(subject)}{version:0{VERSION_DIGITS}d}"


def schema_fingerprint_key(subject: str, fingerprint: str) -> str:
    """``schemas/subjects/<subject>/fingerprints/<sha256 hex>``: the live version with it."""
    if re.fullmatch(r"[0-9a-f]{64}", fingerprint) is None:
        raise InvalidNameError(kind="fingerprint", value=fingerprint, reason="not sha256 hex")
    return subject_prefix(subject) + "fingerprints/" + fingerprint


def topic_schema_key(topic: TopicName) -> str:
    """``schemas/topics/<ns>/<topic>``: the subject a topic is bound to, and its policy."""
    return SCHEMAS_PREFIX + "topics/" + _segments(topic)


def _security_name(kind: str, name: str) -> str:
    if _SECURITY_NAME_RE.fullmatch(name) is None:
        raise InvalidNameError(kind=kind, value=name, reason="1 to 128 of A-Z a-z 0-9 _ -")
    return name


def role_key(name: str) -> str:
    """``security/roles/<role>``."""
    return SECURITY_ROLES_PREFIX + _security_name("role", name)


def binding_key(binding_id: str) -> str:
    """``security/bindings/<binding_id>``."""
    return SECURITY_BINDINGS_PREFIX + _security_name("binding", binding_id)


def api_key_key(key_id: str) -> str:
    """``security/api_keys/<key_id>``."""
    return SECURITY_API_KEYS_PREFIX + _security_name("api key id", key_id)

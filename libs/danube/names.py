"""The naming rules of the mesh, in one place: every package that takes a name checks it here.

- A **segment** (a namespace, a topic, a subscription, an election name...) is one or more
  letters, digits, ``_`` and ``-``, at most :data:`MAX_NAME_CHARS` characters. No ``.``, ``/``,
  ``*``, ``>`` or white space: a segment is used as it is in NATS subject tokens and etcd keys.
- A **topic name** is ``/<namespace>/<topic>``, two segments, and the whole name is at most
  :data:`MAX_TOPIC_NAME_CHARS` characters.
- **Partition** ``N`` of a partitioned topic ``/<ns>/<t>`` is the topic ``/<ns>/<t>-part-N``
  (``N`` in decimal, no leading zero: ``t-part-03`` is a plain topic, not a partition).
  A topic a user names is never shaped like a partition: ``-part-<N>``, and the negative index
  ``-part--<N>`` that a client computing an index wrongly sends, are refused
  (:func:`validate_user_topic`).

A name that breaks a rule raises :class:`InvalidNameError` (``"invalid_name"``, never
retriable: the same name is refused again). ``danube.bus`` adds its own tokens on top
(subject prefix, operation names) and ``danube.meta`` its node ids; both check them with
:func:`validate_segment` or the same limits.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from functools import lru_cache

from danube.errors import DanubeError, ErrorKind

MAX_NAME_CHARS = 255
"""Limit on one segment (namespace, topic, subscription...); keeps subjects and keys short."""

MAX_TOPIC_NAME_CHARS = 255
"""Limit on a whole topic name, ``/<ns>/<topic>`` included."""

PARTITIONS_MAX = 1024
"""A topic has at most this many partitions (``-part-0`` to ``-part-1023``)."""

# Shown in an error instead of a name over the limits, so a huge input cannot flood the logs.
_SHOWN_CHARS = 64

SEGMENT_CHARS = "A-Za-z0-9_-"
"""The characters of a segment, as a regular expression character class body."""

SEGMENT_PATTERN = f"^[{SEGMENT_CHARS}]+$"
"""A segment (its length aside), as a JSON Schema (ECMA 262) pattern."""

# A partition index as a topic's suffix names it, or a negative one (reserved: never a topic).
_PARTITION_SHAPED = f"[{SEGMENT_CHARS}]*-part-(0|[1-9][0-9]*|-[0-9]+)"

USER_TOPIC_PATTERN = f"^(?!{_PARTITION_SHAPED}$)[{SEGMENT_CHARS}]+$"
"""A topic segment a user may name: a segment not shaped like a partition (``-part-<N>``,
``-part--<N>``)."""

TOPIC_NAME_PATTERN = f"^/[{SEGMENT_CHARS}]+/[{SEGMENT_CHARS}]+$"
"""A whole topic name ``/<namespace>/<topic>`` (its length aside)."""

_SEGMENT = re.compile(SEGMENT_PATTERN)
_RESERVED_TOPIC = re.compile(_PARTITION_SHAPED)
_PARTITION_SUFFIX = re.compile(r"(?P<base>[A-Za-z0-9_-]+)-part-(?P<index>0|[1-9][0-9]*)")


class InvalidNameError(DanubeError):
    """A name (``name_kind``: namespace, topic, subscription...) whose ``value`` breaks a
    rule."""

    code = "invalid_name"
    kind = ErrorKind.INVALID

    def __init__(self, *, kind: str, value: str, reason: str) -> None:
        super().__init__(f"invalid {kind} {value!r}: {reason}")
        self.name_kind = kind
        self.value = value
        self.reason = reason


def _shown(value: str) -> str:
    return value if len(value) <= _SHOWN_CHARS else value[:_SHOWN_CHARS] + "..."


def validate_segment(kind: str, value: str, *, max_chars: int = MAX_NAME_CHARS) -> str:
    """Return ``value`` if it is a valid segment (letters, digits, ``_``, ``-``; at most
    ``max_chars``), else raise :class:`InvalidNameError` naming it as ``kind``."""
    if not value:
        raise InvalidNameError(kind=kind, value=value, reason="empty")
    if len(value) > max_chars:
        raise InvalidNameError(
            kind=kind, value=_shown(value), reason=f"longer than {max_chars} characters"
        )
    if _SEGMENT.fullmatch(value) is None:
        raise InvalidNameError(
            kind=kind, value=value, reason="only letters, digits, '_' and '-' are allowed"
        )
    return value


def validate_user_topic(topic: str) -> str:
    """Return ``topic`` if a user may name a topic so: a valid segment not shaped like a
    partition (``<t>-part-<N>`` would shadow partition N of ``<t>``; ``<t>-part--<N>`` is a
    negative index), else raise :class:`InvalidNameError`."""
    validate_segment("topic", topic)
    if _RESERVED_TOPIC.fullmatch(topic) is not None:
        raise InvalidNameError(
            kind="topic",
            value=topic,
            reason="a name ending in -part-<N> (or a negative -part--<N>) is reserved for "
            "the partitions of a topic",
        )
    return topic


def _too_long(name: str) -> InvalidNameError:
    return InvalidNameError(
        kind="topic name",
        value=_shown(name),
        reason=f"longer than {MAX_TOPIC_NAME_CHARS} characters",
    )


@dataclass(frozen=True, slots=True)
class TopicName:
    """A validated topic name ``/<namespace>/<topic>``; also names one partition of a topic.

    Construction checks every rule, so a ``TopicName`` in hand is always valid.
    """

    namespace: str
    topic: str
    # Computed once: names are dict keys on every hot path (a producer's per-partition
    # sequences, a leader's partitions), and the generated __hash__ builds a tuple each call.
    _hash: int = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        validate_segment("namespace", self.namespace)
        validate_segment("topic", self.topic)
        if len(str(self)) > MAX_TOPIC_NAME_CHARS:
            raise _too_long(str(self))
        object.__setattr__(self, "_hash", hash((self.namespace, self.topic)))

    def __hash__(self) -> int:
        return self._hash

    @classmethod
    def parse(cls, name: str) -> TopicName:
        """Parse ``/<namespace>/<topic>``; raise :class:`InvalidNameError` on anything else."""
        if len(name) > MAX_TOPIC_NAME_CHARS:
            raise _too_long(name)  # before splitting: the input may be arbitrarily large
        parts = name.split("/")
        if len(parts) != 3 or parts[0] != "":
            raise InvalidNameError(kind="topic name", value=name, reason="not /<namespace>/<topic>")
        return cls(parts[1], parts[2])

    def __str__(self) -> str:
        return f"/{self.namespace}/{self.topic}"

    @property
    def base(self) -> str:
        """The topic segment without its ``-part-N`` suffix (itself when not a partition)."""
        match = _PARTITION_SUFFIX.fullmatch(self.topic)
        return self.topic if match is None else match["base"]

    @property
    def partition(self) -> int | None:
        """``N`` when this is partition ``N`` (``<topic>-part-N``) of a topic, else ``None``."""
        match = _PARTITION_SUFFIX.fullmatch(self.topic)
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


def topic_name(topic: TopicName | str) -> TopicName:
    """Accept a :class:`TopicName` or its string form; raise :class:`InvalidNameError` if bad."""
    return topic if isinstance(topic, TopicName) else TopicName.parse(topic)


# Schema registry subjects are key segments too, with dots: Confluent's usual names
# (``orders-value``, ``com.acme.User``).
_SUBJECT_RE = re.compile(r"[A-Za-z0-9._-]+")


def validate_subject(subject: str) -> str:
    """Return ``subject`` if valid: letters, digits, ``.``, ``_``, ``-``; at most
    :data:`~danube.names.MAX_NAME_CHARS` characters; not ``.`` or ``..``."""
    if not subject:
        raise InvalidNameError(kind="subject", value=subject, reason="empty")
    if len(subject) > MAX_NAME_CHARS:
        raise InvalidNameError(
            kind="subject", value=subject[:64] + "...", reason=f"longer than {MAX_NAME_CHARS}"
        )
    if _SUBJECT_RE.fullmatch(subject) is None or subject in (".", ".."):
        allowed = "only letters, digits, '.', '_' and '-' are allowed"
        raise InvalidNameError(kind="subject", value=subject, reason=allowed)
    return subject


def user_topic(namespace: str, topic: str) -> TopicName:
    """The topic a user names: valid segments, and not shaped like a partition
    (:func:`danube.names.validate_user_topic`)."""
    validate_segment("namespace", namespace)
    return TopicName(namespace, validate_user_topic(topic))


def client_topic(value: str) -> TopicName:
    """A topic or one of its partitions as Danube's clients name it, ``/<ns>/<t>`` or
    ``/<ns>/<t>-part-N``: ``<t>`` a topic a user may name (:func:`user_topic`) and ``N`` a
    partition a topic can have (below ``PARTITIONS_MAX``); InvalidNameError otherwise."""
    name = TopicName.parse(value)
    base = name.parent
    user_topic(base.namespace, base.topic)
    if name.partition is not None and name.partition >= PARTITIONS_MAX:
        raise InvalidNameError(
            kind="partition",
            value=str(name),
            reason=f"a topic has at most {PARTITIONS_MAX} partitions (-part-0 to "
            f"-part-{PARTITIONS_MAX - 1})",
        )
    return name


# Every produce names its partition: checked once per name (what is refused is not kept).
@lru_cache(maxsize=4096)
def produce_topic(namespace: str, topic: str) -> TopicName:
    """Where a produce goes as its path names it: a topic (:func:`user_topic`), or one
    partition of a topic, ``<t>-part-N`` (:func:`client_topic`'s rules), as an idempotent
    producer names it (its sequences are per partition)."""
    validate_segment("namespace", namespace)
    return client_topic(f"/{namespace}/{topic}")

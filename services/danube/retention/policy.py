"""What may go, decided without I/O: WAL segments to drop, objects to delete, partitions to look at.

Both tiers follow one rule: data goes **oldest first**, as a prefix, while it is older than the
age limit or while the tier is over its size limit; and the newest unit (the WAL's active
segment, the partition's newest object) always stays. The WAL adds the hard condition that
nothing goes before it is uploaded. Under queue retention a unit may also go once every
subscription has acknowledged all of it (its offsets lie below the partition's **ack floor**),
and then the newest object too. docs/retention.md explains the choices.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import NamedTuple

from danube.meta.records import NamespacePolicy, Policies, RetentionPolicy, TopicConfig
from danube.names import TopicName
from danube.wire.ingest.control import SegmentInfo

MIB = 1024 * 1024
MS_PER_MINUTE = 60_000


@dataclass(frozen=True, slots=True)
class Limits:
    """Data older than ``max_age_ms`` may go, and so may the oldest data while a tier holds more
    than ``max_bytes``; ``None``: no such limit."""

    max_age_ms: int | None
    max_bytes: int | None

    @classmethod
    def of(cls, time_minutes: int | None, size_mb: int | None) -> Limits:
        """Limits from Danube's units (minutes, MiB)."""
        return cls(
            None if time_minutes is None else time_minutes * MS_PER_MINUTE,
            None if size_mb is None else size_mb * MIB,
        )

    @property
    def unlimited(self) -> bool:
        """Nothing ever goes."""
        return self.max_age_ms is None and self.max_bytes is None

    def expired(self, written_ms: int, now_ms: int) -> bool:
        """Whether data written at ``written_ms`` is past the age limit at ``now_ms``."""
        return self.max_age_ms is not None and now_ms - written_ms > self.max_age_ms

    def over(self, held_bytes: int) -> bool:
        """Whether a tier holding ``held_bytes`` is over the size limit."""
        return self.max_bytes is not None and held_bytes > self.max_bytes


@dataclass(frozen=True, slots=True)
class Dropped:
    """Units (segments or objects), messages and bytes that left a tier."""

    units: int
    messages: int
    size_bytes: int

    def plus(self, other: Dropped) -> Dropped:
        """Both together."""
        return Dropped(
            self.units + other.units,
            self.messages + other.messages,
            self.size_bytes + other.size_bytes,
        )


NOTHING = Dropped(0, 0, 0)


# --- the WAL ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class WalDrop:
    """Ask ingest to ``drop_below(below_offset)``: the oldest ``segments`` go, ``size_bytes``."""

    below_offset: int
    segments: int
    size_bytes: int


def plan_wal_drop(
    segments: Sequence[SegmentInfo],
    *,
    segment_count: int,
    disk_bytes: int,
    uploaded_through: int | None,
    limits: Limits,
    now_ms: int,
    ack_floor: int | None = None,
    ack_hold_ms: int = 0,
) -> WalDrop | None:
    """The WAL segments that may go now, or ``None``.

    ``segments`` are the oldest segments of the WAL in offset order (all ``segment_count`` of
    them, or fewer); ``uploaded_through`` is the uploader checkpoint (``None``: no readable
    checkpoint, so nothing is known to be uploaded). A segment may go only if it is sealed,
    not the newest, wholly at or below ``uploaded_through``, and older than the age limit (by
    its newest write) or part of what takes the WAL over its size limit, or (queue
    retention) wholly below ``ack_floor``, the lowest offset some subscription has not
    acknowledged (``None``: not under queue retention, or no subscription), and last written
    at least ``ack_hold_ms`` ago (the topic's message-id window: a new leader reads the ids
    back from its WAL).
    """
    if uploaded_through is None or uploaded_through < 0:
        return None
    # Without the whole list the newest segment is not in it; with it, the newest stays.
    candidates = segments[:-1] if len(segments) >= segment_count else segments
    held_bytes = disk_bytes
    dropped, dropped_bytes, below = 0, 0, 0
    for segment in candidates:
        end = segment.next_offset
        if not segment.sealed or end is None or end <= segment.first_offset:
            break
        if end - 1 > uploaded_through:
            break  # not wholly uploaded: neither it nor anything after it may go
        acked = (
            ack_floor is not None
            and end <= ack_floor
            and now_ms - segment.modified_ms >= ack_hold_ms
        )
        if not (acked or limits.expired(segment.modified_ms, now_ms) or limits.over(held_bytes)):
            break
        dropped += 1
        dropped_bytes += segment.size_bytes
        held_bytes -= segment.size_bytes
        below = end
    if dropped == 0:
        return None
    return WalDrop(below_offset=below, segments=dropped, size_bytes=dropped_bytes)


# --- object storage --------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class StoredObject:
    """What the plan needs of an object descriptor."""

    first_offset: int
    last_offset: int
    size_bytes: int
    created_ms: int
    message_count: int = 0  # for the accounting only; the plan goes by offsets


def plan_object_expiry(
    objects: Sequence[StoredObject],
    *,
    complete: bool,
    limits: Limits,
    now_ms: int,
    ack_floor: int | None = None,
) -> int:
    """How many of the oldest ``objects`` (in offset order) to delete.

    ``complete``: ``objects`` are all the partition's objects, so the last one is the newest,
    which the limits never delete, and their sizes add up to what the tier holds. When only
    the oldest were read, the total is a lower bound and the newest is not among them: the
    plan stays on the safe side (it may delete less than the size limit asks, never more). An
    object goes when its upload (``created_ms``) is older than the age limit, or while the
    objects still held are over the size limit, or (queue retention) when all its offsets lie
    below ``ack_floor`` (every subscription acknowledged them: then even the newest goes).
    Deletion stops at the first object that may stay, so what remains is always one
    contiguous run of offsets.
    """
    for before, after in itertools.pairwise(objects):
        if after.first_offset <= before.last_offset:
            raise ValueError("objects must be in offset order and must not overlap")
    if limits.unlimited and ack_floor is None:
        return 0
    newest = len(objects) - 1 if complete else None
    held_bytes = sum(item.size_bytes for item in objects)
    count = 0
    for index, item in enumerate(objects):
        acked = ack_floor is not None and item.last_offset < ack_floor
        by_limits = index != newest and (
            limits.expired(item.created_ms, now_ms) or limits.over(held_bytes)
        )
        if not (acked or by_limits):
            break
        count += 1
        held_bytes -= item.size_bytes
    return count


def acked_prefix(last_offsets: Iterable[int], ack_floor: int | None) -> int:
    """How many of the units whose last offsets are ``last_offsets`` (in offset order) lie
    wholly below ``ack_floor``: the part of a drop every subscription had acknowledged (a
    prefix, since the floor is one offset)."""
    if ack_floor is None:
        return 0
    return sum(1 for _ in itertools.takewhile(lambda last: last < ack_floor, last_offsets))


# --- what to look at -------------------------------------------------------------------------


def effective_retention(topic: RetentionPolicy, namespace: RetentionPolicy) -> RetentionPolicy:
    """The topic's own limits, each one it leaves unset taken from its namespace's policy."""
    return RetentionPolicy(
        time_minutes=topic.time_minutes or namespace.time_minutes,
        size_mb=topic.size_mb or namespace.size_mb,
    )


class PartitionPolicy(NamedTuple):
    """What retention applies to one partition: its topic's cloud limits, and whether it is
    under queue retention (``policies.retention_mode == "queue"``, the topic's or else its
    namespace's)."""

    partition: TopicName
    retention: RetentionPolicy
    queue: bool = False
    # Under queue retention, how long acknowledged data stays in the WAL all the same: the
    # topic's message_id_window_s (a new leader reads the window's ids back from its WAL).
    ack_hold_ms: int = 0


def reliable_partitions(
    topics: Iterable[tuple[TopicName, TopicConfig]],
    namespaces: Mapping[str, NamespacePolicy] | None = None,
) -> list[PartitionPolicy]:
    """Every partition of every reliable topic, with its cloud retention policy (the
    topic's, with what it leaves unset inherited from its namespace's, ``namespaces``) and
    its retention mode (inherited the same way).

    Non-reliable topics keep nothing on disk or in object storage: nothing to do for them.
    """
    found: list[PartitionPolicy] = []
    for topic, config in topics:
        if config.dispatch != "reliable":
            continue
        policy = (namespaces or {}).get(topic.namespace)
        retention = (
            config.retention
            if policy is None
            else effective_retention(config.retention, policy.retention)
        )
        fallback: Policies | None = None if policy is None else policy.policies
        policies = config.policies.over(fallback)
        queue = policies.retention_mode == "queue"
        hold_ms = (policies.message_id_window_s or 0) * 1000 if queue else 0
        found.extend(
            PartitionPolicy(partition, retention, queue, hold_ms)
            for partition in topic.partitions(config.partitions)
        )
    return found

"""What may go, decided without I/O: WAL segments to drop, objects to delete, partitions to look at.

Both tiers follow one rule: data goes **oldest first**, as a prefix, while it is older than the
age limit or while the tier is over its size limit; and the newest unit (the WAL's active
segment, the partition's newest object) always stays. The WAL adds the hard condition that
nothing goes before it is uploaded. docs/retention.md explains the choices.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from danube.meta.records import NamespacePolicy, RetentionPolicy, TopicConfig
from danube.names import TopicName
from danube.wire.ingest.protocol import SegmentInfo

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
) -> WalDrop | None:
    """The WAL segments that may go now, or ``None``.

    ``segments`` are the oldest segments of the WAL in offset order (all ``segment_count`` of
    them, or fewer); ``uploaded_through`` is the uploader checkpoint (``None``: no readable
    checkpoint, so nothing is known to be uploaded). A segment may go only if it is sealed,
    not the newest, wholly at or below ``uploaded_through``, and older than the age limit (by
    its newest write) or part of what takes the WAL over its size limit.
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
        if not (limits.expired(segment.modified_ms, now_ms) or limits.over(held_bytes)):
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


def plan_object_expiry(
    objects: Sequence[StoredObject], *, complete: bool, limits: Limits, now_ms: int
) -> int:
    """How many of the oldest ``objects`` (in offset order) to delete.

    ``complete``: ``objects`` are all the partition's objects, so the last one is the newest,
    which always stays, and their sizes add up to what the tier holds. When only the oldest
    were read, the total is a lower bound and the newest is not among them: the plan stays on
    the safe side (it may delete less than the size limit asks, never more). An object goes
    when its upload (``created_ms``) is older than the age limit, or while the objects still
    held are over the size limit; deletion stops at the first object that may stay, so what
    remains is always one contiguous run of offsets.
    """
    for before, after in itertools.pairwise(objects):
        if after.first_offset <= before.last_offset:
            raise ValueError("objects must be in offset order and must not overlap")
    if limits.unlimited:
        return 0
    candidates = objects[:-1] if complete else objects
    held_bytes = sum(item.size_bytes for item in objects)
    count = 0
    for item in candidates:
        if not (limits.expired(item.created_ms, now_ms) or limits.over(held_bytes)):
            break
        count += 1
        held_bytes -= item.size_bytes
    return count


# --- what to look at -------------------------------------------------------------------------


def effective_retention(topic: RetentionPolicy, namespace: RetentionPolicy) -> RetentionPolicy:
    """The topic's own limits, each one it leaves unset taken from its namespace's policy."""
    return RetentionPolicy(
        time_minutes=topic.time_minutes or namespace.time_minutes,
        size_mb=topic.size_mb or namespace.size_mb,
    )


def reliable_partitions(
    topics: Iterable[tuple[TopicName, TopicConfig]],
    namespaces: Mapping[str, NamespacePolicy] | None = None,
) -> list[tuple[TopicName, RetentionPolicy]]:
    """Every partition of every reliable topic, with its cloud retention policy: the
    topic's, with what it leaves unset inherited from its namespace's (``namespaces``).

    Non-reliable topics keep nothing on disk or in object storage: nothing to do for them.
    """
    found: list[tuple[TopicName, RetentionPolicy]] = []
    for topic, config in topics:
        if config.dispatch != "reliable":
            continue
        policy = (namespaces or {}).get(topic.namespace)
        retention = (
            config.retention
            if policy is None
            else effective_retention(config.retention, policy.retention)
        )
        found.extend((partition, retention) for partition in topic.partitions(config.partitions))
    return found

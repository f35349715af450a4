"""Planning a read: from the partitions' object descriptors to Spark input partitions, with
no I/O (the descriptors are read from etcd once, on the driver: :mod:`danube.spark.catalog`).

Each task carries the descriptors it reads, so executors need object storage only, never
etcd. Objects in the offset range larger than the target size are cut at sparse-index entries
into sub-ranges of about that size; then, by ``split``:

- ``size`` (the default): consecutive slices of one topic partition are packed into tasks of
  up to the target size, as Spark's file sources pack small files: a task has a fixed cost
  (about 0.1 s of scheduling, a Python worker round trip, one output file per task) that
  many small objects would otherwise pay each;
- ``object``: every object (or sub-range) is a task of its own;
- ``partition``: each topic partition is one task reading its slices in offset order (what a
  job that must keep per-partition order wants).

The target size is ``max_partition_bytes``, or less when ``min_partitions`` asks for more
tasks than that makes (never below :data:`MIN_TARGET_BYTES`).

A time range cannot be planned exactly (publish times are not ordered by offset across
producers' clocks); executors filter on it. Planning only skips objects uploaded before
``start_time - clock_skew_ms``: an object is uploaded after every message in it was published,
up to the skew between the discovery and uploader hosts' clocks.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from danube.names import TopicName
from danube.spark.errors import InconsistentTierError
from danube.spark.options import MAX_OFFSET, ReadOptions
from danube.storage import ObjectDescriptor


@dataclass(frozen=True, slots=True)
class PartitionObjects:
    """What etcd says about one partition: its objects in offset order, and how far the
    uploader got (``-1``: nothing uploaded)."""

    name: TopicName  # the partition (the topic itself when it has no partitions)
    index: int  # its partition number; 0 for a topic without partitions
    descriptors: tuple[ObjectDescriptor, ...]
    uploaded_through: int = -1

    def __post_init__(self) -> None:
        previous: ObjectDescriptor | None = None
        for descriptor in self.descriptors:
            if previous is not None and descriptor.first_offset <= previous.last_offset:
                raise InconsistentTierError(
                    str(self.name), f"objects {previous.key} and {descriptor.key} overlap"
                )
            if descriptor.last_offset > MAX_OFFSET:
                raise InconsistentTierError(
                    str(self.name), f"offset {descriptor.last_offset} does not fit a long"
                )
            previous = descriptor


@dataclass(frozen=True, slots=True)
class ObjectSlice:
    """Offsets ``from_offset..to_offset`` (inclusive) of one object of one partition."""

    topic: str  # the topic's name, `/<ns>/<topic>` (a partition's parent)
    partition: int
    descriptor: ObjectDescriptor
    from_offset: int
    to_offset: int

    @property
    def start_position(self) -> int:
        """Where in the object its reading starts (the sparse index's entry)."""
        return self.descriptor.seek(self.from_offset)

    @property
    def size_bytes(self) -> int:
        """The bytes its reading covers, at most (up to the index entry after its end)."""
        end = next(
            (e.position for e in self.descriptor.index if e.offset > self.to_offset),
            self.descriptor.size_bytes,
        )
        return end - self.start_position


Task = tuple[ObjectSlice, ...]

MIN_TARGET_BYTES = 4 * 1024 * 1024
"""Below this a task costs more than its data (Spark's ``openCostInBytes`` is the same)."""


def target_bytes(partitions: Sequence[PartitionObjects], options: ReadOptions) -> int:
    """How many bytes an input partition should read (see the module docstring)."""
    if options.min_partitions is None:
        return options.max_partition_bytes
    total = sum(d.size_bytes for p in partitions for d in p.descriptors if _wanted(d, options))
    wanted = max(MIN_TARGET_BYTES, math.ceil(total / options.min_partitions))
    return min(options.max_partition_bytes, wanted)


def plan_tasks(partitions: Sequence[PartitionObjects], options: ReadOptions) -> list[Task]:
    """The input partitions of a read, in partition then offset order."""
    target = target_bytes(partitions, options)
    tasks: list[Task] = []
    for partition in partitions:
        slices = [
            piece
            for descriptor in partition.descriptors
            if _wanted(descriptor, options)
            for piece in _slices(partition, descriptor, options, target)
        ]
        if not slices:
            continue
        if options.split == "partition":
            tasks.append(tuple(slices))
        elif options.split == "object":
            tasks.extend((piece,) for piece in slices)
        else:
            tasks.extend(_packed(slices, target))
    return tasks


def _packed(slices: list[ObjectSlice], target: int) -> Iterator[Task]:
    """Consecutive slices in groups of at most ``target`` bytes (a larger one alone)."""
    group: list[ObjectSlice] = []
    size = 0
    for piece in slices:
        if group and size + piece.size_bytes > target:
            yield tuple(group)
            group, size = [], 0
        group.append(piece)
        size += piece.size_bytes
    if group:
        yield tuple(group)


def _wanted(descriptor: ObjectDescriptor, options: ReadOptions) -> bool:
    if descriptor.last_offset < options.start_offset:
        return False
    if options.end_offset is not None and descriptor.first_offset >= options.end_offset:
        return False
    if options.start_time_ms is not None:
        return descriptor.created_ms + options.clock_skew_ms >= options.start_time_ms
    return True


def _slices(
    partition: PartitionObjects, descriptor: ObjectDescriptor, options: ReadOptions, target: int
) -> list[ObjectSlice]:
    low = max(options.start_offset, descriptor.first_offset)
    high = descriptor.last_offset
    if options.end_offset is not None:
        high = min(high, options.end_offset - 1)
    topic = str(partition.name.parent)
    return [
        ObjectSlice(topic, partition.index, descriptor, start, stop)
        for start, stop in split_object(descriptor, low, high, target)
    ]


def split_object(
    descriptor: ObjectDescriptor, low: int, high: int, max_bytes: int
) -> list[tuple[int, int]]:
    """Cut offsets ``low..high`` of an object into inclusive ranges of about ``max_bytes``
    each, at sparse-index entries (so every range but the first starts on a frame the index
    points at: no scanning)."""
    ranges: list[tuple[int, int]] = []
    start, start_position = low, descriptor.seek(low)
    for offset, position in descriptor.index:
        if offset <= start:
            continue
        if offset > high:
            break
        if position - start_position >= max_bytes:
            ranges.append((start, offset - 1))
            start, start_position = offset, position
    ranges.append((start, high))
    return ranges

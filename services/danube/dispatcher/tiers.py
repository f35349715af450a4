"""Which copy a partition reader reads next, and what an answer means: pure, no I/O.

A partition's messages live in two tiers: the WAL (ingest) and the objects (cloud_reader).
Each fetch answer covers ``[from, next)`` authoritatively, or says the tier cannot serve
``from``: below the WAL's start, or **damaged** (bad bytes from ``from`` until a resume
offset, naming the file). A reader asks the WAL first; it asks the cloud tier when the WAL
cannot serve the position, and only when neither has an intact copy is the range
**blocked** (:class:`Damage`), which the consumer is told and an operator may skip::

    WAL answer           cloud answer                  outcome
    frames               -                             feed [from, next) (tier wal)
    below its start      frames                        feed [from, next) (tier cloud)
    below its start      no object                     feed nothing up to the WAL start
                                                       (retention deleted it: a gap)
    below its start      damaged until r               blocked [from, min(r, wal start))
    damaged until w      frames                        feed [from, next) (tier cloud)
    damaged until w      no object (not uploaded)      blocked [from, w)
    damaged until w      damaged until r               blocked [from, min(w, r))
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from danube.frame import RawFrame
from danube.wire.cloud.client import CloudFetchReply
from danube.wire.ingest.client import FetchReply
from danube.wire.ingest.protocol import Damaged


@dataclass(frozen=True, slots=True)
class Damage:
    """Offsets ``[from_offset, to_offset)`` of ``partition`` that no copy holds intact."""

    partition: str
    from_offset: int
    to_offset: int
    files: tuple[str, ...]

    def __post_init__(self) -> None:
        assert self.from_offset < self.to_offset, self

    def describe(self) -> str:
        """One line naming the partition, the range and the files."""
        return (
            f"partition {self.partition}: offsets {self.from_offset}..{self.to_offset - 1} "
            f"are damaged in every copy ({', '.join(self.files)})"
        )


@dataclass(frozen=True, slots=True)
class Feed:
    """Hand ``messages`` as the whole of ``[from_offset, next_offset)`` to the machine: each
    ``(offset, frame)``, the frame as the tier sent it (a view of its reply, no copy)."""

    messages: list[tuple[int, RawFrame]]
    from_offset: int
    next_offset: int
    tier: str  # "wal" or "cloud"
    gone: bool = False  # in neither tier, deleted by retention: a gap, logged


@dataclass(frozen=True, slots=True)
class AskCloud:
    """The WAL cannot serve ``position``: read it from the cloud tier."""

    position: int
    wal_start: int
    wal_damaged: Damaged | None  # None: below the WAL's start


@dataclass(frozen=True, slots=True)
class Blocked:
    """No intact copy: stop the partition here until repaired or skipped."""

    damage: Damage


def after_wal(position: int, reply: FetchReply[RawFrame]) -> Feed | AskCloud:
    """What a WAL fetch from ``position`` leads to."""
    if reply.damaged is not None:
        return AskCloud(position, reply.wal_start, reply.damaged)
    if reply.below_wal_start:
        return AskCloud(position, reply.wal_start, None)
    messages = [(frame.offset, frame) for frame in reply.frames]
    return Feed(messages, position, max(reply.next_offset, position), "wal")


def after_cloud(partition: str, ask: AskCloud, reply: CloudFetchReply) -> Feed | Blocked:
    """What the cloud tier's answer to ``ask`` leads to (see the module's table)."""
    position, wal = ask.position, ask.wal_damaged
    if reply.damaged is not None:
        cloud = reply.damaged
        if wal is None:
            # The WAL holds everything from its start on: only what lies below it is lost.
            end = min(cloud.to_offset, ask.wal_start)
            return Blocked(Damage(partition, position, max(end, position + 1), (cloud.file,)))
        end = min(wal.to_offset, cloud.to_offset)
        return Blocked(Damage(partition, position, max(end, position + 1), (wal.file, cloud.file)))
    if not reply.in_cloud:
        if wal is None:
            return Feed([], position, max(ask.wal_start, position), "cloud", gone=True)
        return Blocked(Damage(partition, position, wal.to_offset, (wal.file,)))
    messages = [(frame.offset, frame) for frame in reply.frames]
    return Feed(messages, position, max(reply.next_offset, position), "cloud")


def frame_of(payload: object) -> RawFrame:
    """The frame a machine entry carries (readers only ever hand it frames as read)."""
    if not isinstance(payload, RawFrame):
        raise TypeError(f"expected a frame, got {type(payload).__name__}")
    return payload


def frame_views(payloads: Iterable[object]) -> list[memoryview]:
    """The whole frames (header included) machine entries carry, in order: what
    :func:`frame_of` gives for each, in one pass over a delivery."""
    return [p.data if isinstance(p, RawFrame) else frame_of(p).data for p in payloads]


def detached(payload: object) -> object:
    """A frame of its own (one copy) instead of a view that keeps a whole fetch reply alive:
    for a message held back for a later redelivery."""
    frame = frame_of(payload)
    return RawFrame(frame.offset, memoryview(bytes(frame.data)))

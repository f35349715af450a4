"""Where a new subscription starts, or a seek goes: a start position resolved to an offset
in each partition, and refused when it points past a partition's end.

Offsets of a partition are contiguous for its whole life (one replicated log per partition),
so its end is ingest's committed end (``wal.stats`` ``durable_next``: the first offset not
yet readable) and every offset in ``[0, end]`` is a place to read from: ``end`` itself is
"the next message", an offset below the WAL's start is read from the cloud tier. Past the
end nothing would ever be delivered until the partition grew that far, silently skipping
what is produced meanwhile, so ``{"offset": N}`` with N > end is refused
(:class:`OffsetOutOfRangeError`), naming the first partition, in partition order, it is
past. Where the end is unknown (no ingest answer) it is refused too
(:class:`PositionUnavailableError`, retriable) rather than accepted blindly; offset 0 needs
no answer (it is never past an end).

``{"timestamp_ms": T}`` asks ingest first (``wal.time``: the first offset of the WAL
published at or after T, the WAL start when T is older than the WAL). When that answer is
the WAL start (above 0), T may be older still: the cloud tier is asked (``cloud.time``) and
its answer taken when lower. No cloud reader answering then is
:class:`PositionUnavailableError`: the WAL was trimmed, so what is older sits in objects
only a cloud reader can search.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import Protocol

from danube.bus import BusError, NoRespondersError
from danube.meta import TopicName
from danube.wire.dispatcher import protocol
from danube.wire.dispatcher.errors import OffsetOutOfRangeError, PositionUnavailableError
from danube.wire.ingest.client import WalOffsets

STATS_TIMEOUT_S = 5.0


class IngestView(Protocol):
    """What resolving needs of :class:`~danube.wire.ingest.client.IngestClient`."""

    async def wal_offsets(self, partition: TopicName, *, timeout_s: float = ...) -> WalOffsets: ...

    async def offset_for_time(
        self, partition: TopicName, timestamp_ms: int, *, timeout_s: float = ...
    ) -> int: ...


class CloudView(Protocol):
    """What resolving needs of :class:`~danube.wire.cloud.client.CloudClient`."""

    async def offset_for_time(
        self, partition: TopicName, timestamp_ms: int, *, timeout_s: float = ...
    ) -> int | None: ...


def check_offset(partition: TopicName, offset: int, wal: WalOffsets) -> int:
    """``offset`` if a read may start there (at most the partition's end), else
    :class:`OffsetOutOfRangeError` naming the partition, the offset and the valid range."""
    end = wal.durable_next
    if offset <= end:
        return offset
    raise OffsetOutOfRangeError(
        f"offset {offset} is past the end of {partition}: valid offsets are [0, {end}] "
        f"({end}: the next message; below the WAL start {wal.start_offset}: the cloud tier)",
        partition=str(partition),
        offset=offset,
        wal_start=wal.start_offset,
        end=end,
    )


async def resolve_start(
    ingest: IngestView, cloud: CloudView, partition: TopicName, start: protocol.StartPosition
) -> int:
    """The first offset a new subscription reads in ``partition``, or where a seek goes.

    ``earliest`` is 0 (a read below the WAL start goes to the cloud tier, then skips what
    is in neither). ``{"offset": N}`` is N, checked against the partition's end.
    ``latest`` and ``{"timestamp_ms": T}`` ask the partition's ingest owner (and the cloud
    tier for a T older than the WAL); when nobody owns it (nothing was ever produced to it)
    both are 0.
    """
    position = _checked(start)
    if position == "earliest":
        return 0
    if isinstance(position, dict) and "offset" in position:
        return await _checked_offset(ingest, partition, position["offset"])
    try:
        if isinstance(position, dict):
            return await _offset_for_time(ingest, cloud, partition, position["timestamp_ms"])
        offsets = await ingest.wal_offsets(partition, timeout_s=STATS_TIMEOUT_S)
        return offsets.durable_next
    except NoRespondersError:
        return 0


Resolve = Callable[[Sequence[TopicName], protocol.StartPosition], Awaitable[list[int]]]
""":func:`resolve_all` with its clients bound: what a served subscription's helpers are
handed to resolve positions."""


async def resolve_all(
    ingest: IngestView,
    cloud: CloudView,
    partitions: Sequence[TopicName],
    start: protocol.StartPosition,
) -> list[int]:
    """:func:`resolve_start` in every partition at once, in the order given; when some
    fail, the error of the first of them in that order (so a refusal names the first
    partition the offset is past, whichever answered first)."""
    results = await asyncio.gather(
        *(resolve_start(ingest, cloud, p, start) for p in partitions), return_exceptions=True
    )
    offsets: list[int] = []
    for result in results:
        if isinstance(result, BaseException):
            raise result
        offsets.append(result)
    return offsets


async def _checked_offset(ingest: IngestView, partition: TopicName, offset: int) -> int:
    if offset == 0:
        return 0  # never past an end: no need to ask
    try:
        wal = await ingest.wal_offsets(partition, timeout_s=STATS_TIMEOUT_S)
    except (BusError, TimeoutError) as exc:
        raise PositionUnavailableError(
            f"cannot check offset {offset} against the end of {partition}: its ingest owner "
            f"did not answer ({exc.__class__.__name__}); try again"
        ) from exc
    return check_offset(partition, offset, wal)


async def _offset_for_time(
    ingest: IngestView, cloud: CloudView, partition: TopicName, timestamp_ms: int
) -> int:
    found = await ingest.offset_for_time(partition, timestamp_ms, timeout_s=STATS_TIMEOUT_S)
    if found == 0:
        return 0  # nothing lies lower
    try:
        wal = await ingest.wal_offsets(partition, timeout_s=STATS_TIMEOUT_S)
    except (BusError, TimeoutError) as exc:  # the owner left between the two questions
        raise PositionUnavailableError(
            f"cannot tell whether time {timestamp_ms} is older than the WAL of {partition}: "
            f"its ingest owner did not answer ({exc.__class__.__name__}); try again"
        ) from exc
    if found != wal.start_offset:
        return found  # a record of the WAL, after an older one: the time is crossed there
    try:
        older = await cloud.offset_for_time(partition, timestamp_ms, timeout_s=STATS_TIMEOUT_S)
    except (BusError, TimeoutError) as exc:
        raise PositionUnavailableError(
            f"cannot search {partition} by time below its WAL start {found}: no cloud reader "
            f"answered ({exc.__class__.__name__}); try again"
        ) from exc
    return found if older is None else min(found, older)


def _checked(start: protocol.StartPosition) -> protocol.StartPosition:
    try:
        return protocol.check_position(start)
    except ValueError as exc:
        raise protocol.BadRequestError(f"bad start position: {exc}") from exc

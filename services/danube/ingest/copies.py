"""Other replicas' copies of a partition: a range of one named replica's copy
(``repl.read``, every replica serves its own, leader or follower), for reading around damage
in this node's copy and for repairing it (docs/replication.md, "Damaged copies").

Only ranges below the high watermark are asked and answered: there every in-sync replica
holds the same frames (same offsets, same bytes: a frame is a function of its offset and
record), so a frame another in-sync copy holds intact is the very frame this copy lost.
Every frame that arrives is checked (length, CRC, offsets rising from the one asked, none
past the range) before it is served or written.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from danube.bus import Bus, BusError, Request, Responder, TopicName
from danube.frame import CorruptFrameError, RawFrame, verify_frame, walk_frames
from danube.ingest.wal import (
    BelowWalStartError,
    Wal,
    WalClosedError,
    WalCorruptionError,
)
from danube.wire.ingest import protocol, replication
from danube.wire.sizes import body_limit

log = logging.getLogger(__name__)

COPY_READ_TIMEOUT_S = 2.0
"""One read of another replica's copy waits this long: a reader waits for the whole read
around damage, so a copy that does not answer in time counts as not tried."""
_COUNT_MAX = 100_000


@dataclass(frozen=True, slots=True)
class CopyRead:
    """One replica's answer for ``[from, end)``: intact ``frames`` (checked) and where to
    read on; or ``damaged`` (the file it names) or ``below_start`` with no frame."""

    node: str
    frames: list[RawFrame]
    next_offset: int
    damaged: str | None = None
    below_start: bool = False


@dataclass(frozen=True, slots=True)
class Around:
    """What reading ``[from, end)`` around this copy's damage found: ``frames`` from the
    first copy that held them intact (``source``); the copies found damaged too, and the
    ones that could not be asked (no answer in time: then not every copy was tried)."""

    frames: list[RawFrame]
    next_offset: int
    source: str | None
    damaged: list[str] = field(default_factory=list)
    unreachable: list[str] = field(default_factory=list)


async def read_copy(
    bus: Bus,
    partition: TopicName,
    node: str,
    from_offset: int,
    end_offset: int,
    *,
    max_bytes: int,
    timeout_s: float = COPY_READ_TIMEOUT_S,
) -> CopyRead:
    """Read ``[from_offset, end_offset)`` of ``node``'s copy. BusError (no answer, no such
    replica serving) or BadRequestError (frames that do not check) when it cannot be used."""
    request = replication.ReplReadRequest(from_offset, end_offset, max_bytes).encode()
    reply = await bus.request(bus.subjects.repl_read(partition, node), request, timeout_s=timeout_s)
    status, _start, next_offset, body = protocol.decode_fetch_reply_head(reply.body)
    if status is protocol.FetchStatus.DAMAGED:
        return CopyRead(node, [], from_offset, damaged=protocol.decode_damaged_file(body))
    if status is protocol.FetchStatus.BELOW_WAL_START:
        return CopyRead(node, [], from_offset, below_start=True)
    frames = checked_frames(body, from_offset, end_offset, source=node)
    return CopyRead(node, frames, max(next_offset, from_offset))


def checked_frames(
    body: memoryview, from_offset: int, end_offset: int, *, source: str
) -> list[RawFrame]:
    """The whole frames of ``body``, each checked (length, CRC), their offsets rising from
    ``from_offset`` and below ``end_offset``; BadRequestError otherwise."""
    try:
        frames, consumed = walk_frames(body)
        for frame in frames:
            verify_frame(frame.data)
    except CorruptFrameError as exc:
        raise protocol.BadRequestError(f"a bad frame in {source}'s copy: {exc}") from exc
    if consumed != len(body):
        raise protocol.BadRequestError(f"{source}'s copy answered a partial frame")
    expected = from_offset
    for frame in frames:
        if frame.offset < expected or frame.offset >= end_offset:
            raise protocol.BadRequestError(
                f"{source}'s copy sent offset {frame.offset} outside {expected}..{end_offset - 1}"
            )
        expected = frame.offset + 1
    return frames


async def read_around(
    bus: Bus,
    partition: TopicName,
    peers: Sequence[str],
    from_offset: int,
    end_offset: int,
    *,
    max_bytes: int,
    timeout_s: float = COPY_READ_TIMEOUT_S,
) -> Around:
    """Read ``[from_offset, end_offset)`` from the first of ``peers`` whose copy holds it
    intact (at least its first frame)."""
    damaged: list[str] = []
    unreachable: list[str] = []
    for node in peers:
        try:
            found = await read_copy(
                bus,
                partition,
                node,
                from_offset,
                end_offset,
                max_bytes=max_bytes,
                timeout_s=timeout_s,
            )
        except (BusError, TimeoutError, protocol.BadRequestError) as exc:
            log.info("%s: could not read %s's copy: %s", partition, node, exc)
            unreachable.append(node)
            continue
        if found.frames:
            return Around(found.frames, found.next_offset, node, damaged, unreachable)
        if found.damaged is not None:
            damaged.append(found.damaged)  # the copy names itself: <node>/<segment>
        elif not found.below_start:
            unreachable.append(node)  # holds nothing there yet: not a copy of the range
    return Around([], from_offset, None, damaged, unreachable)


COPY_READ_CONCURRENCY = 4
"""Reads of one replica's copy served at once (replicas reading around damage, or repairing)."""


async def serve_copy_reads(
    bus: Bus,
    name: TopicName,
    node_id: str,
    *,
    wal: Callable[[], Wal | None],
    committed_end: Callable[[], int],
    on_damage: Callable[[int], None],
) -> Responder:
    """Serve ``repl.read`` of ``node_id``'s copy of partition ``name`` (the replica's WAL and
    committed end as they are at each request) until the responder is drained."""
    limit_bytes = max(body_limit(bus.max_payload_bytes), 4096)

    async def answer(request: Request) -> bytes:
        return await serve_copy_read(
            wal(),
            request,
            node_id=node_id,
            committed_end=committed_end(),
            limit_bytes=limit_bytes,
            on_damage=on_damage,
        )

    return await bus.serve(
        bus.subjects.repl_read(name, node_id), answer, max_concurrency=COPY_READ_CONCURRENCY
    )


async def serve_copy_read(
    wal: Wal | None,
    request: Request,
    *,
    node_id: str,
    committed_end: int,
    limit_bytes: int,
    on_damage: Callable[[int], None],
) -> bytes:
    """Answer a ``repl.read`` of this replica's copy: frames below ``committed_end`` (what
    this replica knows every in-sync copy holds), as its WAL holds them; a damaged range
    is answered ``DAMAGED`` (naming ``<node>/<segment>``) and reported to ``on_damage``."""
    read = replication.ReplReadRequest.decode(request.body)
    if wal is None:
        raise WalClosedError()
    end = min(read.end_offset, committed_end)
    if read.from_offset >= end:
        return protocol.encode_fetch_reply(
            protocol.FetchStatus.OK, wal.start_offset, read.from_offset, []
        )
    max_count = min(_COUNT_MAX, max(limit_bytes // 32, 1))
    max_bytes = min(read.max_bytes, limit_bytes - max_count * 16)
    try:
        result = await wal.fetch(
            read.from_offset, max_bytes=max(max_bytes, 1), max_count=max_count, limit_offset=end
        )
    except BelowWalStartError as exc:
        return protocol.encode_fetch_reply(
            protocol.FetchStatus.BELOW_WAL_START, exc.start_offset, read.from_offset, []
        )
    except WalCorruptionError as exc:
        on_damage(read.from_offset if exc.offset is None else exc.offset)
        resume = max(exc.resume_offset or end, read.from_offset + 1)
        return protocol.encode_damaged_reply(wal.start_offset, resume, f"{node_id}/{exc.segment}")
    return protocol.encode_fetch_reply(
        protocol.FetchStatus.OK, wal.start_offset, result.next_offset, result.frames
    )

"""How other services read history: :class:`CloudClient` asks the ``cloud_reader`` queue
group (any instance answers) for a partition's frames from an offset, or for the first
uploaded offset published at or after a time."""

from __future__ import annotations

from dataclasses import dataclass

from danube.bus import Bus, TopicName
from danube.frame import RawFrame, walk_frames
from danube.wire.ingest import protocol


@dataclass(frozen=True)
class CloudFetchReply:
    """Frames of one object from ``from_offset`` on; ``in_cloud`` False when no object holds
    that offset or a later one (read the WAL instead); ``damaged`` when the object holding
    ``from_offset`` has no intact frame from there until ``damaged.to_offset``."""

    in_cloud: bool
    next_offset: int
    frames: list[RawFrame]  # as the cloud reader sent them: checked there, split here
    damaged: protocol.Damaged | None = None


class CloudClient:
    """Reads partitions from object storage through the cloud readers."""

    def __init__(self, bus: Bus) -> None:
        self.bus = bus

    async def fetch(
        self,
        partition: TopicName,
        from_offset: int,
        *,
        max_bytes: int = 1 << 20,
        max_count: int = 10_000,
        timeout_s: float = 10.0,
    ) -> CloudFetchReply:
        """Frames from ``from_offset`` (checked by the cloud reader; left unchecked and
        uncopied here, for whoever decodes the records): those before a bad frame, or, starting at
        one, a reply with ``damaged`` naming the object and where intact frames resume."""
        request = protocol.FetchRequest(from_offset, max_bytes, max_count)
        reply = await self.bus.request(
            self.bus.subjects.cloud_fetch(partition), request.encode(), timeout_s=timeout_s
        )
        status, _, next_offset, body = protocol.decode_fetch_reply_head(reply.body)
        if status is protocol.FetchStatus.DAMAGED:
            damaged = protocol.Damaged(from_offset, next_offset, protocol.decode_damaged_file(body))
            return CloudFetchReply(True, from_offset, [], damaged)
        frames, consumed = walk_frames(body)
        if consumed != len(body):
            raise protocol.BadRequestError(
                f"cloud fetch reply ends in a partial frame ({partition})"
            )
        return CloudFetchReply(status is protocol.FetchStatus.OK, next_offset, frames)

    async def offset_for_time(
        self, partition: TopicName, timestamp_ms: int, *, timeout_s: float = 10.0
    ) -> int | None:
        """The first uploaded offset of ``partition`` published at or after ``timestamp_ms``;
        ``None`` when the time is past every uploaded object (or nothing is uploaded).
        NoRespondersError when no cloud reader runs."""
        reply = await self.bus.request(
            self.bus.subjects.cloud_offset_for_time(partition),
            protocol.encode_timestamp(timestamp_ms),
            timeout_s=timeout_s,
        )
        status, _, offset, body = protocol.decode_fetch_reply_head(reply.body)
        if body:
            raise protocol.BadRequestError(f"cloud time reply with frames ({partition})")
        return offset if status is protocol.FetchStatus.OK else None

"""WAL retention of one partition: read the uploader checkpoint, list the WAL, drop what may go.

Only the partition's owner holds its WAL, so both the listing and the drop go over the bus to
it (``wal.stats`` with a segment list, then ``wal.drop``). The offset asked for is the end of
the last segment the plan lets go, never past ``uploaded_through + 1``: even if the WAL changed
between the two requests (a rotation, a new owner), ingest's ``drop_below`` only removes whole
segments below it, so nothing that is not uploaded can go.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

from danube.bus import NoRespondersError
from danube.meta import MetaDecodeError, MetaError, MetaStore, TopicName
from danube.meta import keys as meta_keys
from danube.meta.records import UploaderCheckpoint
from danube.retention import metrics
from danube.retention.policy import NOTHING, Dropped, Limits, acked_prefix, plan_wal_drop
from danube.retention.tally import add_wal_drop
from danube.wire.ingest.client import IngestClient
from danube.wire.ingest.control import STATS_SEGMENTS_MAX, SegmentInfo

log = logging.getLogger(__name__)

# The oldest segments one pass looks at: a WAL with more drops at most this many per pass.
SEGMENTS_LISTED = STATS_SEGMENTS_MAX


@dataclass(frozen=True, slots=True)
class WalOutcome:
    """What one partition's WAL pass removed (maybe nothing), where its WAL now starts and
    how large it is. ``acked``: the part (a prefix) that every subscription had acknowledged
    (queue retention)."""

    segments: int
    size_bytes: int
    wal_start: int
    messages: int = 0
    acked: Dropped = NOTHING
    held_bytes: int = 0  # what the WAL holds after the drop (the owner's copy)


async def uploaded_through(store: MetaStore, partition: TopicName) -> int | None:
    """The uploader checkpoint's ``uploaded_through``; ``None`` when there is no checkpoint or
    it cannot be read (then nothing is known to be uploaded, and nothing may go)."""
    key = meta_keys.uploader_checkpoint_key(partition)
    try:
        checkpoint = await store.get_model(key, UploaderCheckpoint)
    except MetaDecodeError as exc:
        log.warning("unreadable uploader checkpoint of %s: %s; dropping nothing", partition, exc)
        metrics.RUN_ERRORS.labels("checkpoint").inc()
        return None
    return None if checkpoint is None else checkpoint.uploaded_through


async def enforce_wal(
    partition: TopicName,
    *,
    store: MetaStore,
    ingest: IngestClient,
    limits: Limits,
    timeout_s: float,
    ack_floor: int | None = None,
    ack_hold_ms: int = 0,
) -> WalOutcome | None:
    """Drop the partition's WAL segments that are uploaded and past ``limits`` (or, queue
    retention, wholly below ``ack_floor`` and last written ``ack_hold_ms`` ago); ``None``
    when the WAL was not looked at (nothing is uploaded, or nobody serves the partition)."""
    # First the checkpoint: it only moves up, so a listing taken after it is never judged
    # against a newer one than it was read with.
    uploaded = await uploaded_through(store, partition)
    if uploaded is None or uploaded < 0:
        return None
    try:
        listing = await ingest.wal_segments(
            partition, max_segments=SEGMENTS_LISTED, timeout_s=timeout_s
        )
    except NoRespondersError:
        return None  # no owner at the moment: its WAL is unreachable, try next pass
    plan = plan_wal_drop(
        listing.segments,
        segment_count=listing.segment_count,
        disk_bytes=listing.disk_bytes,
        uploaded_through=uploaded,
        limits=limits,
        now_ms=listing.now_ms,
        ack_floor=ack_floor,
        ack_hold_ms=ack_hold_ms,
    )
    if plan is None:
        return WalOutcome(0, 0, listing.start_offset, held_bytes=listing.disk_bytes)
    removed, wal_start = await ingest.drop_below(partition, plan.below_offset, timeout_s=timeout_s)
    # drop_below removes the oldest segments, so the ones gone are the head of the listing
    # (unless the WAL changed in between; the size is then an estimate).
    messages, size_bytes, acked = _dropped(listing.segments[:removed], ack_floor)
    metrics.SEGMENTS_DROPPED.inc(removed)
    metrics.BYTES_DROPPED.inc(size_bytes)
    metrics.count_dropped(partition, "wal", messages, size_bytes, acked.messages, acked.size_bytes)
    total = Dropped(removed, messages, size_bytes)
    try:
        await add_wal_drop(store, partition, total, acked, listing.now_ms)
    except MetaError as exc:  # the drop is done: only its count in etcd is missing
        log.warning("WAL drop of %s not added to its tally: %s", partition, exc)
        metrics.RUN_ERRORS.labels("tally").inc()
    log.info(
        "dropped WAL segments",
        extra={
            "partition": str(partition),
            "segments": removed,
            "bytes": size_bytes,
            "below": plan.below_offset,
            "uploaded_through": uploaded,
            "wal_start": wal_start,
            "ack_floor": ack_floor,
            "acked_segments": acked.units,
        },
    )
    held_bytes = max(0, listing.disk_bytes - size_bytes)
    return WalOutcome(removed, size_bytes, wal_start, messages, acked, held_bytes)


def _dropped(gone: Sequence[SegmentInfo], ack_floor: int | None) -> tuple[int, int, Dropped]:
    """The messages and bytes the ``gone`` segments held, and of them what every
    subscription had acked (the leading segments wholly below ``ack_floor``)."""
    acked_count = acked_prefix(
        (segment.first_offset + _messages(segment) - 1 for segment in gone), ack_floor
    )
    acked = Dropped(
        acked_count,
        sum(_messages(segment) for segment in gone[:acked_count]),
        sum(segment.size_bytes for segment in gone[:acked_count]),
    )
    messages = sum(_messages(segment) for segment in gone)
    return messages, sum(segment.size_bytes for segment in gone), acked


def _messages(segment: SegmentInfo) -> int:
    """The messages of a dropped segment (sealed, so its end is known): offsets are
    contiguous for a partition's whole life, so its offset range is its count."""
    end = segment.first_offset if segment.next_offset is None else segment.next_offset
    return end - segment.first_offset

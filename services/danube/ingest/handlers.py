"""The bus edges of ingest: produce, fetch, drop-below, stats and offset-for-time of each
owned partition,
and the claim request any ingest node may answer."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING

import orjson

from danube.bus import Bus, Kind, Message, Request, Responder, Subscription
from danube.config import DanubeSettings
from danube.frame import FRAME_HEADER_BYTES, decode_record
from danube.ingest import metrics, protocol, timeseek
from danube.ingest.ownership import OwnershipError
from danube.ingest.partition import RECORD_OVERHEAD_BYTES
from danube.ingest.wal import BelowWalStartError
from danube.meta import keys as meta_keys
from danube.meta.records import Assignment

if TYPE_CHECKING:
    from danube.ingest.node import Node
    from danube.ingest.partition import Partition

log = logging.getLogger(__name__)

INGEST_QUEUE = "ingest"
# Produce requests in flight per partition: each waits for a group commit, so this bounds
# how many producers one fsync can acknowledge together.
PRODUCE_CONCURRENCY = 512
FETCH_CONCURRENCY = 32
_FETCH_REPLY_MARGIN_BYTES = 4096


class PartitionHandlers:
    """Request handlers of one partition."""

    def __init__(self, partition: Partition, settings: DanubeSettings, *, node_id: str) -> None:
        self.partition = partition
        self.node_id = node_id
        self.max_record_bytes = settings.ingest.max_message_bytes + RECORD_OVERHEAD_BYTES
        self.max_records = settings.ingest.max_batch_messages

    async def serve(self, bus: Bus) -> list[Responder]:
        subjects, name = bus.subjects, self.partition.name
        self._fetch_limit_bytes = bus.max_payload_bytes - _FETCH_REPLY_MARGIN_BYTES
        return [
            await bus.serve(
                subjects.produce(name), self.produce, max_concurrency=PRODUCE_CONCURRENCY
            ),
            await bus.serve(
                subjects.wal_fetch(name), self.fetch, max_concurrency=FETCH_CONCURRENCY
            ),
            await bus.serve(subjects.wal_drop_below(name), self.drop_below, max_concurrency=1),
            await bus.serve(subjects.wal_stats(name), self.stats, max_concurrency=4),
            await bus.serve(
                subjects.wal_offset_for_time(name), self.offset_for_time, max_concurrency=4
            ),
        ]

    async def produce(self, request: Request) -> bytes:
        try:
            records = protocol.decode_produce_request(
                request.body, max_record_bytes=self.max_record_bytes, max_count=self.max_records
            )
        except protocol.BadRequestError as exc:
            metrics.PRODUCE_ERRORS.labels(exc.code).inc()
            raise
        for index, record in enumerate(records):
            try:
                decode_record(record)  # check data before writing it
            except Exception as exc:
                metrics.PRODUCE_ERRORS.labels("bad_request").inc()
                raise protocol.BadRequestError(f"record {index}: {exc}") from exc
        # The bus cancels a handler at the caller's deadline; an append already handed to
        # the WAL must still complete (or fail) as a whole, so it is shielded.
        first = await asyncio.shield(self.partition.produce(records))
        return protocol.encode_produce_reply(first, len(records))

    async def fetch(self, request: Request) -> bytes:
        fetch = protocol.FetchRequest.decode(request.body)
        wal = self.partition.wal
        # The WAL counts payload bytes; the reply carries a frame header per message too, and
        # must fit one bus message.
        max_count = min(fetch.max_count, self._fetch_limit_bytes // (2 * FRAME_HEADER_BYTES))
        payload_room = self._fetch_limit_bytes - max_count * FRAME_HEADER_BYTES
        try:
            result = await wal.fetch(
                fetch.from_offset,
                max_bytes=min(fetch.max_bytes, payload_room),
                max_count=max_count,
            )
        except BelowWalStartError as exc:
            return protocol.encode_fetch_reply(
                protocol.FetchStatus.BELOW_WAL_START, exc.start_offset, wal.durable_next, []
            )
        return protocol.encode_fetch_reply(
            protocol.FetchStatus.OK, wal.start_offset, result.next_offset, result.messages
        )

    async def drop_below(self, request: Request) -> bytes:
        removed = await self.partition.wal.drop_below(protocol.decode_offset(request.body))
        return protocol.encode_drop_reply(removed, self.partition.wal.start_offset)

    async def offset_for_time(self, request: Request) -> bytes:
        timestamp_ms = protocol.decode_timestamp(request.body)
        offset = await timeseek.offset_for_time(self.partition.wal, timestamp_ms)
        return protocol.encode_offset(offset)

    async def stats(self, request: Request) -> bytes:
        partition = self.partition
        reply: dict[str, object] = {
            "partition": str(partition.name),
            "node_id": self.node_id,
            "epoch": partition.claim.epoch,
            "reserved_end": partition.claim.reserved_end,
            "fenced": partition.fenced,
            "wal": partition.wal.stats().as_dict(),
        }
        max_segments = protocol.decode_stats_request(request.body)
        if max_segments:  # retention asks; the others want the cheap answer
            infos = await partition.wal.segment_infos(max_segments)
            reply["segments"] = [info.as_dict() for info in infos]
            reply["now_ms"] = int(time.time() * 1000)  # ages by this host's clock, as mtimes
        return orjson.dumps(reply)


async def serve_claims(bus: Bus, node: Node) -> Responder:
    """Answer claim requests for partitions nobody owns yet (one ingest of the queue group
    takes each): the first produce to an unowned partition gets no responders, and the
    caller asks here. A partition the controller assigned to another node is refused
    (``not_owner``): its assignee claims it on its own (danube.ingest.follower)."""

    async def claim(request: Request) -> bytes:
        name = bus.subjects.parse(request.subject).name
        # Once the controller assigned the partition, only its assignee may claim it.
        assignment = await node.store.get_model(
            meta_keys.partition_assignment_key(name), Assignment
        )
        if assignment is not None and assignment.node_id != node.node_id:
            raise OwnershipError(f"{name} is assigned to {assignment.node_id}")
        partition = await node.ensure_serving(name)
        return orjson.dumps({"node_id": node.node_id, "epoch": partition.claim.epoch})

    return await bus.serve(
        bus.subjects.all_of_kind(Kind.OWNERSHIP),
        claim,
        queue=INGEST_QUEUE,
        max_concurrency=16,
    )


async def serve_deletes(bus: Bus, node: Node) -> Subscription:
    """Drop the local WAL of partitions whose topic was deleted (every node: a node that once
    owned a partition may still hold an old WAL of it)."""

    async def delete(message: Message) -> None:
        name = bus.subjects.parse(message.subject).name
        try:
            await node.delete_local(name)
        except Exception:
            log.exception("could not delete the WAL of %s", name)

    return await bus.subscribe(bus.subjects.all_of_kind(Kind.WAL_DELETE), delete)

"""The bus edges of ingest: what the leader of a partition serves (produce, fetch, drop,
stats, offset-for-time, and the followers' replication fetch and epoch history), the claim
request any ingest node may answer, and topic deletes."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

import orjson

from danube.bus import Bus, Kind, Message, Request, Responder, Subscription, TopicName
from danube.config import DanubeSettings
from danube.errors import DanubeError, ErrorKind, OverLimitError
from danube.frame import FRAME_HEADER_BYTES, RawFrame
from danube.frame.batch import FrameBatch
from danube.frame.record import SequenceRun
from danube.ingest import copies, leadership, metrics, timeseek
from danube.ingest.quota import BacklogGuard
from danube.ingest.ratelimit import PublishRate
from danube.ingest.replica_link import ReplicaLinks, new_ticket, ticket_matches
from danube.ingest.sequencing import OutOfOrderSequenceError, ProducerFencedError
from danube.ingest.throttle import TokenBucket
from danube.ingest.wal import BelowWalStartError, DiskFullError, WalCorruptionError
from danube.meta import MetaStore
from danube.security.errors import UnauthenticatedError
from danube.wire.ingest import control, protocol, replication
from danube.wire.limits import RATE_LIMITED, PartitionLimits, rate_limited_message
from danube.wire.sizes import RECORD_OVERHEAD_BYTES, body_limit

if TYPE_CHECKING:
    from danube.ingest.partition import Partition

log = logging.getLogger(__name__)

INGEST_QUEUE = "ingest"
# Produce requests in flight per partition: each waits for a group commit, so this bounds
# how many producers one fsync can acknowledge together.
PRODUCE_CONCURRENCY = 512
FETCH_CONCURRENCY = 32
REPL_CONCURRENCY = 16  # followers' long polls: a few per follower at most
_REPL_WAIT_MAX_S = 5.0
# How long a fetch from a node that is no replica yet (as the leader knows) waits before its
# empty answer: the leader's watch of the assignment usually follows within it.
_UNKNOWN_FOLLOWER_WAIT_S = 0.1


class RateLimitedError(OverLimitError):
    """The partition is over its publish rate; the message (and ``retry_after_s``, in whole
    seconds) says how long to wait."""

    code = RATE_LIMITED


class CopyUnavailableError(DanubeError):
    """A read met damage in this copy, and not every other in-sync copy could be asked
    (one did not answer in time): retriable, the next read asks them again."""

    code = "copy_unavailable"
    kind = ErrorKind.UNAVAILABLE
    retriable = True


class PartitionHandlers:
    """Request handlers of one partition led by this node."""

    def __init__(
        self,
        partition: Partition,
        settings: DanubeSettings,
        *,
        node_id: str,
        store: MetaStore,
        catchup: TokenBucket | None = None,
        on_damage: Callable[[int], None] = lambda offset: None,
        links: ReplicaLinks | None = None,
    ) -> None:
        self.partition = partition
        # Followers may fetch over a link to this node's data door with this term's ticket.
        self.links = links
        self.link_ticket = new_ticket()
        # A read found a bad frame of this copy at an offset: the replica repairs it.
        self.on_damage = on_damage
        # Catch-up fetches (followers outside the ISR) draw from the node's bucket and, when
        # the partition's assignment sets one, from its own.
        self.catchup = catchup
        self._own_catchup: TokenBucket | None = None
        self.node_id = node_id
        # The policies a produce carries (danube.wire.limits): held here, the only writer.
        self.rate = PublishRate()
        self.backlog = BacklogGuard(store, partition.name)
        self.max_record_bytes = settings.ingest.max_message_bytes + RECORD_OVERHEAD_BYTES
        self.max_records = settings.ingest.max_batch_messages

    async def serve(self, bus: Bus) -> list[Responder]:
        subjects, name = bus.subjects, self.partition.name
        self._bus = bus
        self._fetch_limit_bytes = body_limit(bus.max_payload_bytes)
        served: list[tuple[str, Callable[[Request], Awaitable[bytes]], int]] = [
            (subjects.produce(name), self.produce, PRODUCE_CONCURRENCY),
            (subjects.wal_fetch(name), self.fetch, FETCH_CONCURRENCY),
            (subjects.wal_drop_below(name), self.drop_below, 1),
            (subjects.wal_stats(name), self.stats, 4),
            (subjects.wal_offset_for_time(name), self.offset_for_time, 4),
            (subjects.repl_fetch(name), self.repl_fetch, REPL_CONCURRENCY),
            (subjects.repl_epochs(name), self.repl_epochs, 4),
            (subjects.repl_leave(name), self.repl_leave, 4),
        ]
        return [
            await bus.serve(subject, handler, max_concurrency=concurrency)
            for subject, handler, concurrency in served
        ]

    async def produce(self, request: Request) -> bytes:
        try:
            records, runs = protocol.decode_produce_request(
                request.body, max_record_bytes=self.max_record_bytes, max_count=self.max_records
            )
        except protocol.BadRequestError as exc:  # every record was checked there
            metrics.PRODUCE_ERRORS.labels(exc.code).inc()
            raise
        reply = await self.append(records, runs, PartitionLimits.from_headers(request.headers))
        return protocol.encode_produce_reply(
            reply.first_offset, reply.messages, duplicate=reply.duplicate, listed=reply.listed
        )

    async def append(
        self, records: FrameBatch, runs: list[SequenceRun] | None, limits: PartitionLimits
    ) -> protocol.ProduceReply:
        """Store checked ``records`` (their frames: the WAL gives them their offsets where
        they lie; ``runs``: their sequenced ones, when read) under the partition's share of
        its topic's policies: the one append of every produce door (the bus's, the data
        door's, the gRPC door's)."""
        if not limits.empty:
            await self._admit(limits, records)
        # Awaited in this task, with none of its own: the bus cancels a handler at the
        # caller's deadline, and an append the WAL queued still completes (or fails) as a
        # whole without it (Partition.produce); a task and a shield would cost two loop
        # steps on every produce's way back.
        started_s = time.perf_counter()
        try:
            reply = await self.partition.produce(
                records, runs=runs, message_id_window_s=limits.message_id_window_s
            )
        except (
            leadership.NotEnoughReplicasError,
            DiskFullError,
            OutOfOrderSequenceError,
            ProducerFencedError,
        ) as exc:
            metrics.PRODUCE_ERRORS.labels(exc.code).inc()
            raise
        metrics.COMMIT_SECONDS.observe(time.perf_counter() - started_s)
        # Debug: one line per produce (its trace id added by the log filter).
        log.debug(
            "produce: %s %s %d records from offset %d",
            self.partition.name,
            "recognised a resend of" if reply.duplicate else "appended",
            len(records),
            reply.first_offset,
        )
        return reply

    async def _admit(self, limits: PartitionLimits, records: FrameBatch) -> None:
        """Refuse a produce over the partition's backlog quota or publish rate (checked in
        that order: a refused produce takes no tokens)."""
        if limits.refuses:
            assert limits.backlog_quota is not None
            try:
                await self.backlog.check(limits.backlog_quota, self.partition.high_watermark)
            except DanubeError as exc:
                metrics.PRODUCE_ERRORS.labels(exc.code).inc()
                raise
        size = records.record_bytes()
        wait_ms = self.rate.admit(
            limits.rate_msgs_s, limits.rate_bytes_s, len(records), size, time.monotonic()
        )
        if wait_ms:
            metrics.PRODUCE_ERRORS.labels(RATE_LIMITED).inc()
            raise RateLimitedError(
                rate_limited_message(str(self.partition.name), wait_ms),
                retry_after_s=max(1, -(-wait_ms // 1000)),
            )

    def _limits(self, max_bytes: int, max_count: int) -> tuple[int, int]:
        # The WAL counts payload bytes; the reply carries a frame header per message too, and
        # must fit one bus message.
        max_count = min(max_count, self._fetch_limit_bytes // (2 * FRAME_HEADER_BYTES))
        payload_room = self._fetch_limit_bytes - max_count * FRAME_HEADER_BYTES
        return min(max_bytes, payload_room), max_count

    async def fetch(self, request: Request) -> bytes:
        """Committed messages only: nothing past the high watermark is ever served."""
        fetch = protocol.FetchRequest.decode(request.body)
        partition = self.partition
        wal = partition.wal
        max_bytes, max_count = self._limits(fetch.max_bytes, fetch.max_count)
        hw = partition.high_watermark
        try:
            result = await wal.fetch(
                fetch.from_offset, max_bytes=max_bytes, max_count=max_count, limit_offset=hw
            )
        except BelowWalStartError as exc:
            return protocol.encode_fetch_reply(
                protocol.FetchStatus.BELOW_WAL_START, exc.start_offset, hw, []
            )
        except WalCorruptionError as exc:
            # Never wrong data, and never a dead end: the range is read from another
            # in-sync copy; when every copy is damaged too, the reader gets the damaged
            # range and the files, and reads that range from the cloud tier.
            return await self._around(exc, fetch.from_offset, hw, max_bytes)
        return protocol.encode_fetch_reply(
            protocol.FetchStatus.OK, wal.start_offset, result.next_offset, result.frames
        )

    async def repl_fetch(self, request: Request) -> bytes:
        """A follower's fetch over the bus (:meth:`fetch_frames`)."""
        return await self.fetch_frames(request.body)

    async def link_fetch(self, ticket: str | None, body: bytes) -> bytes:
        """A follower's fetch over its link to this node's data door
        (danube.ingest.replica_link): :meth:`fetch_frames`, for the term's ticket only."""
        if not ticket_matches(self.link_ticket, ticket):
            raise UnauthenticatedError(f"{self.partition.name}: not this term's replica ticket")
        return await self.fetch_frames(body)

    async def fetch_frames(self, body: bytes) -> bytes:
        """A follower's fetch: it holds everything below ``from_offset`` durably; answer
        what follows (waiting up to ``wait_ms`` for it), uncommitted frames included."""
        fetch = replication.ReplFetchRequest.decode(body)
        partition = self.partition
        wal = partition.wal
        epoch = partition.term.epoch

        def head(status: replication.ReplStatus) -> bytes:
            return replication.encode_repl_reply(
                status, epoch, wal.start_offset, partition.high_watermark, wal.durable_next
            )

        if fetch.leader_epoch > epoch and not partition.fenced:
            # A replica follows a newer epoch: another node leads now (this one may not have
            # heard, its etcd cut off); it stops at once, whatever its lease says.
            partition.fence(f"{fetch.follower} follows epoch {fetch.leader_epoch}")
        if fetch.leader_epoch != epoch or partition.fenced:
            return head(replication.ReplStatus.WRONG_EPOCH)
        if fetch.follower not in partition.term.replicas:
            # Not a replica as this leader has read the assignment: a new one whose own watch
            # was quicker (served now, it would catch up before this leader knew the
            # assignment's catch-up limit), or a removed one. Nothing is served or counted
            # until the leader knows it; it asks again.
            await asyncio.sleep(min(fetch.wait_ms / 1000, _UNKNOWN_FOLLOWER_WAIT_S))
            return head(replication.ReplStatus.OK)
        if fetch.from_offset > wal.durable_next:
            return head(replication.ReplStatus.AHEAD)
        partition.on_follower_fetch(fetch.follower, fetch.from_offset, damaged=fetch.damaged)
        if fetch.from_offset < wal.start_offset:
            return head(replication.ReplStatus.BELOW_WAL_START)
        if fetch.from_offset == wal.durable_next and fetch.wait_ms:
            await wal.wait_for(fetch.from_offset, min(fetch.wait_ms / 1000, _REPL_WAIT_MAX_S))
            if partition.fenced:
                return head(replication.ReplStatus.WRONG_EPOCH)
        max_bytes, max_count = self._limits(fetch.max_bytes, 100_000)
        buckets = self._catchup_buckets(fetch.follower)
        if buckets:
            max_bytes = await _throttle(buckets, max_bytes, fetch.wait_ms / 1000)
            if partition.fenced:
                return head(replication.ReplStatus.WRONG_EPOCH)
        try:
            result = await wal.fetch(fetch.from_offset, max_bytes=max_bytes, max_count=max_count)
        except BelowWalStartError:
            return head(replication.ReplStatus.BELOW_WAL_START)
        except WalCorruptionError as exc:
            # A follower catching up through a damaged range of this copy: another in-sync
            # copy's frames (committed ones only), or an error it retries until repaired.
            hw = partition.high_watermark
            frames = await self._frames_around(
                exc, fetch.from_offset, hw, max_bytes, fetch.follower
            )
            return replication.encode_repl_reply(
                replication.ReplStatus.OK,
                epoch,
                wal.start_offset,
                partition.high_watermark,
                wal.durable_next,
                [(frame.offset, frame.data) for frame in frames],
            )
        if buckets:
            _charge(buckets, sum(len(frame) for _, frame in result.frames))
        return replication.encode_repl_reply(
            replication.ReplStatus.OK,
            epoch,
            wal.start_offset,
            partition.high_watermark,
            wal.durable_next,
            result.frames,
        )

    def _peers(self, exclude: tuple[str, ...]) -> list[str]:
        """The other in-sync replicas, in the replica set's order."""
        partition = self.partition
        skip = {self.node_id, *exclude}
        return [n for n in partition.term.replicas if n in partition.isr and n not in skip]

    async def _around(
        self, exc: WalCorruptionError, from_offset: int, hw: int, max_bytes: int
    ) -> bytes:
        """A fetch reply for a read that met damage in this copy: the range from another
        in-sync copy; ``DAMAGED`` (naming every copy's file) only when every in-sync copy
        was asked and is damaged too; a retriable error when one could not be asked."""
        wal = self.partition.wal
        bad = from_offset if exc.offset is None else exc.offset
        self.on_damage(bad)
        resume = max(exc.resume_offset or hw, from_offset + 1)
        end = max(min(resume, hw), from_offset + 1)
        around = await copies.read_around(
            self._bus,
            self.partition.name,
            self._peers(()),
            from_offset,
            end,
            max_bytes=max_bytes,
        )
        if around.frames:
            metrics.READS_AROUND_DAMAGE.inc()
            metrics.MESSAGES_AROUND_DAMAGE.inc(len(around.frames))
            frames = [(frame.offset, frame.data) for frame in around.frames]
            return protocol.encode_fetch_reply(
                protocol.FetchStatus.OK, wal.start_offset, around.next_offset, frames
            )
        if around.unreachable:
            raise CopyUnavailableError(
                f"{self.partition.name}: offsets from {from_offset} are damaged in this copy "
                f"({exc.segment}) and the in-sync copies of {', '.join(around.unreachable)} "
                "could not be read now; ask again"
            )
        # Every in-sync copy was asked and is damaged too (or there is no other): say so,
        # naming each copy's file (this copy's alone when it is the only one).
        files = [f"{self.node_id}/{exc.segment}", *around.damaged] if around.damaged else []
        named = ", ".join(files) or exc.segment
        return protocol.encode_damaged_reply(wal.start_offset, resume, named)

    async def _frames_around(
        self, exc: WalCorruptionError, from_offset: int, hw: int, max_bytes: int, follower: str
    ) -> list[RawFrame]:
        """Frames a follower's fetch of a damaged range of this copy gets from another
        in-sync copy (committed ones only); CopyUnavailableError when none has them."""
        bad = from_offset if exc.offset is None else exc.offset
        self.on_damage(bad)
        end = min(exc.resume_offset or hw, hw)
        if from_offset < end:
            around = await copies.read_around(
                self._bus,
                self.partition.name,
                self._peers((follower,)),
                from_offset,
                end,
                max_bytes=max_bytes,
            )
            if around.frames:
                metrics.READS_AROUND_DAMAGE.inc()
                metrics.MESSAGES_AROUND_DAMAGE.inc(len(around.frames))
                return around.frames
        raise CopyUnavailableError(
            f"{self.partition.name}: offsets from {from_offset} are damaged in the leader's "
            f"copy ({exc.segment}) and no other in-sync copy gave them; ask again"
        )

    def _catchup_buckets(self, follower: str) -> list[TokenBucket]:
        """The buckets a fetch of ``follower`` draws from: none while it is in sync."""
        if follower in self.partition.isr:
            return []
        buckets = [] if self.catchup is None else [self.catchup]
        rate = self.partition.catchup_bytes_s
        if rate is None:
            self._own_catchup = None
        else:
            if self._own_catchup is None:
                self._own_catchup = TokenBucket(rate, rate / 4, time.monotonic())
            self._own_catchup.set_rate(rate)
            buckets.append(self._own_catchup)
        return buckets

    async def repl_leave(self, request: Request) -> bytes:
        """A follower stops (a clean shutdown): out of the ISR before the answer, so that
        commits do not wait ``replica_lag_max_s`` for it."""
        node = protocol.decode_node(request.body)
        removed = await self.partition.remove_follower(node)
        return orjson.dumps({"removed": removed})

    async def repl_epochs(self, request: Request) -> bytes:
        """The epoch history and end a follower compares its log with, and the link it may
        fetch over (danube.ingest.replica_link)."""
        partition = self.partition
        answer: dict[str, object] = {
            "epoch": partition.term.epoch,
            "end": partition.wal.durable_next,
            "epochs": partition.history.to_json(),
        }
        offer = None if self.links is None else self.links.offer(self.link_ticket)
        if offer is not None:
            answer["link"] = offer.to_json()
        return orjson.dumps(answer)

    async def drop_below(self, request: Request) -> bytes:
        # Never past what is committed (retention only asks for uploaded offsets anyway).
        offset = min(protocol.decode_offset(request.body), self.partition.high_watermark)
        removed = await self.partition.wal.drop_below(offset)
        return protocol.encode_drop_reply(removed, self.partition.wal.start_offset)

    async def offset_for_time(self, request: Request) -> bytes:
        timestamp_ms = protocol.decode_timestamp(request.body)
        offset = await timeseek.offset_for_time(self.partition.wal, timestamp_ms)
        return protocol.encode_offset(min(offset, self.partition.high_watermark))

    async def stats(self, request: Request) -> bytes:
        partition = self.partition
        reply: dict[str, object] = {
            "partition": str(partition.name),
            "node_id": self.node_id,
            "epoch": partition.term.epoch,
            "fenced": partition.fenced,
            "wal": partition.wal.stats().as_dict(),
            **partition.stats(),
        }
        max_segments = control.decode_stats_request(request.body)
        if max_segments:  # retention asks; the others want the cheap answer
            infos = await partition.wal.segment_infos(max_segments)
            reply["segments"] = [info.as_dict() for info in infos]
            reply["now_ms"] = int(time.time() * 1000)  # ages by this host's clock, as mtimes
        return orjson.dumps(reply)


def _charge(buckets: list[TokenBucket], sent_bytes: int) -> None:
    """A catch-up fetch sent ``sent_bytes``: every bucket it drew from pays."""
    now_s = time.monotonic()
    for bucket in buckets:
        bucket.charge(sent_bytes, now_s)
    metrics.CATCHUP_BYTES.inc(sent_bytes)


async def _throttle(buckets: list[TokenBucket], want_bytes: int, wait_max_s: float) -> int:
    """Wait (at most about ``wait_max_s``; a follower's fetch may wait that long anyway)
    until every bucket allows a fetch; the bytes it may ask for."""
    loop_wait_s = 0.0
    deadline_s = time.monotonic() + max(wait_max_s, 0.05)
    while True:
        now_s = time.monotonic()
        wait_s = max(bucket.wait_s(now_s) for bucket in buckets)
        if wait_s <= 0 or now_s >= deadline_s:
            break
        pause_s = min(wait_s, deadline_s - now_s)
        loop_wait_s += pause_s
        await asyncio.sleep(pause_s)
    if loop_wait_s:
        metrics.CATCHUP_THROTTLED_SECONDS.inc(loop_wait_s)
    now_s = time.monotonic()
    if max(bucket.wait_s(now_s) for bucket in buckets) > 0:
        return 1  # still in debt: one frame, the least a fetch can send
    return min(bucket.grant(want_bytes, now_s) for bucket in buckets)


async def serve_claims(bus: Bus, answer: Callable[[Request], Awaitable[bytes]]) -> Responder:
    """Answer claim requests (``ctl.owner``, queue ``ingest``: one node takes each): the
    first produce to a partition with no leader finds no responder and asks here; the node
    places the partition if it has no replica set yet, then waits for a leader."""
    return await bus.serve(
        bus.subjects.all_of_kind(Kind.OWNERSHIP), answer, queue=INGEST_QUEUE, max_concurrency=16
    )


async def serve_probes(bus: Bus, answer: Callable[[Request], Awaitable[bytes]]) -> Responder:
    """Answer leader probes (``ctl.probe``, every node, no queue group): a producer whose
    request is slow asks whether the partition has or may get a leader; every node reads
    etcd and answers, the first answer wins, so a frozen node that still holds its
    subscriptions cannot leave the question unanswered."""
    return await bus.serve(
        bus.subjects.all_of_kind(Kind.LEADER_PROBE), answer, queue=None, max_concurrency=16
    )


async def serve_deletes(
    bus: Bus, delete_local: Callable[[TopicName], Awaitable[bool]]
) -> Subscription:
    """Drop the local WAL of partitions whose topic was deleted (every node: a node that once
    held a replica may still hold its WAL)."""

    async def delete(message: Message) -> None:
        name = bus.subjects.parse(message.subject).name
        try:
            await delete_local(name)
        except Exception:
            log.exception("could not delete the WAL of %s", name)

    return await bus.subscribe(bus.subjects.all_of_kind(Kind.WAL_DELETE), delete)

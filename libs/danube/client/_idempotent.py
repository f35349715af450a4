"""The idempotent producer's sending (docs/client.md, "Exactly once into the log"): its
identity, the topic's partition count, and each batch cut into parts, one per partition,
each sent with its sequences and resent as the same bytes until it is answered. The
decisions without I/O are :mod:`danube.client._sequencing`'s.

Identity. The dedup identity is the producer name. A producer left with the default name
gets a unique one (``danube-client-<12 hex>``) and epoch 0; a named one asks
``POST /v1/topics/{ns}/{t}/producers/{name}/epoch`` before its first batch, which fences any
older instance of that name (a name identifies one producer). After a part fails, what the
leader holds of its partition is unknown (stored, or a gap): before the next batch the
producer takes a new epoch (named: asks for one; unnamed: the next number, the name being its
own), so its sequences start again cleanly.

Answers. A duplicate is success (the original offsets). ``out_of_order_sequence`` while an
earlier part to the same partition is in flight (``max_inflight_batches > 1``: the later one
overtook it) is resent once that one settles; otherwise it fails the part. The first part
of an epoch to a partition is never overtaken: the leader starts an unknown producer at any
sequence, so the parts behind it wait for its answer before they go.
``producer_fenced`` under the current epoch of a named producer means another instance took
the name: the part fails and so does every later send (an unnamed producer has no other
instance: for it the code can only be another producer's exclusive session, and only the
part fails). ``partition_required`` (the topic became partitioned),
or a partition not found (the topic created again with fewer): the partition count is
asked again and, if it changed, the part routed again.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from danube.client._direct import DataDoors, lookup_doors, moved, post_to_door, unanswered
from danube.client._http import Answer, HttpCore
from danube.client._records import RECORDS_TYPE, results_of_runs
from danube.client._sequencing import EPOCH_MAX, Router, Sequences, Stamp, key_of, stamp
from danube.client.errors import (
    ApiError,
    ClientError,
    ConflictError,
    NotFoundError,
    PermissionDeniedError,
    ProtocolError,
    TransportError,
)
from danube.client.messages import SendResult, topic_path
from danube.names import TopicName
from danube.tasks import TaskSet
from danube.wire import codes

log = logging.getLogger(__name__)

DEFAULT_PRODUCER_NAME = "danube-client"
OUT_OF_ORDER_SEQUENCE = "out_of_order_sequence"
PRODUCER_FENCED = codes.PRODUCER_FENCED
PARTITION_REQUIRED = "partition_required"
# A partition without a known data door is looked up again at most this often (its
# parts go the proxy path meanwhile).
LOOKUP_AGAIN_S = 1.0
# Bytes of randomness in a generated producer name: 48 bits, so that two producers of one
# topic collide with odds of ~1 in 2^24 even among thousands (a collision would fence).
_NAME_RANDOM_BYTES = 6

Outcome = tuple[list[int], list[SendResult] | ClientError]
"""Indexes of a batch's messages, and their results or the error that failed them."""


def unique_name(base: str = DEFAULT_PRODUCER_NAME) -> str:
    """A producer name no other producer has: ``<base>-<12 hex>``."""
    return f"{base}-{secrets.token_hex(_NAME_RANDOM_BYTES)}"


@dataclass(eq=False, slots=True)
class Part:
    """Messages of one batch to one partition, with consecutive sequences from ``first``."""

    partition: TopicName
    epoch: int
    first: int
    indexes: list[int]
    frames: list[bytes]  # the records: what a new routing starts from (stamped again)
    content: bytes
    settled: asyncio.Event = field(default_factory=asyncio.Event)


class IdempotentSender:
    """Sends a producer's batches with sequences; owned by one
    :class:`~danube.client.producer.AsyncProducer` and called by its sender task only."""

    def __init__(
        self,
        http: HttpCore,
        topic: TopicName,
        *,
        name: str,
        named: bool,
        send_timeout_s: float,
        params: Callable[[], Mapping[str, str | int]],
        direct: bool = True,
    ) -> None:
        """``direct``: post each part to its partition's leader (the lookup's data door)
        when one is known, else through ``http``'s server."""
        self.topic = topic
        self.name = name
        self.named = named
        self.epoch = 0
        # Why every later send fails (another instance of this name fenced this one).
        self.fenced: ClientError | None = None
        self._http = http
        self._timeout_s = send_timeout_s
        self._params = params
        self._router = Router(topic)
        # The leaders' data doors, as the last lookup named them.
        self.doors = DataDoors(http, enabled=direct)
        self._looked_up_s: float | None = None  # when the last lookup was asked
        self._refresh: asyncio.Task[None] | None = None  # a lookup for missing doors
        self._tasks = TaskSet(f"idempotent sender {topic}")
        self._closed = False
        self._sequences = Sequences()
        self._epoch_known = not named
        self._stale = False  # a part failed: take a new epoch before the next batch
        self._inflight: dict[TopicName, list[Part]] = {}
        # Bumped with each new epoch: stamps of an older generation are stale.
        self.generation = 0

    def stamp_next(self, key: bytes | None, last: Stamp | None, *, queued: bool) -> Stamp | None:
        """Take the next sequence of the partition a record with ``key`` (UTF-8; None:
        keyless) sent now goes to; its stamp. None when the record is to be stamped when its
        batch is planned: the epoch or the partitions are not known yet, or a record queued
        before it (``queued``; ``last``: the newest one's stamp) is not stamped under this
        epoch (sequences follow the queue's order)."""
        if queued and (last is None or last[0] != self.generation):
            return None
        if not self._epoch_known or self._stale or self.fenced is not None:
            return None
        if self._router.partitions is None:
            return None
        partition = self._router.partition_of(key)
        return (self.generation, partition, self._sequences.take(partition, 1))

    def restamp(self, frames: list[bytes], stamps: list[Stamp | None]) -> None:
        """Stamp, in place and in order, every record of ``frames`` whose stamp is missing
        or stale (an older epoch's). Those are a suffix (a record is stamped at ``send()``
        only behind current ones), so a list whose last stamp is current has no other."""
        if not stamps or self._current(stamps[-1]):
            return
        start = len(stamps) - 1
        while start > 0 and not self._current(stamps[start - 1]):
            start -= 1
        router, sequences, epoch, generation = (
            self._router,
            self._sequences,
            self.epoch,
            self.generation,
        )
        for index in range(start, len(frames)):
            frame = frames[index]
            partition = router.partition_of(key_of(frame))
            sequence = sequences.take(partition, 1)
            head, rest = stamp(frame, epoch, sequence)
            frames[index] = head + rest
            stamps[index] = (generation, partition, sequence)

    def _current(self, stamp: Stamp | None) -> bool:
        return stamp is not None and stamp[0] == self.generation

    def plan_stamped(self, frames: list[bytes], stamps: list[Stamp | None]) -> list[Part]:
        """Cut a batch whose records are all stamped (see :meth:`restamp`) into parts, one
        per partition: their bytes are joined as they are. Keyless records sent from now on
        go to the next partition."""
        self._router.next_turn()
        groups: dict[TopicName, list[int]] = {}
        for index, entry in enumerate(stamps):
            assert entry is not None
            groups.setdefault(entry[1], []).append(index)
        parts = []
        for partition, indexes in groups.items():
            chosen = frames if len(indexes) == len(frames) else [frames[i] for i in indexes]
            first = stamps[indexes[0]]
            assert first is not None
            part = Part(partition, self.epoch, first[2], indexes, chosen, b"".join(chosen))
            self._inflight.setdefault(partition, []).append(part)
            parts.append(part)
        return parts

    @property
    def partitions(self) -> int | None:
        """The topic's partition count as last learned (0: unpartitioned)."""
        return self._router.partitions

    async def prepare(self) -> None:
        """Before a batch is planned: the epoch (asked once when named, and again after a
        failure) and the partition count (asked once). A partition with no door known is
        looked up again in the background (at most once a second, one lookup at a time):
        its batches go the proxy path meanwhile, and a lookup that fails (etcd out of
        reach) costs them nothing."""
        if not self._epoch_known or self._stale:
            await self._new_epoch()
        if self._router.partitions is None:
            self._router.partitions = await self._partition_count()
        elif self._refresh is None and not self._closed and self._doors_missing():
            self._refresh = self._tasks.spawn(
                self._refresh_doors(), name="lookup for missing doors", on_failure="log"
            )

    async def _refresh_doors(self) -> None:
        try:
            self._router.partitions = await self._partition_count()
        except ClientError as exc:
            log.info("%s: no lookup (%s): the proxy path meanwhile", self.topic, exc)
        finally:
            self._refresh = None

    async def aclose(self) -> None:
        """Stop a lookup in the background and close the doors' connections."""
        self._closed = True
        await self._tasks.close()
        await self.doors.aclose()

    def plan(self, frames: list[bytes]) -> list[Part]:
        """Cut a batch into parts, one per partition, each with its next sequences."""
        return self._plan(frames, list(range(len(frames))))

    def _plan(self, frames: list[bytes], indexes: list[int]) -> list[Part]:
        parts = []
        for partition, local in self._router.route(frames).items():
            first = self._sequences.take(partition, len(local))
            pieces: list[bytes | memoryview] = []
            for offset, index in enumerate(local):
                pieces += stamp(frames[index], self.epoch, first + offset)
            part = Part(
                partition,
                self.epoch,
                first,
                [indexes[i] for i in local],
                [frames[i] for i in local],
                b"".join(pieces),
            )
            self._inflight.setdefault(partition, []).append(part)
            parts.append(part)
        return parts

    async def deliver(self, parts: list[Part]) -> list[Outcome]:
        """Send every part (at once) within ``send_timeout_s``; the outcome of each."""
        deadline = asyncio.get_running_loop().time() + self._timeout_s
        if len(parts) == 1:
            return await self._outcome(parts[0], deadline)
        done = await asyncio.gather(*(self._outcome(part, deadline) for part in parts))
        return [outcome for outcomes in done for outcome in outcomes]

    async def _outcome(self, part: Part, deadline: float) -> list[Outcome]:
        try:
            return [(part.indexes, await self._send(part, deadline))]
        except ApiError as exc:
            if not self._maybe_moved(part, exc):
                self._failed(part, exc)
                return [(part.indexes, exc)]
            refused = exc
        except ClientError as exc:
            self._failed(part, exc)
            return [(part.indexes, exc)]
        finally:
            self._settle(part)
        # Nothing of the part was stored. If the topic's partitions changed (partitioned
        # meanwhile, or deleted and created again with another count), route it again.
        before = self._router.partitions
        try:
            self._router.partitions = await self._partition_count()
        except ClientError as exc:
            return [(part.indexes, exc)]
        after = self._router.partitions
        stuck = after == before or (refused.code == PARTITION_REQUIRED and not after)
        if stuck or asyncio.get_running_loop().time() >= deadline:
            return [(part.indexes, refused)]
        log.info("%s has %d partitions now (%s): routing again", self.topic, after, before)
        again = self._plan(part.frames, part.indexes)
        done = await asyncio.gather(*(self._outcome(p, deadline) for p in again))
        return [outcome for outcomes in done for outcome in outcomes]

    def _maybe_moved(self, part: Part, exc: ApiError) -> bool:
        """``exc`` may mean the topic's partitions are not what the producer thinks: the
        topic itself refused as partitioned, or a partition of it not found."""
        if exc.code == PARTITION_REQUIRED:
            return True
        return isinstance(exc, NotFoundError) and part.partition != self.topic

    async def _send(self, part: Part, deadline: float) -> list[SendResult]:
        loop = asyncio.get_running_loop()
        path = f"/v1/topics/{topic_path(part.partition)}/messages"
        opening = self._earlier(part)
        if opening is not None and opening.first == 0:
            # The leader takes an unknown producer's (or epoch's) first batch at any
            # sequence: a later batch that overtook the opening one would open the
            # partition's stream itself, and the opening one would then be a gap.
            await self._wait(opening, deadline)
        while True:
            if self.fenced is not None:
                raise self.fenced
            door = self.doors.core(part.partition)
            try:
                answer = await self._post(door, path, part.content, deadline)
            except TransportError as exc:
                if door is None or loop.time() >= deadline:
                    raise
                left_s = deadline - loop.time()
                await self._door_failed(part.partition, exc, left_s, unreachable=unanswered(exc))
                continue
            except ApiError as exc:
                if door is not None and moved(exc) and loop.time() < deadline:
                    await self._door_failed(part.partition, exc, deadline - loop.time())
                    continue
                if exc.code == OUT_OF_ORDER_SEQUENCE:
                    earlier = self._earlier(part)
                    if earlier is not None and loop.time() < deadline:
                        await self._wait(earlier, deadline)
                        continue
                    raise ConflictError(
                        f"{part.partition}: sequences {part.first}.. of epoch {part.epoch} "
                        f"do not follow what the partition holds (an earlier batch to it "
                        f"failed); not stored, the producer takes a new epoch: {exc.message}",
                        code=exc.code,
                        status=exc.status or 409,
                    ) from exc
                if exc.code == PRODUCER_FENCED and self.named and part.epoch == self.epoch:
                    # Only a named producer has other instances; an unnamed one is refused
                    # so only while another holds the topic with an exclusive session.
                    self.fenced = exc
                raise
            self._note_partitions(answer.body)
            return results_of_runs(answer.body, len(part.indexes))

    async def _post(
        self, door: HttpCore | None, path: str, content: bytes, deadline: float
    ) -> Answer:
        """One part posted to its leader's data door (one attempt: a failure is the door's
        to report), or through the server the client was given (retried there)."""
        left_s = max(0.001, deadline - asyncio.get_running_loop().time())
        params = self._params()
        if door is not None:
            return await post_to_door(door, path, content, params, left_s)
        return await self._http.request_retrying(
            "POST",
            path,
            content=content,
            content_type=RECORDS_TYPE,
            params=params,
            timeout_s=left_s,
            lean=True,
        )

    async def _door_failed(
        self,
        partition: TopicName,
        exc: ClientError,
        timeout_s: float,
        *,
        unreachable: bool = False,
    ) -> None:
        """``partition``'s door failed it (its leader moved or died): forget it and look the
        topic up again, so the part goes at once where the lookup says (a resend of
        sequenced records is stored once). A lookup that names the same door again (the
        dead leader's claim has not lapsed yet) or fails (etcd out of reach; it has half of
        the part's time left) leaves the part to the proxy path, which waits for the new
        leader with its retries; a later batch looks up again."""
        log.info("%s: its data door failed (%s); looking it up again", partition, exc)
        failed = self.doors.url(partition)
        self.doors.failed(partition, unreachable=unreachable)
        try:
            await self._partition_count(timeout_s / 2)
        except ClientError as lookup_exc:  # etcd out of reach: no door known, the proxy path
            log.info("%s: no lookup (%s): the proxy path", partition, lookup_exc)
        if self.doors.url(partition) == failed:
            self.doors.forget(partition)

    def _doors_missing(self) -> bool:
        """Whether to look the topic up again before a batch: never looked up, or a
        partition has no door known and the last lookup is over a second old."""
        if self._looked_up_s is None:
            return True
        doors = self.doors
        if not doors.enabled or doors.known >= max(1, self._router.partitions or 0):
            return False
        return time.monotonic() - self._looked_up_s >= LOOKUP_AGAIN_S

    def _note_partitions(self, answer: object) -> None:
        """The server's count of the topic's partitions, sent with every answer: a topic that
        grew is routed over its new partitions from the next batch on."""
        count = answer.get("partitions") if isinstance(answer, dict) else None
        router = self._router
        if (
            isinstance(count, int)
            and count > 0
            and router.partitions is not None
            and router.partitions > 0
            and count != router.partitions
        ):
            log.info(
                "%s has %d partitions now (%d before): routing over them",
                self.topic,
                count,
                router.partitions,
            )
            router.partitions = count

    def _earlier(self, part: Part) -> Part | None:
        """A part to the same partition, same epoch, with earlier sequences, in flight."""
        for other in self._inflight.get(part.partition, ()):
            if other.epoch == part.epoch and other.first < part.first:
                return other
        return None

    @staticmethod
    async def _wait(earlier: Part, deadline: float) -> None:
        left_s = deadline - asyncio.get_running_loop().time()
        try:
            async with asyncio.timeout(max(0.0, left_s)):
                await earlier.settled.wait()
        except TimeoutError:
            pass  # the resend then answers what it answers

    def _settle(self, part: Part) -> None:
        part.settled.set()
        parts = self._inflight.get(part.partition)
        if parts is not None and part in parts:
            parts.remove(part)
            if not parts:
                del self._inflight[part.partition]

    def _failed(self, part: Part, exc: ClientError) -> None:
        # Stored or not, the partition's next sequence is no longer certain to follow what
        # the leader holds: a new epoch before the next batch.
        if part.epoch == self.epoch and self.fenced is None:
            self._stale = True
        log.debug("%s: part of %d failed: %r", part.partition, len(part.indexes), exc)

    async def _new_epoch(self) -> None:
        if self.named:
            path = f"/v1/topics/{topic_path(self.topic)}/producers/{self.name}/epoch"
            answer = await self._http.request_retrying(
                "POST", path, timeout_s=self._timeout_s, body={}
            )
            body = answer.body
            epoch = body.get("epoch") if isinstance(body, dict) else None
            if not isinstance(epoch, int) or not 0 <= epoch <= EPOCH_MAX:
                raise ProtocolError(f"producer epoch answered {body!r:.200}")
            self.epoch = epoch
        else:
            # The name is this producer's alone: the next epoch is its own to take.
            self.epoch = (self.epoch + 1) % (EPOCH_MAX + 1)
        self._epoch_known = True
        self._stale = False
        self._sequences.reset()
        self.generation += 1
        log.info("producer %s of %s: epoch %d", self.name, self.topic, self.epoch)

    async def _partition_count(self, timeout_s: float | None = None) -> int:
        """The topic's partitions (0: unpartitioned, or not there yet: the first produce
        creates it unpartitioned), and the data door of each (danube.client._direct). A
        principal without Lookup on the topic sends to the topic itself through the server
        it was given: the server says ``partition_required`` if it is partitioned."""
        lookup = self.topic.parent
        self._looked_up_s = time.monotonic()
        try:
            answer = await self._http.request_retrying(
                "GET",
                f"/v1/lookup/{topic_path(lookup)}",
                timeout_s=self._timeout_s if timeout_s is None else timeout_s,
            )
        except NotFoundError:
            return 0
        except PermissionDeniedError as exc:
            # Not asked again for the doors (they stay unknown: the proxy path).
            self.doors.enabled = False
            log.warning("%s: no lookup (%s): sending to the topic itself", self.topic, exc)
            return 0
        names, urls, epochs = lookup_doors(answer.body)
        self.doors.learn(names, urls, epochs)
        if self.topic.partition is not None or names == [self.topic]:
            return 0
        return len(names)

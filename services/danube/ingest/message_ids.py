"""A leader's message ids: deduplication for clients that keep no sequence (as JetStream's
``Nats-Msg-Id``; docs/client.md, "Exactly once into the log").

On a topic with a ``message_id_window_s`` policy, a record carrying the attribute
``danube.message_id`` whose id was stored within the window is not stored again: the
produce answers the first one's offset for it, marked duplicate. The ids live on the leader
only, in memory: a new leader reads them back from its log (the records published since
``now - window``, by their publish time) before its first produce with a window is answered;
so a repeat is recognised across a failover as long as its first copy was committed.

Bounded: ids older than the window go at each produce, and past ``ids_max`` per partition
the oldest go first (counted). An id being written (queued, not durable yet) is pending: a
repeat waits for it and answers its offset.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Literal

from danube.frame import (
    FRAME_HEADER_BYTES,
    CorruptRecordError,
    decode_record_fields,
    record_publish_time_ms,
)
from danube.ingest import timeseek
from danube.ingest.wal import Wal, WalError
from danube.wire.ingest import protocol

log = logging.getLogger(__name__)

IDS_MAX_DEFAULT = 100_000
_ID_SCAN_BYTES = 4 * 1024 * 1024  # one read of the message ids' read-back


def message_id(record: bytes | memoryview) -> str | None:
    """The record's ``danube.message_id`` attribute (an empty one counts as none)."""
    if not record or record[0] not in (1, 2):
        return None
    try:
        found = decode_record_fields(record, decompress=False).attributes.get(
            protocol.MESSAGE_ID_ATTRIBUTE
        )
    except CorruptRecordError:
        return None
    return found or None


class MessageIds:
    """The ids a leader stored (durable) or is storing (pending), with when."""

    def __init__(
        self, *, ids_max: int = IDS_MAX_DEFAULT, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.ids_max = ids_max
        self._clock = clock
        self._stored: OrderedDict[str, tuple[int, float]] = OrderedDict()  # oldest first
        self._pending: dict[str, asyncio.Future[int]] = {}
        self.evicted = 0
        self.loaded_window_s: int | None = None  # the window the log was read back for

    def __len__(self) -> int:
        return len(self._stored)

    def expire(self, window_s: float) -> None:
        deadline_s = self._clock() - window_s
        stored = self._stored
        while stored:
            _, (_, at_s) = next(iter(stored.items()))
            if at_s > deadline_s:
                return
            stored.popitem(last=False)

    def find(self, msg_id: str) -> int | asyncio.Future[int] | None:
        """Where ``msg_id`` was stored, the future of where it is being stored, or None."""
        found = self._stored.get(msg_id)
        if found is not None:
            return found[0]
        return self._pending.get(msg_id)

    def add(self, msg_id: str, offset: int, at_s: float | None = None) -> None:
        """``msg_id`` is stored at ``offset`` (``at_s``: when, by this clock; default now)."""
        self._stored[msg_id] = (offset, self._clock() if at_s is None else at_s)
        self._stored.move_to_end(msg_id)
        if len(self._stored) > self.ids_max:
            self._stored.popitem(last=False)
            self.evicted += 1

    def pend(self, ids: Sequence[tuple[str, int]]) -> PendingIds:
        """``ids`` (each with its index in the append) are about to be appended: pending
        until durable (see :class:`PendingIds`)."""
        pending = PendingIds(self, ids)
        for msg_id, future in pending.futures.items():
            self._pending[msg_id] = future
        return pending

    def _settled(self, pending: PendingIds, first: int | None, exc: BaseException | None) -> None:
        for msg_id, index in pending.ids:
            future = pending.futures[msg_id]
            if self._pending.get(msg_id) is future:
                del self._pending[msg_id]
            if future.done():
                continue
            if exc is None and first is not None:
                self.add(msg_id, first + index)
                future.set_result(first + index)
            else:
                future.set_exception(exc or RuntimeError("append failed"))
                future.exception()  # read: no repeat may be waiting for it

    def clear(self, exc: BaseException) -> None:
        """The leader stops: pending ids fail with ``exc`` (a repeat waiting goes on to the
        next leader)."""
        for future in self._pending.values():
            if not future.done():
                future.set_exception(exc)
                future.exception()
        self._pending.clear()


class PendingIds:
    """The ids of one append between its admission and its durability: :meth:`queued` is
    the WAL's ``on_queued`` hook for it; :meth:`failed` when the append failed before."""

    def __init__(self, ids_: MessageIds, ids: Sequence[tuple[str, int]]) -> None:
        self._owner = ids_
        self.ids = ids
        loop = asyncio.get_running_loop()
        self.futures: dict[str, asyncio.Future[int]] = {m: loop.create_future() for m, _ in ids}

    def queued(self, first: int, durable: asyncio.Future[None] | None) -> None:
        if durable is None:
            self._owner._settled(self, first, None)
            return

        def done(outcome: asyncio.Future[None]) -> None:
            if outcome.cancelled():
                self._owner._settled(self, None, asyncio.CancelledError())
            else:
                self._owner._settled(self, first, outcome.exception())

        durable.add_done_callback(done)

    def failed(self, exc: BaseException) -> None:
        self._owner._settled(self, None, exc)


Place = tuple[Literal["fresh", "again", "before"], "int | asyncio.Future[int]"]


@dataclass
class IdPlan:
    """What a produce of records with message ids does with each: ``fresh`` records are
    appended (``fresh_ids``: their ids, by index among them); each record's place is
    ``("fresh", i)`` (the i-th appended), ``("again", i)`` (the same id earlier in this
    request: the i-th appended) or ``("before", offset or pending offset)`` (stored within
    the window)."""

    fresh: list[bytes | memoryview] = field(default_factory=list)
    fresh_ids: list[tuple[str, int]] = field(default_factory=list)
    places: list[Place] = field(default_factory=list)

    def listed(self, first: int, stored: Sequence[int]) -> list[int]:
        """Each record's offset (``first``: the appended records' first; ``stored``: the
        "before" places resolved, in order), marked when it was not appended now."""
        resolved = iter(stored)
        listed = []
        for kind, where in self.places:
            if kind == "before":
                listed.append(next(resolved) | protocol.DUPLICATE_MARK)
            else:
                assert isinstance(where, int)
                offset = first + where
                listed.append(offset if kind == "fresh" else offset | protocol.DUPLICATE_MARK)
        return listed


def plan_ids(
    records: Sequence[bytes | memoryview], ids: Sequence[str | None], known: MessageIds
) -> IdPlan:
    """Which of ``records`` (their ``ids``) are new, and where the others were stored."""
    plan = IdPlan()
    first_seen: dict[str, int] = {}
    for record, msg_id in zip(records, ids, strict=True):
        if msg_id is not None:
            again = first_seen.get(msg_id)
            if again is not None:
                plan.places.append(("again", again))
                continue
            found = known.find(msg_id)
            if found is not None:
                plan.places.append(("before", found))
                continue
            first_seen[msg_id] = len(plan.fresh)
            plan.fresh_ids.append((msg_id, len(plan.fresh)))
        plan.places.append(("fresh", len(plan.fresh)))
        plan.fresh.append(record)
    return plan


async def read_back(wal: Wal, known: MessageIds, window_s: int, *, name: object) -> None:
    """Add the ids of the records ``wal`` (of partition ``name``) holds published within
    ``window_s`` (by their publish time) to ``known``: a new leader learns what its
    predecessor stored. A range dropped meanwhile or damaged ends the read: what was read
    counts."""
    now_ms = int(time.time() * 1000)
    now_s = time.monotonic()
    offset = await timeseek.offset_for_time(wal, now_ms - window_s * 1000)
    end = wal.durable_next
    while offset < end:
        try:
            result = await wal.fetch(
                offset, max_bytes=_ID_SCAN_BYTES, max_count=10_000, limit_offset=end
            )
        except WalError as exc:
            log.warning("%s: message ids read back to %d only: %s", name, offset, exc)
            return
        if not result.frames:
            return
        for at, frame in result.frames:
            record = bytes(memoryview(frame)[FRAME_HEADER_BYTES:])
            msg_id = message_id(record)
            if msg_id is not None and known.find(msg_id) is None:
                age_s = max(0, now_ms - record_publish_time_ms(record)) / 1000
                known.add(msg_id, at, now_s - age_s)
        offset = result.next_offset

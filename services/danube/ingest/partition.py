"""One owned partition: its WAL, its offset reservation, and its live stream.

``produce`` admits a batch only while the offsets it will take lie below the etcd
reservation (waiting for an extension otherwise), appends it to the WAL, and answers
after durability — and only while this node still holds its lease. Every durable batch
is handed to the live publisher; a full live queue drops (counted): dispatchers that
miss live messages catch up through fetch, so live delivery is an optimization, never
the record.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from collections.abc import Callable, Sequence

from danube.bus import Bus
from danube.frame import FRAME_HEADER_BYTES, append_frame
from danube.ingest import metrics
from danube.ingest.ownership import RESERVATION_BLOCK, Claim, OwnershipError, extend
from danube.ingest.wal import Wal, WalFailedError
from danube.meta import Lease, MetaStore, TopicName

log = logging.getLogger(__name__)

LIVE_QUEUE_BATCHES_MAX = 1024
# A record's fields around its payload (producer, key, attributes) may add this much.
RECORD_OVERHEAD_BYTES = 64 * 1024
RESERVATION_WAIT_S = 10.0
_LIVE_BODY_MARGIN_BYTES = 4096  # room for NATS headers inside max_payload


class Partition:
    """Serves one partition this node owns."""

    def __init__(
        self,
        name: TopicName,
        wal: Wal,
        claim: Claim,
        *,
        store: MetaStore,
        bus: Bus,
        node_id: str,
        lease: Lease,
        on_fenced: Callable[[Partition, bool], None],
    ) -> None:
        self.name = name
        self.wal = wal
        self.claim = claim
        self._store = store
        self._bus = bus
        self._node_id = node_id
        self._lease = lease
        self._on_fenced = on_fenced
        self._admitted_next = wal.next_offset  # the end of everything handed to the WAL
        self._extension: asyncio.Task[None] | None = None
        self._extended = asyncio.Event()
        self._fenced: str | None = None
        self._live: deque[tuple[int, Sequence[bytes]]] = deque()
        self._live_ready = asyncio.Event()
        self._live_subject = bus.subjects.live(name)
        wal.add_durable_listener(self._on_durable)

    @property
    def fenced(self) -> bool:
        return self._fenced is not None

    def fence(self, reason: str, *, fatal: bool = False) -> None:
        """Stop acknowledging anything: ownership is gone (lease lost, reservation taken),
        or the WAL failed (``fatal``: the node restarts to reopen it from disk)."""
        if self._fenced is None:
            self._fenced = reason
            log.warning("%s fenced: %s", self.name, reason)
            self._extended.set()  # wake producers waiting on the reservation
            self._on_fenced(self, fatal)

    def _check_owner(self) -> None:
        if self._fenced is not None:
            raise OwnershipError(f"{self.name}: not owned here any more ({self._fenced})")
        if not self._lease.alive:
            self.fence("node lease lost")
            raise OwnershipError(f"{self.name}: this node's lease is lost")

    async def produce(self, records: Sequence[bytes]) -> int:
        """Append ``records``; return the first offset once they are durable."""
        self._check_owner()
        await self._reserve(len(records))
        self._admitted_next += len(records)
        try:
            first = await self.wal.append(records)
        except WalFailedError as exc:
            # After a failed write or fsync the file's state is unknown ("fsyncgate"):
            # never retry on the same descriptor; the node restarts and recovers from disk.
            self.fence(f"WAL failed: {exc}", fatal=True)
            raise
        self._check_owner()  # never acknowledge after the lease is gone
        return first

    async def _reserve(self, count: int) -> None:
        """Wait until ``count`` more offsets fit under the reservation."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + RESERVATION_WAIT_S
        while True:
            self._check_owner()
            needed_end = self._admitted_next + count
            headroom = self.claim.reserved_end - needed_end
            if headroom < RESERVATION_BLOCK // 2 and self._extension is None:
                self._extension = asyncio.create_task(self._extend(needed_end))
            if headroom >= 0:
                return
            self._extended.clear()
            remaining_s = deadline - loop.time()
            if remaining_s <= 0:
                raise OwnershipError(f"{self.name}: offset reservation not extended in time")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._extended.wait(), remaining_s)

    async def _extend(self, needed_end: int) -> None:
        try:
            await extend(self._store, self._node_id, self.claim, needed_end)
        except OwnershipError as exc:
            self.fence(str(exc))
        except Exception as exc:  # etcd down: retried by the next produce
            log.warning("%s: reservation extension failed: %s", self.name, exc)
        finally:
            self._extension = None
            self._extended.set()

    # --- live stream -------------------------------------------------------------------

    def _on_durable(self, first_offset: int, payloads: Sequence[bytes]) -> None:
        metrics.APPENDED_MESSAGES.inc(len(payloads))
        metrics.APPENDED_BYTES.inc(sum(map(len, payloads)))
        metrics.BATCH_MESSAGES.observe(len(payloads))
        if len(self._live) >= LIVE_QUEUE_BATCHES_MAX:
            metrics.LIVE_DROPPED.inc(len(payloads))
            return
        self._live.append((first_offset, payloads))
        self._live_ready.set()

    async def publish_live(self) -> None:
        """Publish durable batches on the live subject, in offset order, until cancelled."""
        limit = max(self._bus.max_payload_bytes - _LIVE_BODY_MARGIN_BYTES, 1024)
        while True:
            await self._live_ready.wait()
            self._live_ready.clear()
            while self._live:
                first, payloads = self._live.popleft()
                for body in _frame_chunks(first, payloads, limit):
                    await self._bus.publish(self._live_subject, body)


def _frame_chunks(first: int, payloads: Sequence[bytes], limit_bytes: int) -> list[bytes]:
    """Frames of ``payloads`` from offset ``first``, packed into bodies of at most the limit
    (a single frame over the limit travels alone; the bus refuses it and counts it)."""
    bodies: list[bytes] = []
    body = bytearray()
    for index, payload in enumerate(payloads):
        if body and len(body) + FRAME_HEADER_BYTES + len(payload) > limit_bytes:
            bodies.append(bytes(body))
            body = bytearray()
        append_frame(body, first + index, payload)
    if body:
        bodies.append(bytes(body))
    return bodies

"""A consumer's acks and nacks: queued by the application (``ack()`` does not wait) and sent
in batches by one task, ``POST /v1/consumers/{id}/ack`` and ``/nack``.

The server answers an ack only once the subscription's cursor holding it is stored, so one
request per message would pace a consumer at one etcd write per message; a batch shares
one, and goes as ``ranges`` of consecutive offsets (docs/http-api.md). Acks go over HTTP even
when messages come over the stream: each batch then gets a definite answer (a stream answers
only failures, without saying which ack failed), and is retried on 429/503
(``ack_not_durable`` included: acking again is safe). An ack that still fails is logged and
counted; its message comes again (at-least-once).

Acks go where the consumer's other calls go (danube.client._consume_route): the consume door
its attach named, else the client's server; one a door refuses for being elsewhere (421, no
answer, 502-504) is sent again at once through the client's server, same consumer id.

Up to ``INFLIGHT_MAX`` batches are under way at once: the next batch does not wait for the
answer to the one before (which waits for a cursor write), so a consumer's window
(``max_unacked_per_consumer``) frees at the pace acks are sent, not at one etcd write per
batch. Order between batches does not matter: an ack names delivered messages, and a
message a nack gives back is delivered (and acked) again only after that nack was handled.
"""

from __future__ import annotations

import asyncio
import logging
from collections import defaultdict

from danube.client._consume_route import ConsumeRoute, retry_on_door, routed
from danube.client._http import HttpCore
from danube.client._session import Session
from danube.client.errors import ClientError
from danube.client.retry import is_retriable
from danube.wire import codes

log = logging.getLogger(__name__)

# The server takes at most this many refs per request.
REFS_MAX = 100_000
# Ack (and nack) requests under way at once.
INFLIGHT_MAX = 4

# A delivered message as queued here: its partition and offset (a tuple, not a MessageRef:
# one is made per received message).
Ref = tuple[str, int]


class AckBatcher:
    """Queued acks and nacks of one consumer, and the task that sends them."""

    def __init__(
        self,
        http: HttpCore | ConsumeRoute,
        session: Session,
        *,
        interval_s: float,
        batch_max: int,
        timeout_s: float,
    ) -> None:
        if not 1 <= batch_max <= REFS_MAX:
            raise ValueError(f"ack batch_max must be in 1..{REFS_MAX}, got {batch_max}")
        self.route = routed(http)
        self.session = session
        self.interval_s = interval_s
        self.batch_max = batch_max
        self.timeout_s = timeout_s
        self.acked = 0  # refs the server took
        self.nacked = 0
        self.failed = 0  # refs given up on (they come again)
        self._acks: list[Ref] = []
        self._nacks: defaultdict[int, list[Ref]] = defaultdict(list)
        self._queued = 0
        self._inflight = 0  # requests under way
        self._slots = asyncio.Semaphore(INFLIGHT_MAX)
        self._wake = asyncio.Event()  # something queued
        self._hurry = asyncio.Event()  # a full batch waits, or a flush asked: no lingering
        self._idle = asyncio.Event()  # nothing queued, nothing in flight
        self._idle.set()

    @property
    def queued(self) -> int:
        """Refs waiting to be sent."""
        return self._queued

    def ack(self, partition: str, offset: int) -> None:
        """Queue an ack."""
        self._acks.append((partition, offset))
        self._queued_one()

    def nack(self, partition: str, offset: int, delay_ms: int) -> None:
        """Queue a nack: redelivery after ``delay_ms``."""
        self._nacks[delay_ms].append((partition, offset))
        self._queued_one()

    def _queued_one(self) -> None:
        self._queued += 1
        if self._queued == 1:
            # The first since the sender took a batch: while any stay queued, nothing sets
            # _idle and the sender does not clear _wake, so later ones need not touch them.
            self._idle.clear()
            self._wake.set()
        if self._queued >= self.batch_max:
            self._hurry.set()

    async def flush(self) -> None:
        """Send what is queued now and wait until every request is answered."""
        self._hurry.set()
        self._wake.set()
        await self._idle.wait()

    async def run(self) -> None:
        """Send batches until cancelled (the requests under way with it)."""
        async with asyncio.TaskGroup() as tg:
            while True:
                if not self._queued:
                    if not self._inflight:
                        self._idle.set()
                    self._hurry.clear()
                    self._wake.clear()
                    await self._wake.wait()
                    continue
                if not self._hurry.is_set():
                    try:
                        async with asyncio.timeout(self.interval_s):
                            await self._hurry.wait()
                    except TimeoutError:
                        pass
                self._hurry.clear()
                await self._slots.acquire()
                acks, self._acks = self._acks, []
                nacks, self._nacks = self._nacks, defaultdict(list)
                self._queued = 0
                self._inflight += 1
                tg.create_task(self._send_queued(acks, nacks))

    async def _send_queued(self, acks: list[Ref], nacks: defaultdict[int, list[Ref]]) -> None:
        try:
            await self._send_batches(acks, nacks)
        finally:
            self._inflight -= 1
            self._slots.release()
            if not self._queued and not self._inflight:
                self._idle.set()

    async def _send_batches(self, acks: list[Ref], nacks: defaultdict[int, list[Ref]]) -> None:
        for start in range(0, len(acks), self.batch_max):
            await self._send("ack", acks[start : start + self.batch_max], 0)
        for delay_ms, refs in nacks.items():
            for start in range(0, len(refs), self.batch_max):
                await self._send("nack", refs[start : start + self.batch_max], delay_ms)

    async def _send(self, kind: str, refs: list[Ref], delay_ms: int) -> None:
        body: dict[str, object] = {"ranges": ranges_of(refs)}
        if kind == "nack":
            body["delay_ms"] = delay_ms
        attach_again = self.session.reattach_enabled
        while True:
            consumer_id = self.session.consumer_id
            http = self.route.http
            try:
                await http.request_retrying(
                    "POST",
                    f"/v1/consumers/{consumer_id}/{kind}",
                    body=body,
                    timeout_s=self.timeout_s,
                    lean=True,  # the kept-alive lean client: a fraction of httpx's CPU
                    retry_if=is_retriable if http is self.route.proxy else retry_on_door,
                )
            except ClientError as exc:
                if self.route.fall_back(exc, http):
                    continue  # the door failed it: through discovery now (same id)
                if exc.code == codes.CONSUMER_NOT_FOUND and attach_again:
                    # The dispatcher forgot the consumer (restart, expiry); acks from any
                    # consumer of the subscription count, so the new one may send them.
                    attach_again = False
                    try:
                        await self.session.reattach(consumer_id)
                        continue
                    except ClientError as again:
                        exc = again
                self.failed += len(refs)
                log.warning("%s of %d messages failed (they come again): %s", kind, len(refs), exc)
                return
            if kind == "ack":
                self.acked += len(refs)
            else:
                self.nacked += len(refs)
            return


def ranges_of(refs: list[Ref]) -> list[dict[str, object]]:
    """``refs`` as the ack body's ``ranges``: runs of consecutive offsets of one partition,
    in their order (acks made in delivery order are a few runs, not an object each)."""
    runs: list[dict[str, object]] = []
    partition: str | None = None
    last = -2
    for name, offset in refs:
        if name == partition and offset == last + 1:
            runs[-1]["last"] = last = offset
            continue
        partition, last = name, offset
        runs.append({"partition": partition, "first": last, "last": last})
    return runs

"""A producer's outbox, with no I/O: the messages it accepted and has not settled, in order
(those queued for a batch, with their wire form and an idempotent producer's stamp, then the
batches in flight), the room they leave under ``max_pending_messages``, and who waits for it
or for them to settle. :class:`~danube.client.producer.AsyncProducer` encodes into it and its
sender task takes batches out of it and posts them.

Per message, :meth:`Outbox.add` costs an entry in four lists and a counter (waiters only when
the outbox is full), and a batch settles its messages in one pass (:func:`succeed`,
:func:`fail`) when its answer comes.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable

from danube.client._sequencing import Stamp
from danube.client.batch import Accumulator
from danube.client.errors import ClosedError
from danube.client.messages import SendResult


class Group:
    """The messages of one :meth:`~danube.client.producer.AsyncProducer.send_many`: one
    future for all of them, resolved when the last is settled (no future, callback or queue
    object per message)."""

    __slots__ = ("error", "future", "left", "results")

    def __init__(self, future: asyncio.Future[list[SendResult]], count: int) -> None:
        self.future = future
        self.results: list[SendResult | None] = [None] * count
        self.left = count
        self.error: BaseException | None = None

    def settle(self, index: int, result: SendResult | None, error: BaseException | None) -> None:
        self.results[index] = result
        if error is not None and self.error is None:
            self.error = error
        self.left -= 1
        if self.left == 0 and not self.future.done():
            if self.error is not None:
                self.future.set_exception(self.error)
            else:
                self.future.set_result(self.results)  # type: ignore[arg-type]


# Who wants a queued message's result: its own future (``send``) or its group and its
# index in the group (``send_many``). Its wire form is kept beside it (``bodies``), not
# with it: a ``send()`` leaves no object but its future and its frame behind (every object
# that outlives a batch's round trip is one more for the cyclic GC's full collections).
Grouped = tuple[Group, int]
Queued = asyncio.Future[SendResult] | Grouped


class Batch:
    """A batch taken from the queue: its messages (who waits for each, its wire form, and
    an idempotent producer's stamp of each), and the sequence number of its first (what
    :meth:`Outbox.flush` waits past)."""

    __slots__ = ("bodies", "first_seq", "items", "stamps")

    def __init__(
        self,
        items: list[Queued],
        bodies: list[bytes],
        stamps: list[Stamp | None],
        first_seq: int,
    ) -> None:
        self.items = items
        self.bodies = bodies
        self.stamps = stamps
        self.first_seq = first_seq


class Outbox:
    """The accepted messages of one producer, from :meth:`add` to their settling."""

    def __init__(
        self,
        queue: Accumulator[Queued],
        *,
        pending_max: int,
        stamped: bool,
        start: Callable[[], None],
    ) -> None:
        """``queue``: the batching decision; ``pending_max``: messages accepted and not
        settled at most; ``stamped``: keep a stamp per message (an idempotent producer);
        ``start``: called once, at the first :meth:`add` (it starts the sender)."""
        self._queue = queue
        self.pending_max = pending_max
        self._stamped = stamped
        self._start: Callable[[], None] | None = start
        self.bodies: list[bytes] = []  # the wire form of each queued message, in order
        # An idempotent producer's stamp of each queued message (None: stamped when its
        # batch is planned; a plain producer keeps this empty).
        self.stamps: list[Stamp | None] = []
        # Accepted and not yet settled (queued or in flight): at most pending_max.
        self.pending = 0
        self._room_waiters: deque[asyncio.Future[None]] = deque()
        self._accepted = 0  # messages ever queued: the next one's sequence number
        self.inflight: set[Batch] = set()
        self._progress: list[asyncio.Future[None]] = []  # flushes waiting for a settle
        self.wake = asyncio.Event()
        self._flushing = False
        self.closing = False  # no more sends: closing, fenced, or the sender ended

    def add(self, body: bytes, target: Queued, stamp: Stamp | None = None) -> None:
        """Queue one message (room for it checked by the caller: :meth:`room_for_one`)."""
        queue = self._queue
        self.pending += 1
        self._accepted += 1
        self.bodies.append(body)
        if self._stamped:
            self.stamps.append(stamp)
        # +1: the comma between two JSON messages (a binary body's bound is as good).
        queue.add(target, len(body) + 1, asyncio.get_running_loop().time())
        if self._start is not None:
            start, self._start = self._start, None
            start()
        if len(queue) == 1 or queue.full():
            self.wake.set()

    def add_many(
        self, bodies: list[bytes], targets: list[Queued], stamps: list[Stamp | None]
    ) -> None:
        """Queue several messages in order, as :meth:`add` each (room for all of them
        checked by the caller); ``stamps`` only for a stamped outbox."""
        if not bodies:
            return
        queue = self._queue
        was_empty = not queue
        self.pending += len(bodies)
        self._accepted += len(bodies)
        self.bodies += bodies
        if self._stamped:
            self.stamps += stamps
        # +1: the comma between two JSON messages (a binary body's bound is as good).
        sizes = [len(body) + 1 for body in bodies]
        queue.add_many(targets, sizes, asyncio.get_running_loop().time())
        if self._start is not None:
            start, self._start = self._start, None
            start()
        if was_empty or queue.full():
            self.wake.set()

    async def room_for_one(self) -> bool:
        """Wait until one more message may be queued; False once the outbox is closing."""
        loop = asyncio.get_running_loop()
        while self.pending >= self.pending_max:
            waiter: asyncio.Future[None] = loop.create_future()
            self._room_waiters.append(waiter)
            await waiter
            if self.closing:
                return False
        return True

    async def flush(self) -> None:
        """Send every queued message now (no lingering) and wait until each is settled."""
        target = self._accepted
        while self._oldest_unsettled() < target:
            self._flushing = True
            self.wake.set()
            waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self._progress.append(waiter)
            await waiter

    def _oldest_unsettled(self) -> int:
        """The sequence number of the oldest message not settled (``_accepted``: none)."""
        oldest = self._accepted - len(self._queue)
        for batch in self.inflight:
            oldest = min(oldest, batch.first_seq)
        return oldest

    def close(self) -> None:
        """No more messages: what is queued goes at once, waiters for room give up."""
        self.closing = True
        self.wake.set()
        self._wake_waiters(self._room_waiters, len(self._room_waiters))

    async def next_batch(self) -> Batch | None:
        """The next batch once it is due (None: closing, with nothing left to send)."""
        queue = self._queue
        loop = asyncio.get_running_loop()
        while True:
            now = loop.time()
            if not queue:
                self._flushing = False
                if self.closing:
                    return None
            # An idle pipe (no batch in flight) sends at once: lingering then only delays
            # the message, company comes while a batch is in flight.
            elif queue.due(now, flush=self._flushing or self.closing or not self.inflight):
                first_seq = self._accepted - len(queue)
                items = queue.take()
                bodies, stamps = self.bodies, self.stamps
                if len(items) == len(bodies):
                    self.bodies, self.stamps = [], []
                else:
                    bodies, stamps = bodies[: len(items)], stamps[: len(items)]
                    del self.bodies[: len(items)], self.stamps[: len(items)]
                batch = Batch(items, bodies, stamps, first_seq)
                self.inflight.add(batch)
                return batch
            self.wake.clear()
            wait_s = queue.wait_s(now)
            if wait_s is None:  # nothing lingers: wait for a message, with no timer
                await self.wake.wait()
                continue
            try:
                async with asyncio.timeout(wait_s):
                    await self.wake.wait()
            except TimeoutError:
                pass

    def done(self, batch: Batch) -> None:
        """A batch settled: its room back; an idle pipe sends what lingers."""
        if batch in self.inflight:  # not already failed by fail_all
            self.inflight.discard(batch)
            self._settled(len(batch.items))
            if not self.inflight and self._queue:
                self.wake.set()  # the pipe is idle: a lingering batch goes now

    def fail_queued(self, error: BaseException) -> None:
        """Nothing more goes out (the producer was fenced): every queued message fails
        with ``error``; the batches in flight settle as they do."""
        self.closing = True
        stranded = self._queue.take_all()
        self.bodies, self.stamps = [], []
        fail(stranded, error)
        self._settled(len(stranded))
        self.wake.set()
        self._wake_waiters(self._room_waiters, len(self._room_waiters))

    def fail_all(self, error: BaseException) -> None:
        """The sender ended: every message not settled, queued or in flight, fails with
        ``error``, and nothing more is taken."""
        self.closing = True
        stranded = self._queue.take_all()
        self.bodies, self.stamps = [], []
        for batch in self.inflight:
            stranded += batch.items
        self.inflight.clear()
        fail(stranded, error)
        self._settled(self.pending)
        self._wake_waiters(self._room_waiters, len(self._room_waiters))

    def _settled(self, count: int) -> None:
        """``count`` messages settled: their room back, and flushes look again."""
        self.pending -= count
        if self._room_waiters:
            self._wake_waiters(self._room_waiters, count)
        progress, self._progress = self._progress, []
        for waiter in progress:
            if not waiter.done():
                waiter.set_result(None)

    @staticmethod
    def _wake_waiters(waiters: deque[asyncio.Future[None]], count: int) -> None:
        while waiters and count > 0:
            waiter = waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                count -= 1


def succeed(items: list[Queued], results: list[SendResult]) -> None:
    """Each message of a batch stored: its future (or group) gets its result."""
    for target, result in zip(items, results, strict=True):
        if isinstance(target, tuple):
            target[0].settle(target[1], result, None)
        elif not target.done():
            target.set_result(result)


def fail(items: list[Queued], error: BaseException) -> None:
    """Messages not stored: each future (or group) gets ``error``."""
    for target in items:
        if isinstance(target, tuple):
            target[0].settle(target[1], None, error)
        elif not target.done():
            target.set_exception(error)


def stopped_by(exc: BaseException, what: str) -> BaseException:
    """What the messages of a batch in flight get when its delivery ends in something other
    than a ClientError (a bug; the sender cancelled): the batch leaves the in-flight set as
    it ends, so the sender's own end would not reach its messages."""
    if isinstance(exc, asyncio.CancelledError):
        return ClosedError(f"{what} stopped")
    return exc

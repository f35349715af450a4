"""The sender of an :class:`~danube.client.producer.AsyncProducer`, as a mix-in: the one task
that turns its outbox into batches and posts them (plain, or an idempotent producer's parts
through :class:`~danube.client._idempotent.IdempotentSender`), and settles each message of a
batch when its answer comes. With ``max_inflight_batches=1`` the sender delivers each batch
itself; with more, each batch in flight is a task of its own.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from danube.client._idempotent import IdempotentSender, Part
from danube.client._outbox import Batch, Outbox, fail, stopped_by, succeed
from danube.client._records import RECORDS_TYPE, json_results, results_of_runs
from danube.client.errors import ClientError, ClosedError
from danube.client.messages import SendResult
from danube.names import TopicName
from danube.tasks import TaskSet

if TYPE_CHECKING:
    from danube.client._http import HttpCore
    from danube.client._options import ProducerOptions
    from danube.client._producer_session import ProducerSession


class Sending:
    """The sender's acts of an :class:`~danube.client.producer.AsyncProducer` (which holds
    the state declared here)."""

    topic: TopicName
    options: ProducerOptions
    _http: HttpCore
    _path: str
    _binary: bool
    _head: bytes
    _params: dict[str, str | int]
    _session: ProducerSession | None
    _sequenced: IdempotentSender | None
    _outbox: Outbox
    _tasks: TaskSet
    _sender: asyncio.Task[None] | None

    def _start_sender(self) -> None:
        """At the first message: the sender task, which turns the outbox into batches."""
        # "log": the owner logs a failure; what it means to the producer is _sender_done's,
        # which must also run when the sender returns or is cancelled.
        self._sender = self._tasks.spawn(self._run(), name="sender", on_failure="log")
        self._sender.add_done_callback(self._sender_done)

    def _sender_done(self, task: asyncio.Task[None]) -> None:
        # The sender ends only on close; a bug (or a cancelled loop) must not leave
        # callers waiting forever on their futures, nor take new messages. (Its owner,
        # self._tasks, logged the bug.)
        error: BaseException = ClosedError(f"producer of {self.topic} stopped")
        if not task.cancelled() and task.exception() is not None:
            error = task.exception() or error
        self._outbox.fail_all(error)

    async def _run(self) -> None:
        inflight = asyncio.Semaphore(self.options.max_inflight_batches)
        one_at_a_time = self.options.max_inflight_batches == 1
        async with asyncio.TaskGroup() as tg:
            while True:
                # Room in flight first: messages keep joining the next batch meanwhile.
                await inflight.acquire()
                batch = await self._outbox.next_batch()
                if batch is None:
                    return
                if self._sequenced is not None:
                    parts = await self._plan(batch, inflight)
                    if parts is None:
                        continue
                    if one_at_a_time:
                        await self._deliver_sequenced(batch, parts, inflight)
                    else:
                        tg.create_task(self._deliver_sequenced(batch, parts, inflight))
                elif one_at_a_time:
                    # The sender would only wait for this batch's slot: it delivers the
                    # batch itself, without a task to start (a loop turn less per batch).
                    await self._deliver(batch, inflight)
                else:
                    tg.create_task(self._deliver(batch, inflight))

    async def _deliver(self, batch: Batch, inflight: asyncio.Semaphore) -> None:
        items = batch.items
        try:
            if self._binary:
                content = b"".join(batch.bodies)
            else:
                content = b"".join((self._head, b",".join(batch.bodies), b"]}"))
            try:
                if self._session is not None and self._session.lost is not None:
                    raise self._session.lost
                answer = await self._http.request_retrying(
                    "POST",
                    self._path,
                    content=content,
                    content_type=RECORDS_TYPE if self._binary else None,
                    params=self._params if self._binary else None,
                    timeout_s=self.options.send_timeout_s,
                    lean=True,
                )
                if self._binary:
                    results = results_of_runs(answer.body, len(items))
                else:
                    results = json_results(answer.body, len(items))
            except ClientError as exc:
                fail(items, exc)
                return
            succeed(items, results)
        except BaseException as exc:
            fail(items, stopped_by(exc, f"producer of {self.topic}"))
            raise
        finally:
            self._done(batch, inflight)

    async def _plan(self, batch: Batch, inflight: asyncio.Semaphore) -> list[Part] | None:
        """The parts of an idempotent producer's batch (in the sender, in batch order: the
        sequences follow the order of sends); None when the batch failed already."""
        assert self._sequenced is not None
        try:
            if self._sequenced.fenced is not None:
                raise self._sequenced.fenced
            await self._sequenced.prepare()
            # Records sent before the epoch and partitions were known, or under an epoch
            # given up since, are stamped now: this batch's first, then the queue's.
            self._sequenced.restamp(batch.bodies, batch.stamps)
            self._sequenced.restamp(self._outbox.bodies, self._outbox.stamps)
            return self._sequenced.plan_stamped(batch.bodies, batch.stamps)
        except ClientError as exc:
            fail(batch.items, exc)
            self._done(batch, inflight)
            return None

    async def _deliver_sequenced(
        self, batch: Batch, parts: list[Part], inflight: asyncio.Semaphore
    ) -> None:
        assert self._sequenced is not None
        items = batch.items
        try:
            if self._session is not None and self._session.lost is not None:
                outcomes: list[tuple[list[int], list[SendResult] | ClientError]] = [
                    ([i for part in parts for i in part.indexes], self._session.lost)
                ]
            else:
                outcomes = await self._sequenced.deliver(parts)
            for indexes, outcome in outcomes:
                chosen = [items[i] for i in indexes]
                if isinstance(outcome, ClientError):
                    fail(chosen, outcome)
                else:
                    succeed(chosen, outcome)
            if self._sequenced.fenced is not None and not self._outbox.closing:
                # Another instance of this name took over: nothing more goes out.
                self._outbox.fail_queued(self._sequenced.fenced)
        except BaseException as exc:
            fail(items, stopped_by(exc, f"producer of {self.topic}"))
            raise
        finally:
            self._done(batch, inflight)

    def _done(self, batch: Batch, inflight: asyncio.Semaphore) -> None:
        """A batch settled: its room back (the outbox's, and a slot in flight)."""
        self._outbox.done(batch)
        inflight.release()

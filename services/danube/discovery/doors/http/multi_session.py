"""One many-topics stream (``GET /v1/namespaces/{ns}/subscriptions/{sub}/stream``, opened by
:mod:`danube.discovery.doors.http.multi_stream`): one subscription over many topics of a namespace,
those created later included (docs/http-api.md, "Consume many topics"; the selection, the
lending of credits and the routing of acks are :mod:`danube.discovery.doors.http.multi_topic`'s,
without I/O).

The state lives as long as the socket: on open the stream attaches a consumer to the
subscription ``sub`` of every matching topic (the dispatcher's ordinary per-topic consumer,
as ``POST …/consumers`` makes), and on close it detaches them all
(:mod:`danube.discovery.doors.http.multi_consumers`). Its tasks, in one
TaskGroup, all ended when the stream ends:

- ``receive`` reads client frames: flow frames grant credits; an ack or nack goes, ref by
  ref, to the consumer of the topic its partition names, before the next frame is read;
- ``refresh`` lists the namespace's topics every ``discovery.stream_topics_refresh_s``
  (jittered) and joins new matches from their first message (``start=earliest``), leaves
  topics that are gone;
- one ``pump`` per joined topic long-polls that topic's dispatcher under credits lent in
  turn by the :class:`Lender`, and queues what came for the writer; a pump whose topic
  went away ends alone, a dispatcher that does not answer is retried with backoff;
- ``write``, the one writer of the socket, through a queue of ``SEND_QUEUE_BATCHES``.
"""

from __future__ import annotations

import asyncio
import logging
import random
from dataclasses import dataclass, field
from typing import Annotated, Literal

import orjson
from fastapi import WebSocket
from pydantic import BaseModel, ConfigDict, Field

from danube.discovery import metrics
from danube.discovery.doors.http.multi_consumers import StreamConsumers
from danube.discovery.doors.http.multi_topic import (
    TOO_MANY_TOPICS,
    Lender,
    Loan,
    TopicSelector,
    runs_by_topic,
)
from danube.discovery.doors.http.state import Services
from danube.discovery.errors import (
    BadRequestError,
    ConflictError,
    error_body,
)
from danube.errors import DanubeError
from danube.meta import TopicName
from danube.security import Permission, Resource, SecurityError
from danube.wire import codes, delivery
from danube.wire.consume.messages import full_names, messages_out
from danube.wire.consume.models import MessageOut
from danube.wire.consume.stream import (
    POLL_WAIT_MS,
    SEND_QUEUE_BATCHES,
    SEND_TIMEOUT_S,
    _StreamEnded,
    first_ended,
    not_in_flight_error,
    parse_client_frame,
)
from danube.wire.consume.stream_protocol import (
    AckFrame,
    FlowFrame,
    NackFrame,
    error_frame,
)

log = logging.getLogger(__name__)

# A topic's dispatcher that did not answer is polled again after this backoff (doubling,
# jittered), the other topics going on meanwhile.
RETRY_BACKOFF_S = (0.2, 5.0)
# Error frames about one topic are told once per (topic, code); at most this many remembered.
TOLD_MAX = 10_000
# Codes that mean a topic's consumer is gone for good: the topic was deleted, or its
# dispatcher forgot the consumer (restarted). The pump ends; the next refresh joins the
# topic again if it still exists (the subscription resumes from its cursor).
_TOPIC_GONE = frozenset(
    {
        codes.CONSUMER_NOT_FOUND,
        codes.SUBSCRIPTION_NOT_FOUND,
        codes.TOPIC_NOT_FOUND,
        "unknown_partition",
    }
)


class MultiStreamParams(BaseModel):
    """The query of a many-topics stream (a WebSocket has no body)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: Annotated[str, Field(min_length=1, max_length=128)]
    type: Literal["exclusive", "shared", "failover", "key_shared"] = "exclusive"
    start: Literal["latest", "earliest"] = "latest"
    topics: Annotated[str | None, Field(min_length=1, max_length=64 * 1024)] = None
    topics_pattern: Annotated[str | None, Field(min_length=1)] = None


@dataclass
class _Joined:
    """A topic the stream reads: its consumer at the dispatcher, and its pump."""

    topic: TopicName
    consumer_id: str
    pump: asyncio.Task[None] | None = None
    loan: asyncio.Future[Loan] | None = field(default=None, repr=False)


class MultiStream:
    """One open many-topics stream: its topics, credits, send queue and tasks."""

    def __init__(
        self,
        websocket: WebSocket,
        services: Services,
        selector: TopicSelector,
        sub: str,
        params: MultiStreamParams,
        principal: str,
        frames: bool,
    ) -> None:
        self.websocket = websocket
        self.services = services
        self.dispatcher = services.dispatcher
        self.selector = selector
        self.namespace = selector.namespace
        self.sub = sub
        self.params = params
        self.principal = principal
        self.frames = frames
        self.lender = Lender()
        self.joined: dict[str, _Joined] = {}
        self._told: set[tuple[str, str]] = set()  # (topic, code) told in an error frame
        self._outbox: asyncio.Queue[list[str | bytes]] = asyncio.Queue(maxsize=SEND_QUEUE_BATCHES)
        self._tg: asyncio.TaskGroup | None = None
        self.consumers = StreamConsumers(self.dispatcher, sub, params.name, params.type)

    # --- joining -----------------------------------------------------------------------

    async def open(self) -> None:
        """Join the topics that match now (``start`` as asked); refused as a whole when
        they are more than the limit, a listed topic may not be read, or an attach fails."""
        if self.selector.listed is not None:
            # Every name of a list, existing yet or not: the client asked for each by name.
            _, refused = self._readable(sorted(self.selector.listed))
            if refused:
                raise refused[0][1]
        # Read afresh, not from the shared listing: a topic created just before the open is
        # the client's to see at once (refreshes share the listing).
        listed = await self.services.catalog.list_topics(self.namespace)
        names, _ = self._readable(self.selector.select(listed))
        limit = self.services.stream_topics_max
        if len(names) > limit:
            raise ConflictError(
                f"topics_pattern matches {len(names)} topics of {self.namespace}, over the"
                f" {limit} one stream may join (discovery.stream_topics_max)",
                code=TOO_MANY_TOPICS,
            )
        failures = await self._join(names, self.params.start)
        if failures:
            raise failures[0][1]

    async def _list_topics(self) -> list[str]:
        """The namespace's topics, as listed for all the instance's streams."""
        lists = self.services.topic_lists
        if lists is None:
            return await self.services.catalog.list_topics(self.namespace)
        return await lists.names(self.namespace)

    def _readable(self, names: list[str]) -> tuple[list[str], list[tuple[str, BaseException]]]:
        """The topics of ``names`` the principal may consume, and the others with the
        refusal (counted and audit-logged as denials only for topics a list names: a
        pattern skips them without a word)."""
        gate = self.services.security
        if not gate.enabled:
            return names, []
        readable: list[str] = []
        refused: list[tuple[str, BaseException]] = []
        action = f"stream /v1/namespaces/{self.namespace}/subscriptions/{self.sub}"
        for name in names:
            topic = TopicName(self.namespace, name)
            if self.selector.listed is None:
                if gate.decision(self.principal, Permission.Consume, Resource.topic(topic)).allowed:
                    readable.append(name)
                continue
            try:
                self.services.admission.consume(self.principal, topic, action=action)
                readable.append(name)
            except SecurityError as exc:
                refused.append((name, exc))
        return readable, refused

    async def _join(
        self, names: list[str], start: Literal["latest", "earliest"]
    ) -> list[tuple[str, BaseException]]:
        """Attach to ``names`` (a few at once: StreamConsumers) and start their pumps once
        running; the failures, by topic."""
        failures: list[tuple[str, BaseException]] = []

        async def attach(name: str) -> None:
            topic = TopicName(self.namespace, name)
            try:
                consumer_id = await self.consumers.attach(topic, start)
            except (DanubeError, TimeoutError) as exc:
                failures.append((name, exc))
                return
            self.joined[name] = _Joined(topic, consumer_id)
            metrics.STREAM_TOPICS_JOINED.inc()
            if self._tg is not None:
                self._start_pump(name)
            log.info("stream %s joined %s", self.sub, topic)

        async with asyncio.TaskGroup() as tg:
            for name in names:
                tg.create_task(attach(name))
        return failures

    async def _refresh(self) -> None:
        interval_s = self.services.stream_topics_refresh_s
        while True:
            await asyncio.sleep(interval_s * random.uniform(0.8, 1.0))
            try:
                listed = set(await self._list_topics())
            except (DanubeError, TimeoutError) as exc:  # the next round looks again
                log.warning("stream %s: listing %s: %s", self.sub, self.namespace, exc)
                continue
            for name in [n for n in self.joined if n not in listed]:
                self._leave(name, "deleted")
            try:
                matching = self.selector.select(listed - set(self.joined))
            except BadRequestError as exc:  # a pattern too slow to match
                raise _StreamEnded(exc) from None
            new, refused = self._readable(matching)
            room = max(self.services.stream_topics_max - len(self.joined), 0)
            limit = self.services.stream_topics_max
            refused += [(name, _over_limit(name, limit)) for name in new[room:]]
            refused += await self._join(new[:room], "earliest")
            for name, error in refused:
                await self._tell(name, error)

    def _leave(self, name: str, why: str) -> None:
        joined = self.joined.pop(name, None)
        if joined is None:
            return
        metrics.STREAM_TOPICS_JOINED.dec()
        log.info("stream %s left %s (%s)", self.sub, joined.topic, why)
        self.lender.withdraw(name)
        if joined.pump is not None and joined.pump is not asyncio.current_task():
            joined.pump.cancel()

    async def _tell(self, name: str, exc: BaseException) -> None:
        """An error frame about one topic, once per topic and code."""
        code = error_body(exc)["error"]["code"]
        if (name, code) in self._told:
            return
        if len(self._told) >= TOLD_MAX:  # a bound on what is remembered: tell again
            self._told.clear()
        self._told.add((name, code))
        await self._outbox.put([error_frame(exc)])

    async def detach_all(self) -> None:
        """Detach every joined consumer, and those of attaches the end cut short once they
        answer (StreamConsumers.detach_all): their unacked messages go to the other
        consumers at once."""
        joined, self.joined = list(self.joined.values()), {}
        metrics.STREAM_TOPICS_JOINED.dec(len(joined))
        await self.consumers.detach_all([(one.topic, one.consumer_id) for one in joined])

    # --- running -----------------------------------------------------------------------

    async def run(self) -> BaseException | None:
        """Serve until the client leaves (None) or an error ends the stream (returned)."""
        ended: _StreamEnded | None = None
        try:
            async with asyncio.TaskGroup() as tg:
                self._tg = tg
                tg.create_task(self._receive(), name="multi-receive")
                tg.create_task(self._write(), name="multi-write")
                tg.create_task(self._refresh(), name="multi-refresh")
                for name in list(self.joined):
                    self._start_pump(name)
        except* _StreamEnded as group:
            ended = first_ended(group)
        finally:
            self._tg = None
        if ended is None:
            raise AssertionError("the tasks of a stream end only by _StreamEnded")
        return ended.error

    def _start_pump(self, name: str) -> None:
        assert self._tg is not None
        joined = self.joined[name]
        joined.pump = self._tg.create_task(self._pump(joined), name=f"multi-pump {name}")

    # --- receive -------------------------------------------------------------------------

    async def _receive(self) -> None:
        while True:
            frame = parse_client_frame(await self.websocket.receive())
            if isinstance(frame, FlowFrame):
                try:
                    self._hand_over(self.lender.grant(frame.credits))
                except DanubeError as exc:
                    raise _StreamEnded(exc) from None
            else:
                await self._acknowledge(frame)

    async def _acknowledge(self, frame: AckFrame | NackFrame) -> None:
        try:
            runs = runs_by_topic(self.namespace, frame)
        except BadRequestError as exc:
            await self._outbox.put([error_frame(exc)])
            return
        for name, ranges in runs.items():
            joined = self.joined.get(name)
            if joined is None:
                error = BadRequestError(
                    f"/{self.namespace}/{name} is not a topic of this stream",
                    code="invalid_partition",
                )
                await self._outbox.put([error_frame(error)])
                continue
            try:
                if isinstance(frame, NackFrame):
                    await self.dispatcher.nack_ranges(
                        joined.topic, self.sub, joined.consumer_id, ranges, delay_ms=frame.delay_ms
                    )
                    continue
                ignored = await self.dispatcher.ack_ranges(
                    joined.topic, self.sub, joined.consumer_id, ranges
                )
                if ignored:
                    error = not_in_flight_error(joined.topic, ignored)
                    await self._outbox.put([error_frame(error)])
            except (DanubeError, TimeoutError) as exc:
                # The stream goes on; messages whose ack failed stay unacked and come again.
                await self._outbox.put([error_frame(exc)])

    # --- pumps ---------------------------------------------------------------------------

    def _hand_over(self, loans: list[Loan]) -> None:
        for loan in loans:
            joined = self.joined.get(loan.topic)
            waiting = None if joined is None else joined.loan
            if waiting is None or waiting.done():  # its topic left meanwhile: give it back
                self._hand_over(self.lender.settle(loan, 0))
                continue
            waiting.set_result(loan)

    async def _borrow(self, joined: _Joined, busy: bool) -> Loan:
        """Wait in line for credits; while none come, tell the dispatcher every
        ``stream_keepalive_s`` that the consumer is alive (no poll is waiting for it)."""
        name = joined.topic.topic
        waiting: asyncio.Future[Loan] = asyncio.get_running_loop().create_future()
        joined.loan = waiting
        self._hand_over(self.lender.ask(name, busy=busy))
        taken = False
        try:
            while True:
                done, _ = await asyncio.wait({waiting}, timeout=self.services.stream_keepalive_s)
                if done:
                    taken = True
                    loan: Loan = waiting.result()
                    return loan
                await self.dispatcher.touch(joined.topic, self.sub, joined.consumer_id)
        finally:
            joined.loan = None
            if not taken:
                if waiting.done() and not waiting.cancelled():  # lent as we stopped waiting
                    self._hand_over(self.lender.settle(waiting.result(), 0))
                else:
                    waiting.cancel()
                    self.lender.withdraw(name)

    async def _pump(self, joined: _Joined) -> None:
        busy = False
        backoff_s = RETRY_BACKOFF_S[0]
        while True:
            try:
                loan = await self._borrow(joined, busy)
                try:
                    batch, used = await self._poll(joined, loan.credits)
                    if batch:  # while the writer is behind, the loan stays out
                        await self._outbox.put(batch)
                        metrics.STREAM_MESSAGES.inc(used)
                except BaseException:
                    # Cancelled with a batch not queued (its topic left, the stream ends):
                    # those messages were not sent, their credits come back.
                    self._hand_over(self.lender.settle(loan, 0))
                    raise
                self._hand_over(self.lender.settle(loan, used))
            except (DanubeError, TimeoutError) as exc:
                if not await self._pump_failed(joined, exc, backoff_s):
                    return
                backoff_s = min(backoff_s * 2, RETRY_BACKOFF_S[1])
                busy = False
                continue
            backoff_s = RETRY_BACKOFF_S[0]
            busy = used > 0

    async def _pump_failed(self, joined: _Joined, exc: BaseException, backoff_s: float) -> bool:
        """What a failed poll (or touch) of ``joined`` does: whether its pump goes on."""
        code = getattr(exc, "code", "timeout")
        if code == "consumer_detached":  # too slow to ack: as one topic's stream, it ends
            raise _StreamEnded(exc) from None
        name = joined.topic.topic
        if code in _TOPIC_GONE:
            self._leave(name, code)
            return False
        log.warning("stream %s: polling %s: %r", self.sub, joined.topic, exc)
        await self._tell(name, exc)
        await asyncio.sleep(backoff_s * random.uniform(0.5, 1.0))
        return True

    async def _poll(self, joined: _Joined, credits: int) -> tuple[list[str | bytes], int]:
        """One poll of ``joined``'s dispatcher for at most ``credits`` messages: the
        frames to send, and how many messages they hold (the credits spent)."""
        topic, consumer_id = joined.topic, joined.consumer_id
        if self.frames:
            polled = await self.dispatcher.poll_frames(
                topic, self.sub, consumer_id, max=credits, wait_ms=POLL_WAIT_MS
            )
            if not polled.size:
                return [], 0
            return [delivery.rename_partitions(polled.body, full_names(topic))], polled.size
        batch = await self.dispatcher.poll(
            topic, self.sub, consumer_id, max=credits, wait_ms=POLL_WAIT_MS
        )
        if not batch.messages:
            return [], 0
        out = await messages_out(self.services.dispatcher, topic, self.sub, consumer_id, batch)
        return [_message_frame(topic, m) for m in out], len(out)

    # --- write ---------------------------------------------------------------------------

    async def _write(self) -> None:
        while True:
            for frame in await self._outbox.get():
                try:
                    async with asyncio.timeout(SEND_TIMEOUT_S):
                        if isinstance(frame, bytes):
                            await self.websocket.send_bytes(frame)
                        else:
                            await self.websocket.send_text(frame)
                except TimeoutError:
                    log.info("many-topics stream: no frame taken for %.0f s", SEND_TIMEOUT_S)
                    raise _StreamEnded(None) from None
                except Exception:  # the socket is gone (disconnected, closed)
                    raise _StreamEnded(None) from None


def _over_limit(name: str, limit: int) -> ConflictError:
    return ConflictError(
        f"topic {name} matches but is not joined: the stream holds {limit} topics"
        " (discovery.stream_topics_max)",
        code=TOO_MANY_TOPICS,
    )


def _message_frame(topic: TopicName, message: MessageOut) -> str:
    """A ``message`` frame of a many-topics stream: the topic, then the long-poll message."""
    body = {"type": "message", "topic": str(topic), **message.model_dump()}
    return orjson.dumps(body).decode()

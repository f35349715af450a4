"""Carrying out a subscription machine's actions at run time (all but Deliver, which only a
poll takes): readers paused, resumed and woken; a slow consumer's session ended; dead
letters produced or dropped and cursors written, one batch at a time under ``_io_lock`` in
the order the machine gave them, so a dead letter is always produced before the cursor
write that moves past it.

danube.dispatcher.runtime.SubscriptionRuntime mixes it in; the state it uses is the
runtime's.
"""

from __future__ import annotations

import asyncio
import logging

from danube.dispatcher import deadletter, metrics, policy_admin, tiers
from danube.dispatcher.delivery import SubscriptionMachine
from danube.dispatcher.durability import AckDurability
from danube.dispatcher.events import (
    Action,
    DeadLetter,
    FlushCursor,
    PauseReading,
    ReadFrom,
    ResumeReading,
    SlowConsumerDetached,
)
from danube.dispatcher.reading import SubscriptionReaders
from danube.dispatcher.sessions import ConsumerSessions
from danube.dispatcher.store import CursorsHeldError, NotOwnerError, SubscriptionStore
from danube.frame import verify_frame
from danube.meta import TopicName
from danube.wire.ingest.client import IngestClient

log = logging.getLogger(__name__)


class ActionRunner:
    """The I/O share of a served subscription (danube.dispatcher.runtime mixes it in; its
    state, ``fail`` and ``_machine`` are the runtime's)."""

    store: SubscriptionStore
    ingest: IngestClient
    dropped: int
    dead_lettered: int
    _partitions: dict[str, TopicName]
    _readers: SubscriptionReaders
    _io_lock: asyncio.Lock
    _durability: AckDurability
    _sessions: ConsumerSessions
    _failure: policy_admin.FailurePolicyAdmin

    # The runtime's own (danube.dispatcher.runtime.SubscriptionRuntime).
    def fail(self, reason: str) -> None:
        raise NotImplementedError

    def _machine(self) -> SubscriptionMachine:
        raise NotImplementedError

    async def run_actions(self, actions: list[Action]) -> None:
        """Carry out the machine's actions (all but Deliver, which only a poll takes)."""
        flushes: dict[TopicName, FlushCursor] = {}
        dead: list[DeadLetter] = []
        for action in actions:
            if isinstance(action, PauseReading | ResumeReading):
                self._readers.set_paused(action.partition, isinstance(action, PauseReading))
            elif isinstance(action, ReadFrom):
                self._readers.wake(action.partition)  # from the cursor's (new) read position
            elif isinstance(action, DeadLetter):
                dead.append(action)
            elif isinstance(action, FlushCursor):
                flushes[self._partitions[action.partition]] = action
            elif isinstance(action, SlowConsumerDetached):
                self._slow_detached(action)
        if flushes and self.store.held:
            # No lease: the cursors stay dirty in memory (one state per partition: bounded)
            # and are written after the reclaim; no wait on the lock a hung write may hold.
            self._keep_dirty(flushes)
            flushes = {}
        if not dead and not flushes:
            return
        async with self._io_lock:
            for letter in dead:
                await self._dead_letter(letter)
            if flushes:
                await self._flush(flushes)

    def _slow_detached(self, action: SlowConsumerDetached) -> None:
        """The machine detached a consumer that never acks: its session ends here too (its
        next request is answered ``consumer_detached``)."""
        metrics.SLOW_DETACHED.inc()
        self._sessions.end(action.consumer_id)
        log.warning(
            "consumer %s (%s) of %s/%s %s",
            action.consumer_id,
            action.name[:200],
            self.store.topic,
            self.store.sub,
            action.reason,
        )

    async def _dead_letter(self, letter: DeadLetter) -> None:
        message = letter.message
        partition = self._partitions[message.partition]
        if letter.dispose == "drop":
            deadletter.drop(partition, message.offset, message.redelivery_count)
            self.dropped += 1
            return
        topic = self._failure.dead_letter_target(partition)
        try:
            await deadletter.send_dead_letter(
                self.store,
                self.ingest,
                partition,
                message.offset,
                # Checked before it is stored again: never a corrupt record into a topic.
                bytes(verify_frame(tiers.frame_of(message.payload).data)),
                topic,
            )
            self.dead_lettered += 1
        except Exception as exc:
            # The cursor already moved past it in memory: stop before a write stores that,
            # so the next owner delivers it again from the stored cursor.
            self.fail(f"dead letter of {partition}@{letter.message.offset} failed: {exc!r}")
            raise

    def _keep_dirty(self, flushes: dict[TopicName, FlushCursor]) -> None:
        machine = self._machine()
        for partition in flushes:
            machine.cursor(partition.topic).mark_dirty()

    async def _flush(self, flushes: dict[TopicName, FlushCursor]) -> None:
        try:
            await self.store.write_cursors({p: f.state for p, f in flushes.items()})
        except NotOwnerError as exc:
            self.fail(str(exc))
            raise
        except CursorsHeldError:  # the lease went while this write waited for the lock
            self._keep_dirty(flushes)
            return
        except Exception as exc:
            metrics.CURSOR_WRITE_ERRORS.inc()
            log.warning("cursor write failed (retried at the next tick): %s", exc)
            self._keep_dirty(flushes)
            return
        metrics.CURSOR_WRITES.inc()
        self._durability.stored(
            (partition.topic, flush.seq) for partition, flush in flushes.items()
        )

"""Carrying out a subscription machine's actions at run time (all but Deliver, which only a
poll takes): readers paused, resumed and woken; a slow consumer's session ended; dead
letters produced or dropped and cursors written, one batch at a time under ``_io_lock`` in
the order the machine gave them, so a dead letter is always produced before the cursor
write that moves past it.

The subscription's runtime (danube.dispatcher.runtime) owns one :class:`ActionRunner`, built
with what it needs: the store and ingest it writes to, the partitions, readers and consumer
sessions the actions name, the machine, where a dead letter goes, and how to fail.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping

from danube.dispatcher import deadletter, metrics, tiers
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
    """The I/O share of one served subscription: ``dropped`` and ``dead_lettered`` count
    the poison messages let go while served here; ``io_lock`` is held by every write (a
    stop's or a delete's too); acks wait on ``durability`` for the write holding them."""

    def __init__(
        self,
        store: SubscriptionStore,
        ingest: IngestClient,
        partitions: Mapping[str, TopicName],
        readers: SubscriptionReaders,
        sessions: ConsumerSessions,
        *,
        machine: Callable[[], SubscriptionMachine],
        dead_letter_target: Callable[[TopicName], TopicName],
        fail: Callable[[str], None],
    ) -> None:
        self.store = store
        self.ingest = ingest
        self._partitions = partitions
        self._readers = readers
        self._sessions = sessions
        self._machine = machine
        self._dead_letter_target = dead_letter_target
        self.fail = fail
        self.io_lock = asyncio.Lock()
        # Acks are answered once the cursor write holding them is stored (group commit).
        self.durability = AckDurability(self.run)
        self.dropped = 0  # poison messages dropped / dead-lettered while served here
        self.dead_lettered = 0

    async def run(self, actions: list[Action]) -> None:
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
        async with self.io_lock:
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
        topic = self._dead_letter_target(partition)
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
        self.durability.stored((partition.topic, flush.seq) for partition, flush in flushes.items())

    async def write_last(self, machine: SubscriptionMachine) -> None:
        """Write every cursor a last time (a clean stop), after any write under way."""
        async with self.io_lock:
            states = {self._partitions[n]: s for n, s in machine.cursor_states().items()}
            try:
                await self.store.write_cursors(states)
            except Exception as exc:
                log.warning(
                    "final cursor write of %s/%s failed: %s", self.store.topic, self.store.sub, exc
                )

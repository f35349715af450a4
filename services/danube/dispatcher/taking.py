"""Which messages a poll takes, the subscription machine's share (danube.dispatcher.delivery
mixes it in; its state and the transitions it uses are the machine's), in this order:

1. the polling consumer's own due redeliveries (already counted in its window), unless
   another consumer can take them (they timed out here: danube.dispatcher.slow);
2. as its window allows, the subscription's other due redeliveries, lowest offset first;
3. then fresh messages, round robin over the partitions;
4. then, for a consumer that holds delayed messages until their time, delayed messages due
   soon, earliest first (danube.dispatcher.delaying, "Handed early").

A consumer that does not hold is never given a message before its delivery time.

Nothing at or past a blocked partition's poison message is taken (danube.dispatcher.poison),
and an expired message is let go instead of taken (danube.dispatcher.expiring).
Key-shared (danube.dispatcher.keyed) takes its keyed messages first, then these.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable

from danube.dispatcher import slow
from danube.dispatcher.entries import ConsumerWindow, Entry, PartitionQueue, Ref
from danube.dispatcher.poison import BlockBook
from danube.dispatcher.redelivery import DeliverySettings

# A poll passes over at most this many of its consumer's own refused redeliveries (left for
# the others) before it stops looking at redeliveries: a poll's work stays bounded.
REFUSED_SKIPPED_MAX = 256


class PollTaking:
    """What a poll takes for its consumer (the machine mixes it in last: the transitions
    declared here are defined before it in the machine's bases)."""

    settings: DeliverySettings
    _entries: dict[Ref, Entry]
    _partitions: dict[str, PartitionQueue]
    _order: list[str]
    _next_partition: int
    _ready: list[tuple[int, str, int]]
    _blocked: BlockBook
    _early: list[tuple[int, int, Entry]]
    _wall_ms: int | None

    # The machine's own (danube.dispatcher.delivery, fair, expiring).
    def _send(self, entry: Entry, consumer: ConsumerWindow, stamp: int) -> Entry:
        raise NotImplementedError

    def _elsewhere(self, consumer: ConsumerWindow) -> Callable[[], bool]:
        raise NotImplementedError

    def _expire(self, entry: Entry) -> bool:
        raise NotImplementedError

    def _is_early(self, entry: Entry) -> bool:
        raise NotImplementedError

    def _take(self, consumer: ConsumerWindow, wanted: int, stamp: int) -> list[Entry]:
        """Up to ``wanted`` messages for ``consumer``, each sent (in flight) with ``stamp``."""
        batch: list[Entry] = []
        # Due redeliveries past a blocked partition's poison message wait (poison.py).
        held_back: list[tuple[list[tuple[int, str, int]], tuple[int, str, int]]] = []
        # Its own due redeliveries first (they are already counted in its window), unless
        # another consumer can take them: they timed out here (slow.py).
        elsewhere = self._elsewhere(consumer)
        while wanted > 0 and consumer.ready and not elsewhere():
            item = heapq.heappop(consumer.ready)
            entry = self._due(item)
            if entry is not None and self._expire(entry):
                continue
            if entry is not None and not self._blocked.passable(entry.partition, entry.offset):
                held_back.append((consumer.ready, item))
            elif entry is not None and entry.consumer_id == consumer.consumer_id:
                batch.append(self._send(entry, consumer, stamp))
                wanted -= 1
        # Then, as its window allows, other due redeliveries (the oldest messages of the
        # subscription), then fresh messages.
        room = min(wanted, slow.window(self.settings, consumer) - len(consumer.held))
        refused = 0  # its own refusals passed over, left for the others (bounded per poll)
        while room > 0 and self._ready and refused < REFUSED_SKIPPED_MAX:
            item = heapq.heappop(self._ready)
            entry = self._due(item)
            if entry is None or self._expire(entry):
                continue
            if not self._blocked.passable(entry.partition, entry.offset):
                held_back.append((self._ready, item))
            elif entry.due_ms and not consumer.holds_delayed and self._before(entry):
                held_back.append((self._ready, item))  # early: this consumer would not hold it
                refused += 1
            elif entry.refused_by == consumer.consumer_id and elsewhere():
                held_back.append((self._ready, item))
                refused += 1
            else:
                batch.append(self._send(entry, consumer, stamp))
                room -= 1
        for heap, item in held_back:
            heapq.heappush(heap, item)
        idle, count = 0, len(self._order)
        while room > 0 and idle < count:
            name = self._order[self._next_partition]
            self._next_partition = (self._next_partition + 1) % count
            fresh = self._partitions[name].fresh
            if not fresh or self._blocked.boundary(name) is not None:
                idle += 1
                continue
            idle = 0
            entry = fresh.popleft()
            if self._expire(entry):
                continue
            batch.append(self._send(entry, consumer, stamp))
            room -= 1
        if room > 0 and self._early and consumer.holds_delayed:
            batch += self._take_early(consumer, room, stamp)
        return batch

    def _before(self, entry: Entry) -> bool:
        """Whether ``entry`` (handed out early once) is still before its delivery time."""
        return self._wall_ms is None or self._wall_ms < entry.due_ms

    def _take_early(self, consumer: ConsumerWindow, room: int, stamp: int) -> list[Entry]:
        """Up to ``room`` early entries for ``consumer`` (one that holds), earliest due
        first, each sent with ``stamp``; those past a blocked partition's poison message
        wait (at most REFUSED_SKIPPED_MAX passed over a poll)."""
        early, taken = self._early, list[Entry]()
        held_back: list[tuple[int, int, Entry]] = []
        while early and len(taken) < room and len(held_back) < REFUSED_SKIPPED_MAX:
            item = heapq.heappop(early)
            entry = item[2]
            if not self._is_early(entry) or self._expire(entry):
                continue
            if not self._blocked.passable(entry.partition, entry.offset):
                held_back.append(item)
                continue
            taken.append(self._send(entry, consumer, stamp))
        for item in held_back:
            heapq.heappush(early, item)
        return taken

    def _due(self, item: tuple[int, str, int]) -> Entry | None:
        """The entry a ready-heap item stands for, None when the item is stale."""
        offset, name, stamp = item
        entry = self._entries.get((name, offset))
        if entry is None or entry.stamp != stamp or entry.state != "ready":
            return None
        return entry

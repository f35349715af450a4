"""The producer's batching decision, with no I/O: which waiting messages go into the next
produce request, and when. Time is passed in, so tests drive it deterministically."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Generic, TypeVar

_T = TypeVar("_T")


@dataclass(frozen=True, slots=True)
class _Entry(Generic[_T]):
    item: _T
    size_bytes: int
    added_s: float


class Accumulator(Generic[_T]):
    """Messages waiting for a batch, oldest first.

    A batch is due when its first message has waited ``linger_s``, or when a full batch
    (``max_messages`` or ``max_bytes``) is waiting, or on a flush. A batch takes messages in
    order while both limits hold, and always at least one (a message larger than
    ``max_bytes`` goes alone: the server is the judge of its size).
    """

    def __init__(self, *, max_messages: int, max_bytes: int, linger_s: float) -> None:
        if max_messages < 1 or max_bytes < 1 or linger_s < 0:
            raise ValueError(f"bad batch limits: {max_messages}, {max_bytes}, {linger_s}")
        self.max_messages = max_messages
        self.max_bytes = max_bytes
        self.linger_s = linger_s
        self._entries: deque[_Entry[_T]] = deque()
        self._bytes = 0

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def size_bytes(self) -> int:
        """Bytes of every waiting message."""
        return self._bytes

    def add(self, item: _T, size_bytes: int, now_s: float) -> None:
        """Queue ``item`` (``size_bytes`` on the wire) at time ``now_s``."""
        self._entries.append(_Entry(item, size_bytes, now_s))
        self._bytes += size_bytes

    def full(self) -> bool:
        """A whole batch is waiting: no reason to linger."""
        return len(self._entries) >= self.max_messages or self._bytes >= self.max_bytes

    def due(self, now_s: float, *, flush: bool = False) -> bool:
        """A batch should be sent now."""
        if not self._entries:
            return False
        return flush or self.full() or now_s >= self._entries[0].added_s + self.linger_s

    def wait_s(self, now_s: float) -> float | None:
        """How long until the oldest message's linger ends (None: nothing waits)."""
        if not self._entries:
            return None
        return max(0.0, self._entries[0].added_s + self.linger_s - now_s)

    def take(self) -> list[_T]:
        """The next batch, oldest first (empty when nothing waits)."""
        taken: list[_T] = []
        size = 0
        while self._entries and len(taken) < self.max_messages:
            entry = self._entries[0]
            if taken and size + entry.size_bytes > self.max_bytes:
                break
            self._entries.popleft()
            taken.append(entry.item)
            size += entry.size_bytes
        self._bytes -= size
        return taken

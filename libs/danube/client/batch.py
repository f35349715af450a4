"""The producer's batching decision, with no I/O: which waiting messages go into the next
produce request, and when. Time is passed in, so tests drive it deterministically."""

from __future__ import annotations

from typing import Generic, TypeVar

_T = TypeVar("_T")


class Accumulator(Generic[_T]):
    """Messages waiting for a batch, oldest first.

    A batch is due when its first message has waited ``linger_s``, or when a full batch
    (``max_messages`` or ``max_bytes``) is waiting, or on a flush. A batch takes messages in
    order while both limits hold, and always at least one (a message larger than
    ``max_bytes`` goes alone: the server is the judge of its size).

    Items, sizes and times are kept in three parallel lists rather than an object per
    message: :meth:`add` is on the producer's per-message path.
    """

    def __init__(self, *, max_messages: int, max_bytes: int, linger_s: float) -> None:
        if max_messages < 1 or max_bytes < 1 or linger_s < 0:
            raise ValueError(f"bad batch limits: {max_messages}, {max_bytes}, {linger_s}")
        self.max_messages = max_messages
        self.max_bytes = max_bytes
        self.linger_s = linger_s
        self._items: list[_T] = []
        self._sizes: list[int] = []
        self._added_s: list[float] = []
        self._bytes = 0

    def __len__(self) -> int:
        return len(self._items)

    def __bool__(self) -> bool:
        return bool(self._items)

    @property
    def size_bytes(self) -> int:
        """Bytes of every waiting message."""
        return self._bytes

    @property
    def items(self) -> list[_T]:
        """The waiting items, oldest first (the list itself: do not change it)."""
        return self._items

    def add(self, item: _T, size_bytes: int, now_s: float) -> None:
        """Queue ``item`` (``size_bytes`` on the wire) at time ``now_s``."""
        self._items.append(item)
        self._sizes.append(size_bytes)
        self._added_s.append(now_s)
        self._bytes += size_bytes

    def add_many(self, items: list[_T], sizes: list[int], now_s: float) -> None:
        """Queue ``items`` in order (each ``sizes[i]`` bytes on the wire) at time ``now_s``."""
        self._items += items
        self._sizes += sizes
        self._added_s += [now_s] * len(items)
        self._bytes += sum(sizes)

    def full(self) -> bool:
        """A whole batch is waiting: no reason to linger."""
        return len(self._items) >= self.max_messages or self._bytes >= self.max_bytes

    def due(self, now_s: float, *, flush: bool = False) -> bool:
        """A batch should be sent now."""
        if not self._items:
            return False
        return flush or self.full() or now_s >= self._added_s[0] + self.linger_s

    def wait_s(self, now_s: float) -> float | None:
        """How long until the oldest message's linger ends (None: nothing waits)."""
        if not self._items:
            return None
        return max(0.0, self._added_s[0] + self.linger_s - now_s)

    def take(self) -> list[_T]:
        """The next batch, oldest first (empty when nothing waits)."""
        sizes = self._sizes
        count = min(len(sizes), self.max_messages)
        size = sum(sizes[:count])
        if size > self.max_bytes:  # rare: count the messages that fit, at least one
            size, fits = sizes[0], 1
            while fits < count and size + sizes[fits] <= self.max_bytes:
                size += sizes[fits]
                fits += 1
            count = fits
        if count == len(sizes):
            taken, self._items = self._items, []
            self._sizes, self._added_s = [], []
        else:
            taken = self._items[:count]
            del self._items[:count], sizes[:count], self._added_s[:count]
        self._bytes -= size
        return taken

    def take_all(self) -> list[_T]:
        """Every waiting item, in order (the producer failing them)."""
        taken, self._items = self._items, []
        self._sizes, self._added_s, self._bytes = [], [], 0
        return taken

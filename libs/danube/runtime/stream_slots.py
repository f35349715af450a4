"""The consumer streams one process holds open (discovery's WebSocket and gRPC streams, an
ingest node's gRPC streams), up to a limit: the next one is refused at once."""

from __future__ import annotations


class StreamSlots:
    """The streams one process holds open, up to ``limit``."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.open = 0

    def try_take(self) -> bool:
        """Take a slot; False when all ``limit`` are taken."""
        if self.open >= self.limit:
            return False
        self.open += 1
        return True

    def give_back(self) -> None:
        """Return a slot taken with :meth:`try_take`."""
        if self.open <= 0:
            raise ValueError("no stream slot was taken")
        self.open -= 1

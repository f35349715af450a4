"""Things held open at once, up to a limit (streams, long polls): taken and given
back in the event loop, so no lock. Pure, no I/O."""

from __future__ import annotations


class Slots:
    """Up to ``limit`` held at once."""

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
            raise ValueError("no slot was taken")
        self.open -= 1

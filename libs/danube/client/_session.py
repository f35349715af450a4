"""What a consumer's background parts (its source and its ack batcher) need of it."""

from __future__ import annotations

from typing import Protocol


class Session(Protocol):
    """The consumer as its source and ack batcher see it: its current id, and attaching
    again when the server forgot it."""

    reattach_enabled: bool

    @property
    def consumer_id(self) -> str: ...

    async def reattach(self, stale_id: str) -> None:
        """Attach again unless another task already replaced ``stale_id``."""

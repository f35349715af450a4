"""The consumer sessions of one served subscription: each consumer by the monotonic time it
was last heard from (an attach, a poll, an ack or a nack), so that one not heard from for
the session timeout is detached (its messages go to the others). Keeps the dispatcher's
consumer gauge. The subscription's runtime owns one :class:`ConsumerSessions`."""

from __future__ import annotations

from danube.dispatcher import metrics


class ConsumerSessions:
    """The consumers attached, by when they were last heard from."""

    def __init__(self) -> None:
        self._last_seen: dict[str, float] = {}

    def __len__(self) -> int:
        return len(self._last_seen)

    def begin(self, consumer_id: str, now_s: float) -> None:
        """``consumer_id`` attached at ``now_s``."""
        self._last_seen[consumer_id] = now_s
        metrics.CONSUMERS.inc()

    def seen(self, consumer_id: str, now_s: float) -> None:
        """``consumer_id`` was heard from at ``now_s`` (one not attached is left out)."""
        if consumer_id in self._last_seen:
            self._last_seen[consumer_id] = now_s

    def end(self, consumer_id: str) -> None:
        """``consumer_id`` detached (or was detached); ending one twice is not an error."""
        if self._last_seen.pop(consumer_id, None) is not None:
            metrics.CONSUMERS.dec()

    def expired(self, now_s: float, timeout_s: float) -> list[str]:
        """The consumers not heard from for more than ``timeout_s`` at ``now_s``."""
        return [c for c, seen_s in self._last_seen.items() if now_s - seen_s > timeout_s]

    def clear(self) -> None:
        """Forget every session (the subscription stops being served here)."""
        metrics.CONSUMERS.dec(len(self._last_seen))
        self._last_seen.clear()

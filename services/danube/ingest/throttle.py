"""The catch-up throttle: a token bucket in bytes/s that a leader's replication fetches
for replicas outside the ISR draw from (docs/replication.md, "Moving partitions"), so that
a new copy catching up never takes the disk and the network from produce.

Pure accounting with time passed in; the handler waits. A fetch is granted what the bucket
holds (at least ``grant_min_bytes`` once it is not in debt, so a frame always fits) and is
charged what it really sent afterwards: the bucket may go into debt by one reply, and the
rate holds over any window longer than one reply's worth.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class TokenBucket:
    """``rate_bytes_s`` bytes per second, at most ``burst_bytes`` saved up."""

    rate_bytes_s: float
    burst_bytes: float
    now_s: float
    grant_min_bytes: int = 64 * 1024
    tokens: float = field(init=False)

    def __post_init__(self) -> None:
        if self.rate_bytes_s <= 0 or self.burst_bytes <= 0:
            raise ValueError("a token bucket needs a positive rate and burst")
        self.tokens = self.burst_bytes

    def _refill(self, now_s: float) -> None:
        elapsed_s = max(0.0, now_s - self.now_s)
        self.tokens = min(self.burst_bytes, self.tokens + elapsed_s * self.rate_bytes_s)
        self.now_s = max(self.now_s, now_s)

    def wait_s(self, now_s: float) -> float:
        """How long until a fetch may go (0: now)."""
        self._refill(now_s)
        return 0.0 if self.tokens > 0 else -self.tokens / self.rate_bytes_s + 0.001

    def grant(self, want_bytes: int, now_s: float) -> int:
        """How many bytes a fetch that may go now should ask for."""
        self._refill(now_s)
        return max(1, min(want_bytes, max(int(self.tokens), self.grant_min_bytes)))

    def charge(self, sent_bytes: int, now_s: float) -> None:
        """A fetch sent ``sent_bytes``."""
        self._refill(now_s)
        self.tokens -= sent_bytes

    def set_rate(self, rate_bytes_s: float) -> None:
        """Change the rate (an operator's new limit); the saved tokens stay within a burst."""
        if rate_bytes_s <= 0:
            raise ValueError("a token bucket needs a positive rate")
        self.rate_bytes_s = rate_bytes_s

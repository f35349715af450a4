"""A partition's publish rate limit: a token bucket per unit (messages, bytes), no I/O.

The leader of a partition is its only writer, so one bucket there holds cluster-wide. Each
bucket refills at ``rate`` per second up to a burst of ``BURST_S`` seconds of it. A produce
is admitted while the bucket is not in debt and then takes everything it carries, which may
put the bucket in debt (a batch larger than the burst still goes through, once); the next
produce waits until the debt is paid. Over any window of T seconds at most
``rate * (T + BURST_S)`` plus one batch is admitted, so the limit holds within a few per
cent over seconds. A new leader starts with a full bucket.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

# The burst a bucket allows: a tenth of a second of its rate (small, so the rate holds
# over short windows; large enough that a steady producer is not refused between refills).
BURST_S = 0.1


@dataclass(slots=True)
class TokenBucket:
    """One unit's bucket; ``now_s`` is any monotonic clock, given by the caller."""

    rate: float
    tokens: float = field(default=-1.0)
    updated_s: float | None = None

    def __post_init__(self) -> None:
        assert self.rate > 0, "a bucket's rate is positive"
        if self.tokens < 0:
            self.tokens = self.capacity

    @property
    def capacity(self) -> float:
        """The most tokens it holds (at least one, so a slow rate admits anything)."""
        return max(self.rate * BURST_S, 1.0)

    def set_rate(self, rate: float, now_s: float) -> None:
        """Change the rate (a policy was updated); tokens above the new burst are dropped."""
        self._refill(now_s)
        self.rate = rate
        self.tokens = min(self.tokens, self.capacity)

    def wait_s(self, now_s: float) -> float:
        """0 when a produce is admitted now, else how long until it is."""
        self._refill(now_s)
        return 0.0 if self.tokens >= 0 else -self.tokens / self.rate

    def take(self, amount: float) -> None:
        """Take ``amount`` tokens (after :meth:`wait_s` said 0): may leave a debt."""
        self.tokens -= amount

    def _refill(self, now_s: float) -> None:
        if self.updated_s is not None and now_s > self.updated_s:
            self.tokens = min(self.capacity, self.tokens + (now_s - self.updated_s) * self.rate)
        self.updated_s = now_s if self.updated_s is None else max(self.updated_s, now_s)


class PublishRate:
    """A partition's rate limits (messages and bytes), set from each produce's headers."""

    def __init__(self) -> None:
        self._msgs: TokenBucket | None = None
        self._bytes: TokenBucket | None = None

    def admit(
        self, msgs_s: int | None, bytes_s: int | None, count: int, size: int, now_s: float
    ) -> int:
        """Admit a produce of ``count`` records of ``size`` bytes under the limits it
        carries: 0, or the milliseconds to wait before retrying (nothing is taken then)."""
        self._msgs = _configured(self._msgs, msgs_s, now_s)
        self._bytes = _configured(self._bytes, bytes_s, now_s)
        buckets = [b for b in (self._msgs, self._bytes) if b is not None]
        wait_s = max((b.wait_s(now_s) for b in buckets), default=0.0)
        if wait_s > 0:
            return max(1, math.ceil(wait_s * 1000))
        if self._msgs is not None:
            self._msgs.take(count)
        if self._bytes is not None:
            self._bytes.take(size)
        return 0


def _configured(bucket: TokenBucket | None, rate: int | None, now_s: float) -> TokenBucket | None:
    if rate is None:
        return None
    if bucket is None:
        bucket = TokenBucket(float(rate))
        bucket.wait_s(now_s)  # starts its clock
        return bucket
    if bucket.rate != rate:
        bucket.set_rate(float(rate), now_s)
    return bucket

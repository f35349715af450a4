"""Capped, jittered exponential backoff and the one retry loop of the SDK."""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar

from danube.client.errors import ApiError, ClientError, TransportError

log = logging.getLogger(__name__)

_T = TypeVar("_T")

# An attempt is never given less than this, even when the deadline is nearly spent: a
# request with a 1 ms timeout could only fail.
MIN_ATTEMPT_S = 0.5


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """Delays between attempts: the ceiling doubles from ``base_s`` to ``cap_s`` and each
    delay is uniform in ``[ceiling/2, ceiling]`` ("equal jitter": clients spread out, yet
    none hammers the server with near-zero waits)."""

    base_s: float = 0.05
    cap_s: float = 2.0

    def __post_init__(self) -> None:
        if not 0 < self.base_s <= self.cap_s <= 60:
            raise ValueError(f"need 0 < base_s <= cap_s <= 60, got {self.base_s}, {self.cap_s}")

    def delay_s(self, attempt: int, rng: Callable[[], float] = random.random) -> float:
        """The delay before retry number ``attempt`` (0-based)."""
        ceiling = min(self.cap_s, self.base_s * 2.0 ** min(attempt, 32))
        return ceiling / 2 + rng() * ceiling / 2


def is_retriable(exc: ClientError) -> bool:
    """The default test: the error says the same request may succeed later."""
    return exc.retriable


async def retrying(
    call: Callable[[float], Awaitable[_T]],
    *,
    timeout_s: float,
    policy: RetryPolicy,
    what: str,
    retry_if: Callable[[ClientError], bool] = is_retriable,
) -> _T:
    """Run ``call(attempt_timeout_s)`` until it returns, retrying the errors ``retry_if``
    accepts with ``policy``'s backoff, all within ``timeout_s``. Each attempt gets the time
    left (at least :data:`MIN_ATTEMPT_S`). Once a retry would end past the deadline, the last
    error is raised: it says more than "timed out" (``no_owner``, connection refused...)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    attempt = 0
    answered: ApiError | None = None  # the server's last answer, if it gave one
    while True:
        try:
            return await call(max(MIN_ATTEMPT_S, deadline - loop.time()))
        except ClientError as exc:
            if not retry_if(exc):
                raise
            if isinstance(exc, ApiError):
                answered = exc
            delay = policy.delay_s(attempt)
            if loop.time() + delay >= deadline:
                if answered is not None and isinstance(exc, TransportError):
                    # The deadline cut the last attempt short: what the server said before
                    # (partition_unavailable...) tells more than "no answer within 0.5 s".
                    raise answered from exc
                raise
            log.debug("%s: retry %d in %.3f s after %r", what, attempt + 1, delay, exc)
        await asyncio.sleep(delay)
        attempt += 1

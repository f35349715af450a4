"""Capped, jittered exponential backoff for the retry loops of this package."""

from __future__ import annotations

import random
from collections.abc import Callable


def backoff_s(
    attempt: int,
    *,
    base_s: float,
    cap_s: float,
    rng: Callable[[], float] = random.random,
) -> float:
    """The delay before retry number ``attempt`` (0-based): "equal jitter".

    The ceiling doubles from ``base_s`` up to ``cap_s``; the delay is uniform in
    ``[ceiling/2, ceiling]``, so retries from many processes spread out (the jitter)
    but never hammer the server with near-zero waits (the half that is kept).
    """
    # The exponent is clamped: an int ``2**attempt`` past 1 023 overflows a float (a retry
    # loop that counts its failures for hours would die of it), and past 2**32 times the
    # base every cap is reached anyway.
    ceiling = min(cap_s, base_s * 2.0 ** max(0, min(attempt, 32)))
    return ceiling / 2 + rng() * ceiling / 2

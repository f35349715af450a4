"""What the delayed-delivery e2e tests share: producing delayed and plain messages over HTTP
JSON, and sampling the test process's own loop (a stall of the observer is not the
dispatcher's lateness)."""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Collection, Container
from typing import Any

import httpx

Due = dict[tuple[str, int], int | None]  # (partition, offset) -> due ms; None: not delayed


def now_ms() -> int:
    return int(time.time() * 1000)


async def produce_delayed(
    http: httpx.AsyncClient,
    topic: str,
    started_ms: int,
    *,
    delayed: int,
    plain: int,
    delay_s: tuple[float, float],
    batch: int = 500,
    seed: int = 34,
) -> Due:
    """Produce ``delayed`` messages due at random over ``delay_s`` after ``started_ms``
    (``deliver_at_ms``) and ``plain`` ones not delayed, shuffled, ``batch`` a request, to
    ``/v1/topics/default/{topic}``; each one's delivery time by where it was stored."""
    rng = random.Random(seed)
    wanted: list[int | None] = [
        started_ms + int(rng.uniform(*delay_s) * 1000) for _ in range(delayed)
    ]
    wanted += [None] * plain
    rng.shuffle(wanted)
    due: Due = {}
    for first in range(0, len(wanted), batch):
        chunk = wanted[first : first + batch]
        messages: list[dict[str, Any]] = [
            {"payload": f"m{first + i}"} | ({} if at is None else {"deliver_at_ms": at})
            for i, at in enumerate(chunk)
        ]
        response = await http.post(
            f"/v1/topics/default/{topic}/messages", json={"messages": messages}
        )
        assert response.status_code == 200, response.text
        for at, result in zip(chunk, response.json()["results"], strict=True):
            due[(result["partition"], result["offset"])] = at
    return due


async def sample_loop(lags: list[tuple[int, int]], done: asyncio.Event) -> None:
    """Until ``done``: every 10 ms, (wall ms, how late this process's loop ran it)."""
    while not done.is_set():
        before = time.monotonic()
        await asyncio.sleep(0.01)
        lags.append((now_ms(), int((time.monotonic() - before - 0.01) * 1000)))


async def until_arrived(
    wanted: Collection[tuple[str, int]],
    arrived: Container[tuple[str, int]],
    consumer: asyncio.Task[None],
    *,
    timeout_s: float = 60.0,
) -> None:
    """Wait until every ref of ``wanted`` has ``arrived`` (the consumer task fills it in),
    failing at once with the consumer task's own failure should it end first."""
    async with asyncio.timeout(timeout_s):
        while not all(ref in arrived for ref in wanted):
            await asyncio.sleep(0.05)
            assert not consumer.done(), consumer

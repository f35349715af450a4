"""Refresh-ahead for the produce path's caches (topic configs, namespace policies, schema
bindings and versions).

Each entry is kept ``cache_ttl_s`` (``discovery.topic_cache_ttl_s``). Without this, the
first produce after an entry expired read etcd inline: one produce of every topic in use
waited an etcd round trip (1-4 ms on a loaded machine, per cache) every TTL, which is the
tail of one-message-at-a-time latency (docs/performance.md). With it, a hit on an entry
past half its TTL is served from the cache and starts a read of the same key in the
background that replaces the entry when it answers, so a topic in use never waits on etcd.

Nothing is served older than it was before: an entry nobody asks for still expires at its
TTL and the next ask reads etcd inline. A refresh replaces only the entry it was started for
(a newer one, written by an update on this instance meanwhile, stays).

Bounds: one refresh per key; at most ``max_running`` at once (past that an entry due is left
to expire and be read inline, as without this). A refresh that fails leaves the entry to
expire (the inline read then falls back as it does when etcd fails).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Hashable
from typing import TypeVar

from danube.errors import DanubeError
from danube.meta import MetaError
from danube.tasks import TaskSet

log = logging.getLogger(__name__)

REFRESHES_MAX = 64
REFRESH_FAILURES_MAX = 4096  # keys remembered as failed (bounded: cleared when full)
STALE_WAIT_S = 1.0
"""How long the read of an expired entry is waited for while the stale entry could answer.
Past it (etcd stalled, or slower than this), the stale entry answers, as it does when etcd
fails: a produce whose caches all expired during an etcd stall otherwise waited out etcd's
request deadline once per cache (topic, namespace, schema binding: 3 times 5 s)."""

T = TypeVar("T")


class StaleError(DanubeError):
    """The read of an expired entry failed or did not answer within ``STALE_WAIT_S``: the
    caller answers from its stale entry (never reaches a client)."""

    code = "stale"


async def read_or_stale(
    read: Callable[[], Awaitable[T]], *, has_stale: bool, stalled: bool = False
) -> T:
    """``read()``. With ``has_stale``, at most ``STALE_WAIT_S``, and :class:`StaleError` when
    it fails with a MetaError or takes longer; without, as long as ``read()`` takes.
    ``stalled`` (the entry's background refresh failed, or has not answered by the time the
    entry expired: etcd is away): :class:`StaleError` at once, without reading: a produce
    in an etcd outage does not wait ``STALE_WAIT_S`` per cache each time an entry expires."""
    if not has_stale:
        return await read()
    if stalled:
        raise StaleError("etcd does not answer this entry's refresh")
    try:
        async with asyncio.timeout(STALE_WAIT_S):
            return await read()
    except (MetaError, TimeoutError) as exc:
        raise StaleError(f"read of an expired entry: {exc!r}") from exc


def refresh_at(now_s: float, ttl_s: float) -> float:
    """When an entry read at ``now_s`` becomes due for a refresh: half its TTL on."""
    return now_s + ttl_s / 2


class Refresher:
    """Background refreshes of cache entries, owned here: :meth:`close` ends them."""

    def __init__(self, *, max_running: int = REFRESHES_MAX) -> None:
        self.max_running = max_running
        self._running: dict[Hashable, asyncio.Task[None]] = {}
        self._failed: set[Hashable] = set()  # keys whose last refresh failed
        self._closed = False
        self._tasks = TaskSet("cache refreshes")

    @property
    def running(self) -> int:
        """How many refreshes are in flight."""
        return len(self._running)

    def start(self, key: Hashable, refresh: Callable[[], Awaitable[None]]) -> bool:
        """Run ``refresh()`` in the background unless one runs for ``key`` already, too many
        run, or this is closed; whether it was started."""
        if self._closed or key in self._running or len(self._running) >= self.max_running:
            return False
        # _run keeps what a failed refresh means (the entry is read inline when it expires).
        task = self._tasks.spawn(self._run(key, refresh), name=f"refresh {key}", on_failure="log")
        self._running[key] = task
        task.add_done_callback(lambda _: self._running.pop(key, None))
        return True

    def stalled(self, key: Hashable) -> bool:
        """Whether ``key``'s refresh is still running or its last one failed: asked once the
        entry expired (its refresh began half a TTL before), this means etcd is away."""
        return key in self._running or key in self._failed

    async def _run(self, key: Hashable, refresh: Callable[[], Awaitable[None]]) -> None:
        try:
            await refresh()
        except Exception as exc:  # the entry expires and is read inline: nothing lost
            log.debug("cache refresh failed: %r", exc)
            if len(self._failed) >= REFRESH_FAILURES_MAX:
                self._failed.clear()  # rare: the next expiries read inline again
            self._failed.add(key)
        else:
            self._failed.discard(key)

    async def close(self) -> None:
        """Cancel the refreshes in flight and take no more."""
        self._closed = True
        await self._tasks.close()

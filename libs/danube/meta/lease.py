"""An etcd lease kept alive by a task it owns, and the signal that it is lost.

A lease is the mesh's liveness: node registrations, ownership claims and leadership keys are
attached to one, and etcd deletes them when it expires. The holder must stop acting as owner
*before* etcd hands the role to someone else, so the lease is declared **lost** on the
holder's side no later than etcd can expire it:

- every refresh is timed from the moment its request was *sent*; etcd restarts the TTL when
  it *receives* it, which is later, so the local deadline ``sent + TTL`` never outlives
  the server's;
- a refresh answered with TTL <= 0 means etcd already dropped the lease (expired or revoked);
- when the local deadline passes without a successful refresh, the lease is lost even if
  etcd might still hold it: it may no longer be relied on.

Losing it sets :attr:`Lease.lost` and calls the ``on_lost`` callbacks once; services fence
themselves on that (stop writing, drop subscriptions) and win the role again with a new lease.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Protocol

from danube.meta.backoff import backoff_s
from danube.meta.errors import LeaseLostError, MetaError
from danube.tasks import TaskSet

log = logging.getLogger(__name__)

LostCallback = Callable[["Lease"], object]
# Refresh three times per TTL: two refreshes may fail before the lease is in danger.
REFRESHES_PER_TTL = 3
_RETRY_BASE_S = 0.05
_MIN_REQUEST_TIMEOUT_S = 0.05


class LeaseBackend(Protocol):
    """What a lease needs from the store (tests plug in a fake here)."""

    async def keep_alive_once(self, lease_id: int, *, timeout_s: float | None = None) -> float:
        """Refresh the lease within ``timeout_s``; return the TTL in seconds etcd restarted
        (<= 0: it is gone)."""
        ...

    async def revoke_lease(self, lease_id: int) -> bool:
        """Revoke the lease; ``False`` if etcd no longer had it."""
        ...


class Lease:
    """A granted lease and its keep-alive task. Made by :meth:`MetaStore.grant_lease`."""

    def __init__(
        self,
        backend: LeaseBackend,
        lease_id: int,
        ttl_s: float,
        *,
        granted_at: float,
        request_timeout_s: float,
        refresh_timeout_ttl_share: float = 1.0,
    ) -> None:
        self.id = lease_id
        self.ttl_s = ttl_s
        self.lost = asyncio.Event()
        self.lost_reason: str | None = None
        self.refreshes = 0  # successful refreshes so far
        self._backend = backend
        self._request_timeout_s = request_timeout_s
        # A refresh waits at most this share of the TTL: a third when the backend can move
        # to another etcd member (a silent member then costs one refresh, and the next
        # still lands within the TTL); the whole time left with one member, where trying
        # again elsewhere is not possible and a slow answer is better than none.
        self._refresh_timeout_s = ttl_s * refresh_timeout_ttl_share
        self._expires_at = granted_at + ttl_s  # loop.time() by which it is surely expired
        self._refreshing = True
        self._callbacks: list[LostCallback] = []
        self._task: asyncio.Task[None] | None = None
        # A keep-alive that fails (a bug) must not leave the lease looking alive: it is lost.
        self._tasks = TaskSet(
            f"lease {lease_id:x}",
            on_failure=lambda _, exc: self._mark_lost(f"keep-alive failed: {exc!r}"),
        )

    def __repr__(self) -> str:
        state = "alive" if self.alive else f"lost ({self.lost_reason})"
        return f"Lease(id={self.id}, ttl_s={self.ttl_s}, {state})"

    def start(self) -> None:
        """Start the keep-alive task (the store does this when it grants the lease)."""
        if self._task is None and not self.lost.is_set():
            self._task = self._tasks.spawn(
                self._refresh_until_lost(), name=f"lease-keepalive-{self.id:x}"
            )

    @property
    def alive(self) -> bool:
        """Not lost, and its local deadline not passed: the holder may still act on what
        the lease protects. The deadline matters after a pause (SIGSTOP, a stalled VM):
        the process resumes past it before its keep-alive task has run to notice, and
        whatever runs first (a produce) must already see the lease gone."""
        if self.lost.is_set():
            return False
        try:
            now = asyncio.get_running_loop().time()
        except RuntimeError:  # no loop (a test, a sync caller): what the task last saw
            return True
        return now < self._expires_at

    def remaining_s(self) -> float:
        """Seconds until the local deadline (0 once lost): how long acting on it stays safe."""
        if self.lost.is_set():
            return 0.0
        return max(0.0, self._expires_at - asyncio.get_running_loop().time())

    def ensure_alive(self) -> None:
        """Raise :class:`LeaseLostError` if the lease is lost: call before a fenced write."""
        if not self.alive:
            reason = self.lost_reason or "its local deadline passed"
            raise LeaseLostError(f"lease {self.id:x} is lost: {reason}", lease_id=self.id)

    def on_lost(self, callback: LostCallback) -> None:
        """Call ``callback(lease)`` once when the lease is lost (at once if it already is)."""
        if self.lost.is_set():
            self._run_callback(callback)
        else:
            self._callbacks.append(callback)

    async def stop_keepalive(self) -> None:
        """Stop refreshing: the lease runs out after its TTL and is then declared lost."""
        self._refreshing = False
        if self._task is not None:
            # Restart the task so a refresh in flight cannot extend the deadline.
            await self._cancel_task()
            self._task = self._tasks.spawn(
                self._refresh_until_lost(), name=f"lease-expiry-{self.id:x}"
            )

    async def revoke(self) -> bool:
        """Revoke the lease now (its keys vanish at once) and mark it lost.

        Best effort: ``False`` if etcd could not confirm (unreachable, or the lease was
        already gone); a lease that could not be revoked still expires after its TTL.
        """
        self._mark_lost("revoked")
        await self._cancel_task()
        try:
            return await self._backend.revoke_lease(self.id)
        except MetaError as exc:
            log.warning("could not revoke lease %x: %s", self.id, exc)
            return False

    async def _cancel_task(self) -> None:
        task, self._task = self._task, None
        await self._tasks.cancel(task, timeout_s=self._request_timeout_s)

    async def _refresh_until_lost(self) -> None:
        loop = asyncio.get_running_loop()
        failures = 0
        next_refresh = self._expires_at - self.ttl_s * (1 - 1 / REFRESHES_PER_TTL)
        while True:
            now = loop.time()
            if now >= self._expires_at:
                self._mark_lost("no successful refresh within the TTL")
                return
            wake_at = min(next_refresh, self._expires_at) if self._refreshing else self._expires_at
            if wake_at > now:
                await asyncio.sleep(wake_at - now)
                continue
            sent = loop.time()
            budget_s = max(
                _MIN_REQUEST_TIMEOUT_S,
                min(self._request_timeout_s, self._refresh_timeout_s, self._expires_at - sent),
            )
            try:
                # The backend's own deadline is the one that tells it its member is silent
                # (danube.meta.client fails over); this one only bounds a backend without.
                async with asyncio.timeout(budget_s + _MIN_REQUEST_TIMEOUT_S):
                    ttl_s = await self._backend.keep_alive_once(self.id, timeout_s=budget_s)
            except (MetaError, TimeoutError) as exc:
                failures += 1
                delay_s = backoff_s(failures - 1, base_s=_RETRY_BASE_S, cap_s=self.ttl_s / 6)
                log.warning("lease %x refresh failed (%d in a row): %s", self.id, failures, exc)
                next_refresh = loop.time() + delay_s
                continue
            if ttl_s <= 0:
                self._mark_lost("etcd no longer holds the lease (expired or revoked)")
                return
            failures = 0
            self.refreshes += 1
            self._expires_at = sent + ttl_s
            next_refresh = sent + ttl_s / REFRESHES_PER_TTL

    def _mark_lost(self, reason: str) -> None:
        if self.lost.is_set():
            return
        self.lost_reason = reason
        self.lost.set()
        if reason != "revoked":
            log.warning("lease %x lost: %s", self.id, reason)
        callbacks, self._callbacks = self._callbacks, []
        for callback in callbacks:
            self._run_callback(callback)

    def _run_callback(self, callback: LostCallback) -> None:
        try:
            callback(self)
        except Exception:  # one bad callback must not keep the others from fencing
            log.exception("lease %x: on_lost callback %r failed", self.id, callback)

"""Leader election on one etcd key: ``elections/<name>`` holds the leader's candidate id.

A candidate creates the key, attached to its lease, in a create-if-absent transaction. The
winner is leader until the key goes (resigned, lease expired or revoked); the others watch
the key from the revision they saw and try again when it is deleted, so no deletion is
missed and no polling is needed.

A term ends (:attr:`Leadership.lost` is set) as soon as the leader learns it may no longer
be leader: its lease is lost (see :mod:`.lease`), or the key was deleted or re-created by
someone else. The leader's work must watch ``lost`` and stop. ``Leadership.revision`` (the
key's create revision) grows with every term, so it serves as a fencing token.

:func:`run_as_leader` is the loop every singleton role runs (the cluster controller,
retention): campaign, lead while elected, resign, campaign again, until told to stop.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

from danube.aio import until_stopped, wait_any
from danube.meta.backoff import backoff_s
from danube.meta.errors import LeaseLostError, MetaError, WatchCompactedError, WatchError
from danube.meta.keys import election_key
from danube.meta.lease import Lease
from danube.meta.store import MetaStore
from danube.tasks import TaskSet

log = logging.getLogger(__name__)

# Consecutive failed attempts (etcd unreachable...) before campaign() gives up and raises.
CAMPAIGN_FAILURES_MAX = 10
CANDIDATE_ID_CHARS_MAX = 256
_RETRY_BASE_S = 0.1
_RETRY_CAP_S = 5.0
# The election key changes only when a term begins or ends, so a few events of slack do.
_WATCH_BUFFER_EVENTS = 16


class Leadership:
    """One term of leadership, from winning the key to losing or resigning it."""

    def __init__(self, name: str, candidate_id: str, lease: Lease, revision: int) -> None:
        self.name = name
        self.candidate_id = candidate_id
        self.lease = lease
        self.revision = revision  # create revision of the election key: the fencing token
        self.lost = asyncio.Event()
        self.lost_reason: str | None = None

    def __repr__(self) -> str:
        state = "active" if self.active else f"ended ({self.lost_reason})"
        return f"Leadership({self.name!r}, {self.candidate_id!r}, rev={self.revision}, {state})"

    @property
    def active(self) -> bool:
        """Still leader, as far as this process can know."""
        return not self.lost.is_set()

    def _end(self, reason: str) -> None:
        if not self.lost.is_set():
            self.lost_reason = reason
            self.lost.set()


class Election:
    """Campaign for, hold and resign the leadership of ``name`` as ``candidate_id``."""

    def __init__(self, store: MetaStore, name: str, candidate_id: str, ttl_s: int = 10) -> None:
        if not 0 < len(candidate_id) <= CANDIDATE_ID_CHARS_MAX:
            raise ValueError(f"candidate_id must have 1..{CANDIDATE_ID_CHARS_MAX} characters")
        self.key = election_key(name)
        self.name = name
        self.candidate_id = candidate_id
        self.ttl_s = ttl_s
        self._store = store
        self._lease: Lease | None = None
        self._term: Leadership | None = None
        self._monitor: asyncio.Task[None] | None = None
        # A term whose monitor died would never learn that its key went: it ends instead.
        self._tasks = TaskSet(f"election {name}", on_failure=self._monitor_failed)
        self._campaigning = asyncio.Lock()
        self._no_term = asyncio.Event()
        self._no_term.set()

    @property
    def is_leader(self) -> bool:
        """Whether this candidate holds an active term."""
        return self._term is not None and self._term.active

    @property
    def lease(self) -> Lease | None:
        """The lease this candidate campaigns (or leads) with, while it has one."""
        return self._lease

    @property
    def term(self) -> Leadership | None:
        """The current or last term, if this candidate ever won."""
        return self._term

    @property
    def lost(self) -> asyncio.Event:
        """Set when the current term ends (already set when this candidate is not leader)."""
        return self._no_term if self._term is None else self._term.lost

    async def leader(self) -> str | None:
        """The candidate id of the current leader, or ``None`` if there is none."""
        kv = await self._store.get(self.key)
        return None if kv is None else kv.value.decode("utf-8", errors="replace")

    @asynccontextmanager
    async def leadership(self) -> AsyncIterator[Leadership]:
        """``async with election.leadership() as term:`` campaign, lead, then resign."""
        term = await self.campaign()
        try:
            yield term
        finally:
            await self.resign()

    async def campaign(self) -> Leadership:
        """Wait until this candidate is leader; return the term.

        Transient failures are retried with jittered backoff; after
        ``CAMPAIGN_FAILURES_MAX`` in a row the last error is raised. Bound the wait with
        ``asyncio.timeout``; a cancelled campaign releases its lease.
        """
        async with self._campaigning:  # concurrent callers share one campaign's outcome
            if self._term is not None and self._term.active:
                return self._term
            await self._stop_monitor()  # reap the last term's monitor
            return await self._campaign()

    async def _campaign(self) -> Leadership:
        failures = 0
        try:
            while True:
                try:
                    term = await self._attempt()
                except (LeaseLostError, WatchError) as exc:
                    error: MetaError = exc  # a lost lease or broken watch: just try again
                except MetaError as exc:
                    if not exc.retriable:
                        raise
                    error = exc
                else:
                    if term is not None:
                        return term
                    failures = 0
                    continue
                failures += 1
                if failures >= CAMPAIGN_FAILURES_MAX:
                    raise error
                log.warning("election %s: campaign attempt failed: %s", self.name, error)
                await asyncio.sleep(
                    backoff_s(failures - 1, base_s=_RETRY_BASE_S, cap_s=_RETRY_CAP_S)
                )
        except BaseException:
            if not self.is_leader:
                await self._drop_lease()
            raise

    async def resign(self) -> None:
        """End the term (if any): delete the key if it is still ours, revoke the lease."""
        await self._stop_monitor()
        term = self._term
        if term is not None and term.active:
            term._end("resigned")
            try:
                await (
                    self._store.txn()
                    .if_create_revision(self.key, "==", term.revision)
                    .then_delete(self.key)
                    .commit()
                )
            except MetaError as exc:  # the lease revoke below removes the key as well
                log.warning("election %s: could not delete the key on resign: %s", self.name, exc)
        await self._drop_lease()

    async def _attempt(self) -> Leadership | None:
        """One try: win the key, or wait until its holder is gone and return ``None``."""
        lease = self._lease
        if lease is None or not lease.alive:
            lease = self._lease = await self._store.grant_lease(self.ttl_s)
        result = await (
            self._store.txn()
            .if_absent(self.key)
            .then_put(self.key, self.candidate_id.encode(), lease=lease)
            .else_get(self.key)
            .commit()
        )
        if result.succeeded:
            return self._begin_term(lease, result.revision)
        holder = result.first_kv()
        if holder is None:
            return None  # deleted since the compare: try again at once
        if holder.lease_id == lease.id:
            # An earlier attempt landed but its reply was lost: the key is ours already.
            return self._begin_term(lease, holder.create_revision)
        async with self._store.watch_key(
            self.key, start_revision=holder.mod_revision + 1, buffer_size=_WATCH_BUFFER_EVENTS
        ) as events:
            async for event in events:
                if event.kind == "delete":
                    return None
        return None

    def _begin_term(self, lease: Lease, revision: int) -> Leadership:
        term = Leadership(self.name, self.candidate_id, lease, revision)
        self._term = term
        lease.on_lost(lambda _: self._end_term(term, "lease lost"))
        self._monitor = self._tasks.spawn(
            self._watch_term(term), name=f"election-{self.name}-monitor"
        )
        log.info("election %s: %s is leader (revision %d)", self.name, self.candidate_id, revision)
        return term

    def _end_term(self, term: Leadership, reason: str) -> None:
        if not term.active:
            return
        log.warning("election %s: leadership of %s ended: %s", self.name, term.candidate_id, reason)
        term._end(reason)
        monitor = self._monitor
        if term is self._term and monitor is not None and monitor is not asyncio.current_task():
            monitor.cancel()  # it may be blocked on a watch that will never fire now

    def _monitor_failed(self, task_name: str, exc: BaseException) -> None:
        if self._term is not None:
            self._end_term(self._term, f"{task_name} failed: {exc!r}")

    async def _watch_term(self, term: Leadership) -> None:
        """End the term when the key is deleted or replaced. If etcd stays unreachable, the
        lease's keep-alive ends the term within one TTL, which bounds this retry loop."""
        revision: int | None = term.revision + 1
        failures = 0
        while term.active:
            try:
                if revision is None:  # events were compacted away: read the state instead
                    kv = await self._store.get(self.key)
                    if kv is None or kv.create_revision != term.revision:
                        self._end_term(term, "the election key was deleted or replaced")
                        return
                    revision = kv.mod_revision + 1
                async with self._store.watch_key(
                    self.key, start_revision=revision, buffer_size=_WATCH_BUFFER_EVENTS
                ) as events:
                    async for event in events:
                        revision = event.mod_revision + 1
                        if event.kind == "delete" or event.create_revision != term.revision:
                            self._end_term(term, "the election key was deleted or replaced")
                            return
            except WatchCompactedError:
                revision = None
            except MetaError as exc:
                failures += 1
                log.warning("election %s: watching the key failed: %s", self.name, exc)
                delay_s = backoff_s(failures - 1, base_s=_RETRY_BASE_S, cap_s=_RETRY_CAP_S)
                await asyncio.sleep(delay_s)

    async def _stop_monitor(self) -> None:
        task, self._monitor = self._monitor, None
        await self._tasks.cancel(task, timeout_s=self._store.request_timeout_s)

    async def _drop_lease(self) -> None:
        lease, self._lease = self._lease, None
        if lease is not None:
            await lease.revoke()


async def run_as_leader(
    election: Election,
    lead: Callable[[Leadership, asyncio.Event], Awaitable[None]],
    stop: asyncio.Event,
    *,
    cancel_timeout_s: float,
    role: str,
    base_s: float = _RETRY_BASE_S,
    cap_s: float = _RETRY_CAP_S,
) -> None:
    """Campaign, ``await lead(term, stop)`` while elected, resign, campaign again; return once
    ``stop`` is set. ``lead`` returns when the term ends (or ``stop`` is set).

    A ``MetaError`` from the campaign or from ``lead`` (etcd unreachable) is logged and retried
    with capped, jittered backoff; a campaign that wins resets the count. Every term is
    resigned when left, so another candidate takes over at once instead of after the lease
    TTL. ``cancel_timeout_s``: how long a campaign cancelled by ``stop`` may take to let go
    of its lease. ``role`` names the loop in logs.
    """
    failures = 0
    while not stop.is_set():
        try:
            term = await until_stopped(election.campaign(), stop, cancel_timeout_s=cancel_timeout_s)
            if term is None:
                return
            failures = 0
            await lead(term, stop)
        except MetaError as exc:
            failures += 1
            log.warning("%s %s: %s (attempt %d)", role, election.candidate_id, exc, failures)
            await wait_any(stop, timeout_s=backoff_s(failures - 1, base_s=base_s, cap_s=cap_s))
        finally:
            await election.resign()

"""Lease keep-alive against a fake backend: refresh cadence, retries, and when a lease is lost."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable

import pytest

from danube.meta.backoff import backoff_s
from danube.meta.errors import LeaseLostError, MetaUnavailableError
from danube.meta.lease import Lease

pytestmark = pytest.mark.unit

TTL_S = 0.5
LEASE_ID = 0xABC


class FakeBackend:
    """etcd's lease service, scripted: answers with ``ttl_s``, fails, hangs, or has no lease."""

    def __init__(self) -> None:
        self.ttl_s = TTL_S
        self.failures_left = 0  # the next N refreshes raise MetaUnavailableError
        self.fail_forever = False
        self.hang = False
        self.hangs_left = 0  # the next N refreshes hang until their deadline
        self.timeouts: list[float | None] = []  # the deadline each refresh was given
        self.gone = False
        self.failed = 0
        self.calls: list[float] = []  # loop time of each refresh request
        self.revoked: list[int] = []

    async def keep_alive_once(self, lease_id: int, *, timeout_s: float | None = None) -> float:
        assert lease_id == LEASE_ID
        self.calls.append(asyncio.get_running_loop().time())
        self.timeouts.append(timeout_s)
        if self.hangs_left > 0:  # a silent etcd member: the client's own deadline ends it
            self.hangs_left -= 1
            await asyncio.sleep(timeout_s or 3600)
            raise MetaUnavailableError("etcd keep-alive: no answer within the deadline")
        if self.hang:
            await asyncio.sleep(3600)
        if self.fail_forever or self.failures_left > 0:
            self.failures_left -= 1
            self.failed += 1
            raise MetaUnavailableError("etcd keep-alive: connection refused")
        return 0 if self.gone else self.ttl_s

    async def revoke_lease(self, lease_id: int) -> bool:
        self.revoked.append(lease_id)
        return True


@pytest.fixture
async def backend() -> FakeBackend:
    return FakeBackend()


@pytest.fixture
async def lease(backend: FakeBackend) -> AsyncIterator[Lease]:
    granted = Lease(
        backend,
        LEASE_ID,
        TTL_S,
        granted_at=asyncio.get_running_loop().time(),
        request_timeout_s=0.1,
    )
    granted.start()
    yield granted
    await granted.revoke()


async def _until(condition: Callable[[], bool], timeout_s: float = 3.0) -> None:
    async with asyncio.timeout(timeout_s):
        while True:
            if condition():
                return
            await asyncio.sleep(0.01)


async def test_keepalive_refreshes_about_three_times_per_ttl(
    lease: Lease, backend: FakeBackend
) -> None:
    await _until(lambda: lease.refreshes >= 7)  # past two full TTLs
    assert lease.alive
    gaps = [b - a for a, b in zip(backend.calls, backend.calls[1:], strict=False)]
    assert all(TTL_S / 3 * 0.8 <= gap <= TTL_S / 3 * 1.5 for gap in gaps), gaps
    assert lease.remaining_s() > TTL_S / 2


async def test_lease_gone_on_the_server_is_lost_at_once(lease: Lease, backend: FakeBackend) -> None:
    seen: list[Lease] = []
    lease.on_lost(seen.append)
    backend.gone = True
    await asyncio.wait_for(lease.lost.wait(), TTL_S)
    assert seen == [lease]
    assert lease.lost_reason is not None
    assert "no longer holds" in lease.lost_reason
    assert not lease.alive
    assert lease.remaining_s() == 0.0


async def test_refresh_failures_for_a_whole_ttl_lose_the_lease_by_the_local_deadline(
    lease: Lease, backend: FakeBackend
) -> None:
    await _until(lambda: lease.refreshes >= 1)
    last_ok_sent = backend.calls[-1]
    backend.fail_forever = True
    await asyncio.wait_for(lease.lost.wait(), 2 * TTL_S)
    lost_at = asyncio.get_running_loop().time()
    # Lost no later than the server could expire it (TTL after the last successful send)...
    assert lost_at <= last_ok_sent + TTL_S + 0.05
    assert lease.lost_reason == "no successful refresh within the TTL"
    # ...after retrying several times in between, not giving up at the first failure.
    assert len(backend.calls) - backend.calls.index(last_ok_sent) - 1 >= 3


async def test_transient_failures_are_retried_and_the_lease_survives(
    lease: Lease, backend: FakeBackend
) -> None:
    backend.failures_left = 2
    await _until(lambda: lease.refreshes >= 5)
    assert lease.alive
    assert backend.failed == 2  # both failures happened, then refreshes resumed


async def test_a_refresh_that_never_answers_is_bounded_by_the_deadline(
    lease: Lease, backend: FakeBackend
) -> None:
    backend.hang = True
    await asyncio.wait_for(lease.lost.wait(), 2 * TTL_S)
    assert lease.lost_reason == "no successful refresh within the TTL"
    assert len(backend.calls) >= 2  # each hung request timed out and was retried


async def test_stop_keepalive_lets_the_lease_run_out(lease: Lease, backend: FakeBackend) -> None:
    await lease.stop_keepalive()
    calls = len(backend.calls)
    await asyncio.wait_for(lease.lost.wait(), 2 * TTL_S)
    assert len(backend.calls) == calls
    assert lease.lost_reason == "no successful refresh within the TTL"


async def test_revoke_marks_lost_and_revokes_on_the_server(
    lease: Lease, backend: FakeBackend
) -> None:
    seen: list[Lease] = []
    lease.on_lost(seen.append)
    assert await lease.revoke()
    assert backend.revoked == [LEASE_ID]
    assert seen == [lease]
    assert lease.lost_reason == "revoked"
    with pytest.raises(LeaseLostError) as info:
        lease.ensure_alive()
    assert info.value.lease_id == LEASE_ID
    assert info.value.code == "lease_lost"
    assert not info.value.retriable


async def test_callbacks_run_once_even_if_one_fails_and_late_ones_run_at_once(
    lease: Lease, backend: FakeBackend
) -> None:
    seen: list[str] = []

    def broken(_: Lease) -> None:
        raise RuntimeError("boom")

    lease.on_lost(broken)
    lease.on_lost(lambda _: seen.append("first"))
    backend.gone = True
    await asyncio.wait_for(lease.lost.wait(), TTL_S)
    lease.on_lost(lambda _: seen.append("late"))
    await lease.revoke()
    assert seen == ["first", "late"]


def test_backoff_doubles_up_to_the_cap_with_half_jitter() -> None:
    low = [backoff_s(n, base_s=0.1, cap_s=1.0, rng=lambda: 0.0) for n in range(6)]
    high = [backoff_s(n, base_s=0.1, cap_s=1.0, rng=lambda: 1.0) for n in range(6)]
    assert low == pytest.approx([0.05, 0.1, 0.2, 0.4, 0.5, 0.5])
    assert high == pytest.approx([0.1, 0.2, 0.4, 0.8, 1.0, 1.0])
    assert backoff_s(10_000, base_s=0.1, cap_s=2.0) <= 2.0


async def test_a_lease_past_its_local_deadline_is_not_alive_before_its_task_notices(
    backend: FakeBackend,
) -> None:
    """A process paused past the TTL (SIGSTOP) resumes before its keep-alive task runs:
    whatever runs first must already see the lease gone, not act on it once more."""
    paused = Lease(
        backend,
        LEASE_ID,
        TTL_S,
        granted_at=asyncio.get_running_loop().time() - TTL_S - 0.01,  # as if just resumed
        request_timeout_s=0.1,
    )  # its keep-alive task never ran: nothing has set `lost`
    assert not paused.lost.is_set()
    assert not paused.alive
    with pytest.raises(LeaseLostError):
        paused.ensure_alive()


async def test_with_several_members_a_silent_one_costs_one_refresh_not_the_lease(
    backend: FakeBackend,
) -> None:
    """A third of the TTL per refresh: the one that hangs on a silent member ends in time
    for the next (on another member) to land before the lease's deadline."""
    lease = Lease(
        backend,
        LEASE_ID,
        TTL_S,
        granted_at=asyncio.get_running_loop().time(),
        request_timeout_s=5.0,
        refresh_timeout_ttl_share=1 / 3,
    )
    lease.start()
    try:
        await _until(lambda: lease.refreshes >= 1)
        backend.hangs_left = 1
        before = lease.refreshes
        await _until(lambda: lease.refreshes >= before + 3)
        assert lease.alive
        assert backend.hangs_left == 0
        assert all(t is not None and t <= TTL_S / 3 + 1e-9 for t in backend.timeouts)
    finally:
        await lease.revoke()


async def test_with_one_member_a_refresh_may_wait_for_the_time_left(backend: FakeBackend) -> None:
    lease = Lease(
        backend,
        LEASE_ID,
        TTL_S,
        granted_at=asyncio.get_running_loop().time(),
        request_timeout_s=5.0,
    )
    lease.start()
    try:
        await _until(lambda: lease.refreshes >= 1)
        first = backend.timeouts[0]
        assert first is not None
        assert first > TTL_S / 2  # the whole time left: nowhere else to try
    finally:
        await lease.revoke()

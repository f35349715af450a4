"""WAL backpressure: the pending-bytes budget admits in FIFO order, hands on cancelled room, fails
waiters on close."""

from __future__ import annotations

import asyncio

import pytest

from danube.ingest.wal import WalClosedError
from danube.ingest.wal.admission import Admission

pytestmark = pytest.mark.unit


async def settle() -> None:
    """Let every ready callback and task step run."""
    for _ in range(5):
        await asyncio.sleep(0)


async def test_acquire_is_immediate_while_the_budget_has_room() -> None:
    admission = Admission(100)
    await admission.acquire(60)
    await admission.acquire(40)
    assert (admission.pending_bytes, admission.waiting) == (100, 0)


async def test_waiters_are_admitted_in_arrival_order_as_room_frees() -> None:
    admission = Admission(100)
    await admission.acquire(90)
    order: list[str] = []

    async def take(name: str, nbytes: int) -> None:
        await admission.acquire(nbytes)
        order.append(name)

    big = asyncio.create_task(take("big", 80))
    await settle()
    small = asyncio.create_task(take("small", 5))  # would fit now, but waits behind "big"
    await settle()
    assert (order, admission.waiting, admission.pending_bytes) == ([], 2, 90)
    admission.release(90)
    await asyncio.gather(big, small)
    assert order == ["big", "small"]
    assert admission.pending_bytes == 85


async def test_room_granted_to_a_cancelled_waiter_is_handed_on() -> None:
    admission = Admission(100)
    await admission.acquire(100)
    first = asyncio.create_task(admission.acquire(100))
    await settle()
    second = asyncio.create_task(admission.acquire(100))
    await settle()
    admission.release(100)  # grants "first"'s future...
    first.cancel()  # ...but its task is cancelled before it runs
    await asyncio.gather(first, return_exceptions=True)
    await asyncio.wait_for(second, timeout=1)
    assert admission.pending_bytes == 100


async def test_a_cancelled_head_waiter_does_not_block_the_others() -> None:
    admission = Admission(100)
    await admission.acquire(50)
    head = asyncio.create_task(admission.acquire(100))
    await settle()
    behind = asyncio.create_task(admission.acquire(50))
    await settle()
    head.cancel()
    await asyncio.gather(head, return_exceptions=True)
    await asyncio.wait_for(behind, timeout=1)
    assert admission.pending_bytes == 100


async def test_fail_waiters_wakes_everyone_with_the_error() -> None:
    admission = Admission(10)
    await admission.acquire(10)
    waiters = [asyncio.create_task(admission.acquire(5)) for _ in range(3)]
    await settle()
    admission.fail_waiters(WalClosedError)
    results = await asyncio.gather(*waiters, return_exceptions=True)
    assert all(isinstance(result, WalClosedError) for result in results)
    assert (admission.pending_bytes, admission.waiting) == (10, 0)

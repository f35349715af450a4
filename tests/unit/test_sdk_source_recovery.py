"""A consumer's source recovering without a server: a consumer the server forgot is
attached again; an exclusive subscription still held by its old attachment (the server's
views differ while the subscription is taken over) sends it back to polling with the old
id instead of ending the source."""

from __future__ import annotations

import asyncio

import pytest

from danube.client._inbox import Inbox
from danube.client._sources import Recovery, run_source
from danube.client.errors import ApiError, ClientError, ConflictError, NotFoundError
from danube.client.retry import RetryPolicy

pytestmark = pytest.mark.unit


class FakeSession:
    reattach_enabled = True

    def __init__(self, refusals: list[ApiError]) -> None:
        self.consumer_id = "old"
        self.refusals = refusals
        self.attaches = 0

    async def reattach(self, stale_id: str) -> None:
        self.attaches += 1
        if self.refusals:
            raise self.refusals.pop(0)
        self.consumer_id = "new"


async def test_a_subscription_still_held_by_the_old_attachment_is_polled_again() -> None:
    polls: list[str] = []
    answers: list[ClientError | None] = [
        NotFoundError("gone", code="consumer_not_found", status=404),  # -> attach again: refused
        None,  # the old id polled again: the server knows it after all
        NotFoundError("gone", code="consumer_not_found", status=404),  # really gone now
        None,  # polled with the new id
    ]
    done = asyncio.Event()

    async def fill(consumer_id: str) -> None:
        polls.append(consumer_id)
        if not answers:
            done.set()
            await asyncio.sleep(3600)
        answer = answers.pop(0)
        if answer is not None:
            raise answer

    taken = ConflictError("taken by consumer 'old'", code="subscription_taken", status=409)
    session = FakeSession([taken])
    inbox = Inbox(10)
    recovery = Recovery(RetryPolicy(base_s=0.001, cap_s=0.002), 5.0, reattach=True)
    source = asyncio.create_task(run_source(fill, session, inbox, recovery))
    await asyncio.wait_for(done.wait(), 5)
    source.cancel()
    assert inbox.failure is None
    assert session.attaches == 2
    assert polls == ["old", "old", "old", "new", "new"]


async def test_a_subscription_taken_by_another_consumer_ends_the_source_in_time() -> None:
    async def fill(consumer_id: str) -> None:
        raise NotFoundError("gone", code="consumer_not_found", status=404)

    session = FakeSession(
        [ConflictError("taken", code="subscription_taken", status=409) for _ in range(10_000)]
    )
    inbox = Inbox(10)
    recovery = Recovery(RetryPolicy(base_s=0.001, cap_s=0.002), 0.2, reattach=True)
    await asyncio.wait_for(run_source(fill, session, inbox, recovery), 5)
    assert isinstance(inbox.failure, ClientError)
    assert inbox.failure.code in ("subscription_taken", "consumer_not_found")

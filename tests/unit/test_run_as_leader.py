"""The campaign-lead-resign loop of singleton roles (danube.meta.election.run_as_leader) on a
fake election: etcd failures back off and retry, every term is resigned, ``stop`` ends it."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import pytest

from danube.meta import Leadership, MetaUnavailableError, run_as_leader

pytestmark = pytest.mark.unit


class FakeElection:
    """Campaigns raise what ``script`` says in turn (None: win), then win a new term each time."""

    candidate_id = "c1"

    def __init__(self, script: list[Exception | None]) -> None:
        self.script = list(script)
        self.campaigns = 0
        self.resigns = 0

    async def campaign(self) -> Leadership:
        self.campaigns += 1
        step = self.script.pop(0) if self.script else None
        if step is not None:
            raise step
        return Leadership("role", self.candidate_id, None, self.campaigns)  # type: ignore[arg-type]

    async def resign(self) -> None:
        self.resigns += 1


async def _run(
    election: FakeElection,
    lead: Callable[[Leadership, asyncio.Event], Awaitable[None]],
    stop: asyncio.Event,
) -> None:
    async with asyncio.timeout(5):
        await run_as_leader(
            election,  # type: ignore[arg-type]
            lead,
            stop,
            cancel_timeout_s=1.0,
            role="test",
            base_s=0.001,
            cap_s=0.002,
        )


async def test_it_retries_failures_leads_each_term_and_resigns_each_time() -> None:
    down = MetaUnavailableError("etcd down")
    election = FakeElection([down, down, None, None])
    stop = asyncio.Event()
    terms: list[int] = []

    async def lead(term: Leadership, stop_: asyncio.Event) -> None:
        terms.append(term.revision)
        if len(terms) == 2:
            stop_.set()
        if len(terms) == 1:
            raise MetaUnavailableError("lost etcd while leading")  # backs off, campaigns again

    await _run(election, lead, stop)
    assert terms == [3, 4]  # campaigns 1 and 2 failed
    assert election.campaigns == 4
    assert election.resigns == 4  # after every try, won or not


async def test_a_stop_during_the_campaign_returns_and_resigns() -> None:
    class Waiting(FakeElection):
        async def campaign(self) -> Leadership:
            self.campaigns += 1
            await asyncio.Event().wait()  # nobody ever wins
            raise AssertionError("unreachable")

    election = Waiting([])
    stop = asyncio.Event()
    asyncio.get_running_loop().call_later(0.05, stop.set)

    async def lead(term: Leadership, stop_: asyncio.Event) -> None:
        raise AssertionError("never elected")

    await _run(election, lead, stop)
    assert (election.campaigns, election.resigns) == (1, 1)

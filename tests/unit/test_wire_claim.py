"""The claim-and-retry loop of the bus clients (danube.wire.claim), on a fake transport and a
fake clock: when it claims, what it retries, what it raises and when it stops."""

from __future__ import annotations

import pytest

from danube.bus import BusTimeoutError, NoRespondersError, RemoteError
from danube.wire.claim import RETRY_CAP_S, RETRY_MOVED_CAP_S, request_with_claim

pytestmark = pytest.mark.unit


class FakeClock:
    """Time moves only when the loop sleeps."""

    def __init__(self) -> None:
        self.now_s = 100.0
        self.sleeps: list[float] = []

    def __call__(self) -> float:
        return self.now_s

    async def sleep(self, delay_s: float) -> None:
        self.sleeps.append(delay_s)
        self.now_s += delay_s


class FakeServer:
    """Answers each attempt from a script: an exception to raise or a value to return; the
    claims it was asked for, with their deadlines."""

    def __init__(self, script: list[object], claim_reply: RemoteError | None = None) -> None:
        self.script = list(script)
        self.deadlines: list[float] = []
        self.claims: list[float] = []
        self.claim_reply = claim_reply

    async def attempt(self, deadline: float) -> object:
        self.deadlines.append(deadline)
        step = self.script.pop(0) if self.script else NoRespondersError("s")
        if isinstance(step, Exception):
            raise step
        return step

    async def claim(self, deadline: float) -> RemoteError | None:
        self.claims.append(deadline)
        return self.claim_reply


def _remote(code: str, *, retriable: bool = True) -> RemoteError:
    return RemoteError(code=code, message=code, retriable=retriable)


async def _call(server: FakeServer, clock: FakeClock, **kwargs: object) -> object:
    return await request_with_claim(
        server.attempt,
        server.claim,
        timeout_s=2.0,
        timeout_message="op: no answer in 2.0s",
        clock=clock,
        sleep=clock.sleep,
        **kwargs,  # type: ignore[arg-type]
    )


async def test_no_responders_claims_then_retries_until_an_answer() -> None:
    clock, server = FakeClock(), FakeServer([NoRespondersError("s"), _remote("not_owner"), 7])
    assert await _call(server, clock) == 7
    assert server.claims == [102.0]  # one claim, for the no-responders only
    assert server.deadlines == [102.0] * 3  # one deadline for the whole call
    assert len(clock.sleeps) == 1  # after the refusal; not after the claim that answered
    assert all(0.01 <= delay_s <= 0.5 for delay_s in clock.sleeps)


async def test_the_first_claim_that_answered_is_retried_at_once_later_ones_back_off() -> None:
    # A first produce: no owner, the claim places one and answers; the retry finds it
    # without a pause (a pause there was the tail of a light load).
    clock, server = FakeClock(), FakeServer([NoRespondersError("s"), 7])
    assert await _call(server, clock) == 7
    assert server.claims == [102.0]
    assert clock.sleeps == []
    # The owner still does not answer after its claim: every later claim backs off.
    clock, server = FakeClock(), FakeServer([NoRespondersError("s")] * 4 + [7])
    assert await _call(server, clock) == 7
    assert len(server.claims) == 4
    assert len(clock.sleeps) == 3
    assert all(0.01 <= delay_s <= 0.5 for delay_s in clock.sleeps)


async def test_a_refusal_that_is_not_retriable_is_raised_at_once() -> None:
    clock, server = FakeClock(), FakeServer([_remote("bad_request", retriable=False), 7])
    with pytest.raises(RemoteError) as raised:
        await _call(server, clock)
    assert raised.value.code == "bad_request"
    assert clock.sleeps == []
    assert server.claims == []


async def test_give_up_codes_are_raised_at_once_from_the_server_and_from_the_claim() -> None:
    clock, server = FakeClock(), FakeServer([_remote("disk_full"), 7])
    with pytest.raises(RemoteError, match="disk_full"):
        await _call(server, clock, give_up_codes={"disk_full"})
    assert clock.sleeps == []
    unavailable = _remote("partition_unavailable")
    clock, server = FakeClock(), FakeServer([NoRespondersError("s"), 7], unavailable)
    with pytest.raises(RemoteError) as raised:
        await _call(server, clock, give_up_codes={"partition_unavailable"})
    assert raised.value is unavailable
    assert server.claims == [102.0]


async def test_at_the_deadline_the_last_reason_beats_a_timeout() -> None:
    clock, server = FakeClock(), FakeServer([_remote("not_owner")] * 1000)
    with pytest.raises(RemoteError, match="not_owner"):
        await _call(server, clock)
    assert clock.now_s <= 102.0  # never slept past the deadline
    assert max(clock.sleeps) <= 0.5  # capped
    # The claim's reason is kept too, though not a give-up code.
    clock, server = FakeClock(), FakeServer([], _remote("not_enough_replicas"))
    with pytest.raises(RemoteError, match="not_enough_replicas"):
        await _call(server, clock)


async def test_a_retry_cut_by_the_deadline_raises_the_refusal_not_the_timeout() -> None:
    # The last retry started with milliseconds left and its reply did not make it: the
    # caller learns why it was refused (a CI run saw a bare 0.003 s timeout instead).
    clock, server = (
        FakeClock(),
        FakeServer([_remote("position_unavailable"), BusTimeoutError("s", 0.003)]),
    )
    with pytest.raises(RemoteError, match="position_unavailable"):
        await _call(server, clock)
    clock, server = (
        FakeClock(),
        FakeServer([BusTimeoutError("s", 0.003)]),
    )  # no reason kept: the timeout
    with pytest.raises(BusTimeoutError):
        await _call(server, clock)


async def test_a_retry_after_no_responders_cut_by_the_deadline_raises_timeout() -> None:
    # Nobody owns the work; the last retry went out with a millisecond left and the
    # no-responders answer missed it (a loaded CI run): still "nobody answered in time",
    # not a bare bus timeout (the producer answers the first no_owner, the second timeout).
    clock, server = FakeClock(), FakeServer([NoRespondersError("s"), BusTimeoutError("s", 0.001)])
    with pytest.raises(TimeoutError, match=r"op: no answer in 2\.0s") as raised:
        await _call(server, clock)
    assert not isinstance(raised.value, BusTimeoutError)


async def test_with_no_reason_the_deadline_raises_timeout() -> None:
    clock, server = FakeClock(), FakeServer([])  # nobody ever answers
    with pytest.raises(TimeoutError, match=r"op: no answer in 2\.0s"):
        await _call(server, clock)
    assert len(server.claims) == len(server.deadlines) > 3
    assert clock.now_s <= 102.0


async def test_other_errors_propagate_unretried() -> None:
    clock, server = FakeClock(), FakeServer([ValueError("bad reply"), 7])
    with pytest.raises(ValueError, match="bad reply"):
        await _call(server, clock)
    assert server.deadlines == [102.0]


async def test_an_owner_handing_over_is_asked_again_at_most_every_moved_cap() -> None:
    # A live move: the old leader refuses (not_owner) until the new one serves. Retries of a
    # move stay dense; nobody owning the work at all (no responders) backs off to the full cap.
    clock, server = FakeClock(), FakeServer([_remote("not_owner")] * 12 + [7])
    assert await _call(server, clock) == 7
    assert len(clock.sleeps) == 12
    assert max(clock.sleeps) <= RETRY_MOVED_CAP_S
    assert sum(clock.sleeps) < 12 * RETRY_MOVED_CAP_S
    clock, server = FakeClock(), FakeServer([_remote("unowned")] * 5 + [7])
    assert await _call(server, clock) == 7
    assert max(clock.sleeps) > RETRY_MOVED_CAP_S  # doubled past it toward RETRY_CAP_S
    assert max(clock.sleeps) <= RETRY_CAP_S

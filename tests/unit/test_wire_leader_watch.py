"""Waiting for a request while watching its leader (danube.wire.leader_watch), on a fake
clock, a fake request and scripted probes; and IngestClient.produce_body abandoning a produce
whose leader moved and sending it again (the claim loop on a fake bus)."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping

import pytest

from danube.bus import BusTimeoutError, NoRespondersError, RemoteError, Reply, TopicName
from danube.bus.subjects import Subjects
from danube.wire.ingest import control, protocol
from danube.wire.ingest.client import IngestClient
from danube.wire.leader_watch import (
    CLOCKS_MS,
    Leader,
    LeaderMovedError,
    await_watching_leader,
    moved,
)

pytestmark = pytest.mark.unit

A1, A2, B2, NONE = Leader("a", 1), Leader("a", 2), Leader("b", 2), Leader(None)


class FakeTime:
    """A clock that moves only when the loop sleeps; a request answered at a set time."""

    def __init__(self) -> None:
        self.now_s = 100.0
        self.sleeps: list[float] = []
        self.answers: list[tuple[float, asyncio.Future[str], str]] = []

    def __call__(self) -> float:
        return self.now_s

    async def sleep(self, delay_s: float) -> None:
        self.sleeps.append(delay_s)
        await asyncio.sleep(0)  # the request's answer, if due, settles first
        self.now_s += delay_s
        for at_s, future, value in self.answers:
            if at_s <= self.now_s and not future.done():
                future.set_result(value)

    def request(self, answer_at_s: float | None = None, value: str = "ok") -> asyncio.Future[str]:
        """A request answered ``answer_at_s`` after now (never when None)."""
        future: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        if answer_at_s is not None:
            self.answers.append((self.now_s + answer_at_s, future, value))
        return future


class Probes:
    """Answers probes from a script (a Leader, None for nobody answered, or an error to
    raise); the last entry repeats. Records when each was asked."""

    def __init__(self, time: FakeTime, script: list[Leader | RemoteError | None]) -> None:
        self.time = time
        self.script = script
        self.asked_at: list[float] = []
        self.asked = asyncio.Event()

    async def __call__(self, deadline: float) -> Leader | None:
        self.asked_at.append(self.time.now_s - 100.0)
        self.asked.set()
        step = self.script.pop(0) if len(self.script) > 1 else self.script[0]
        if isinstance(step, RemoteError):
            raise step
        return step


async def _watch(
    time: FakeTime, request: asyncio.Future[str], probes: Probes, timeout_s: float = 10.0
) -> str:
    return await await_watching_leader(
        request,
        probes,
        deadline=time.now_s + timeout_s,
        subject="p.produce",
        give_up_codes={"partition_unavailable"},
        clock=time,
        sleep=time.sleep,
    )


def test_a_move_is_another_node_another_epoch_or_no_leader() -> None:
    assert moved(None, A1) == (A1, False)  # the first answer is remembered
    assert moved(A1, A1) == (A1, False)
    assert moved(A1, None) == (A1, False)  # nobody answered: nothing learned
    assert moved(A1, B2) == (A1, True)
    assert moved(A1, A2) == (A1, True)  # same node, new term: it was fenced
    assert moved(A1, NONE) == (A1, True)  # its lease expired
    assert moved(None, NONE) == (None, True)  # gone before the first probe


def test_a_first_answer_claimed_after_the_request_was_sent_is_a_move() -> None:
    """The bus gave the request to the nodes subscribed when it was sent; a leader
    subscribes after its claim. A term claimed after the send (by its claimant's clock), or
    less than CLOCKS_MS before it (the clocks differ), cannot be trusted to hold the
    request: a killed leader replaced before the first probe. One claimed earlier, or a
    node that does not say, is waited for."""
    sent = 1_000_000
    after = Leader("b", 2, since_ms=sent + 50)
    assert moved(None, after, sent) == (None, True)
    assert moved(None, Leader("b", 2, since_ms=sent - CLOCKS_MS + 1), sent) == (None, True)
    before = Leader("b", 2, since_ms=sent - CLOCKS_MS)
    assert moved(None, before, sent) == (before, False)
    assert moved(None, Leader("b", 2, since_ms=sent - 5_000), sent) == (Leader("b", 2), False)
    assert moved(None, Leader("b", 2), sent) == (Leader("b", 2), False)  # not said
    assert moved(None, after) == (after, False)  # no send time given: as before
    assert moved(Leader("b", 2), after, sent) == (Leader("b", 2), False)  # a later answer


async def test_a_fast_answer_asks_nothing() -> None:
    time = FakeTime()
    probes = Probes(time, [A1])
    assert await _watch(time, time.request(0.2), probes) == "ok"
    assert probes.asked_at == []


async def test_a_slow_leader_that_stays_is_waited_for_probing_every_second() -> None:
    # A leader waiting for its ISR (a follower died): slow, but the same term throughout.
    time = FakeTime()
    probes = Probes(time, [A1])
    assert await _watch(time, time.request(4.5), probes) == "ok"
    assert probes.asked_at == [1.0, 2.0, 3.0, 4.0]


async def test_a_dead_leader_is_abandoned_once_its_lease_expired() -> None:
    # The leader died with the request: the probes name it until its owner key expires.
    time = FakeTime()
    probes = Probes(time, [A1, A1, NONE])
    request = time.request(None)
    with pytest.raises(LeaderMovedError) as raised:
        await _watch(time, request, probes)
    assert (raised.value.code, raised.value.retriable) == ("not_owner", True)
    assert (raised.value.was, raised.value.now) == (A1, NONE)
    assert "may have been stored" in raised.value.message
    assert time.now_s - 100.0 == 3.0  # the third probe, not the 10 s deadline
    assert request.cancelled()


async def test_a_new_leader_seen_by_a_probe_abandons_the_request() -> None:
    time = FakeTime()
    probes = Probes(time, [A1, B2])
    with pytest.raises(LeaderMovedError) as raised:
        await _watch(time, time.request(None), probes)
    assert (raised.value.was, raised.value.now) == (A1, B2)
    # Unanswered probes teach nothing: the same epoch after them is no move.
    time = FakeTime()
    probes = Probes(time, [None, A1, None, A1])
    assert await _watch(time, time.request(4.5), probes) == "ok"


async def test_a_node_that_cannot_tell_is_no_move_but_no_leader_can_come_gives_up() -> None:
    time = FakeTime()
    probes = Probes(time, [RemoteError(code="meta_unavailable", message="etcd", retriable=True)])
    assert await _watch(time, time.request(2.5), probes) == "ok"
    unavailable = RemoteError(code="partition_unavailable", message="gone", retriable=True)
    time = FakeTime()
    probes = Probes(time, [A1, unavailable])
    with pytest.raises(RemoteError) as raised:
        await _watch(time, time.request(None), probes)
    assert raised.value is unavailable


async def test_probes_stop_before_the_deadline_and_at_their_cap() -> None:
    time = FakeTime()
    probes = Probes(time, [A1])
    # A bus request ends at the deadline on its own (here: answered then).
    request = time.request(2.5, "at the deadline")
    assert await _watch(time, request, probes, timeout_s=2.5) == "at the deadline"
    assert probes.asked_at == [1.0, 2.0]
    # Past its cap no probe is sent: the request is simply awaited (it ends by itself).
    time = FakeTime()
    probes = Probes(time, [A1])
    request = time.request(None)

    async def answer_after_the_probes() -> None:
        while len(probes.asked_at) < 3:
            probes.asked.clear()
            await probes.asked.wait()
        for _ in range(10):  # a fourth probe, if any, would be asked by now
            await asyncio.sleep(0)
        request.set_result("ok")

    answering = asyncio.create_task(answer_after_the_probes())
    watched = await_watching_leader(
        request,
        probes,
        deadline=time.now_s + 10.0,
        subject="s",
        probes_max=3,
        clock=time,
        sleep=time.sleep,
    )
    assert await watched == "ok"
    await answering
    assert probes.asked_at == [1.0, 2.0, 3.0]


P = TopicName("default", "t-part-0")


class FakeBus:
    """The two subjects a produce uses: the produce (the first request is held by a leader
    that died, the second finds nobody serving, the third is answered by the new leader) and
    the probe (scripted; unanswered once the script ends)."""

    def __init__(self, probe_replies: list[bytes]) -> None:
        self.subjects = Subjects()
        self.probe_replies = probe_replies
        self.produces = 0
        self.held: asyncio.Future[Reply] | None = None

    async def request(
        self,
        subject: str,
        body: bytes,
        *,
        timeout_s: float | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> Reply:
        assert timeout_s is not None
        if subject == self.subjects.leader_probe(P):
            if not self.probe_replies:
                raise BusTimeoutError(subject, timeout_s)
            return Reply(body=self.probe_replies.pop(0))
        if subject == self.subjects.wal_fetch(P):
            self.held = asyncio.get_running_loop().create_future()
            async with asyncio.timeout(timeout_s):
                return await self.held
        assert subject == self.subjects.produce(P)
        self.produces += 1
        if self.produces == 1:
            self.held = asyncio.get_running_loop().create_future()
            async with asyncio.timeout(timeout_s):
                return await self.held
        if self.produces == 2:
            raise NoRespondersError(subject)
        return Reply(body=protocol.encode_produce_reply(7, 1))


async def test_ingest_client_sends_again_to_the_next_leader() -> None:
    """The first produce is held by a leader that died; the probes name it, then nobody:
    the client abandons it, claims a leader, and the third request lands."""
    bus = FakeBus([control.encode_probe_reply("a", 1), control.encode_probe_reply(None)])
    client = IngestClient(bus, probe_after_s=0.05, probe_every_s=0.05)  # type: ignore[arg-type]
    claims: list[float] = []

    async def claim(partition: TopicName, deadline: float) -> RemoteError | None:
        claims.append(deadline)
        return None

    client._ask_claim = claim  # type: ignore[method-assign]
    loop = asyncio.get_running_loop()
    started = loop.time()
    assert await client.produce(P, [b"r"], timeout_s=5.0) == 7
    assert bus.produces == 3
    assert len(claims) == 1
    assert loop.time() - started < 1.0  # at the second probe, not at the 5 s deadline
    assert bus.held is not None
    assert bus.held.cancelled()


async def test_a_produce_to_a_slow_leader_that_stays_is_sent_once() -> None:
    bus = FakeBus([control.encode_probe_reply("a", 1)] * 3)
    client = IngestClient(bus, probe_after_s=0.02, probe_every_s=0.02)  # type: ignore[arg-type]

    async def answer_late() -> None:
        await asyncio.sleep(0.2)
        assert bus.held is not None
        bus.held.set_result(Reply(body=protocol.encode_produce_reply(3, 1)))

    late = asyncio.create_task(answer_late())
    assert await client.produce(P, [b"r"], timeout_s=5.0) == 3
    await late
    assert bus.produces == 1  # probes named the same leader, then nobody answered them


async def test_a_fetch_held_by_a_leader_that_died_is_given_up_when_the_leader_moves() -> None:
    """Readers (dispatcher, uploader) fetch again on any bus error: a fetch held by a dead
    leader ends with not_owner at the probe that sees the new leader, not at its timeout."""
    bus = FakeBus([control.encode_probe_reply("a", 1), control.encode_probe_reply("b", 2)])
    client = IngestClient(bus, probe_after_s=0.02, probe_every_s=0.02)  # type: ignore[arg-type]
    loop = asyncio.get_running_loop()
    started = loop.time()
    with pytest.raises(LeaderMovedError) as raised:
        await client.fetch(P, 0, timeout_s=5.0)
    assert (raised.value.was, raised.value.now) == (A1, B2)
    assert loop.time() - started < 1.0
    assert bus.held is not None
    assert bus.held.cancelled()


class SlowProbes:
    """Answers every probe after 50 ms (leader a, epoch 1), counting them."""

    def __init__(self) -> None:
        self.subjects = Subjects()
        self.probes = 0

    async def request(self, subject: str, body: bytes, *, timeout_s: float) -> Reply:
        assert subject == self.subjects.leader_probe(P)
        self.probes += 1
        await asyncio.sleep(0.05)
        return Reply(body=control.encode_probe_reply("a", 1))


async def test_slow_requests_of_a_partition_share_a_recent_probe() -> None:
    """Requests waiting together ask once; a request sent after a probe began asks anew;
    a waiter that leaves does not take the answer from the others."""
    bus = SlowProbes()
    client = IngestClient(bus)  # type: ignore[arg-type]
    loop = asyncio.get_running_loop()
    sent_at = loop.time()
    deadline = sent_at + 5.0
    leaving = asyncio.create_task(client._probe(P, deadline, sent_at=sent_at))
    staying = [client._probe(P, deadline, sent_at=sent_at) for _ in range(9)]
    await asyncio.sleep(0)
    leaving.cancel()
    assert await asyncio.gather(*staying) == [A1] * 9
    assert bus.probes == 1
    assert await client._probe(P, deadline, sent_at=loop.time()) == A1  # sent later
    assert bus.probes == 2
    await asyncio.sleep(0.3)
    assert client._probes == {}  # forgotten once old


def test_probe_replies_decode_and_bad_ones_are_refused() -> None:
    assert control.decode_probe_reply(control.encode_probe_reply("a", 3)) == ("a", 3, None)
    assert control.decode_probe_reply(control.encode_probe_reply("a", 3, 17)) == ("a", 3, 17)
    assert control.decode_probe_reply(control.encode_probe_reply(None)) == (None, None, None)
    for bad in (
        b"",
        b"[]",
        b'{"epoch": 1}',
        b'{"leader": "a"}',
        b'{"leader": 1, "epoch": 1}',
        b'{"leader": "a", "epoch": 1, "since_ms": "x"}',
    ):
        with pytest.raises(protocol.BadRequestError):
            control.decode_probe_reply(bad)


def test_an_abandoned_produce_is_a_retriable_503_at_discovery_and_in_the_sdk() -> None:
    """When even the retries find no leader by the produce deadline, discovery answers the
    kept reason: 503 not_owner, which the SDK retries (docs/replication.md)."""
    from danube.client.errors import api_error
    from danube.discovery.errors import error_body, http_status

    error = LeaderMovedError(subject="s", was=A1, now=NONE)
    assert http_status(error) == 503
    assert error_body(error)["error"]["code"] == "not_owner"
    assert api_error(503, "not_owner", error.message).retriable

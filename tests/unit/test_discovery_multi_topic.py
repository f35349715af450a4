"""The many-topics stream's logic without I/O (danube.discovery.doors.http.multi_topic): which
topics a
list or a regex selects (whole names, partitions refused, bad and catastrophic patterns
refused with invalid_pattern), how credits are lent to topics in turn (never past what the
client granted, every topic served, a deep backlog not starving the others), and how an
ack's refs are split by topic; the namespaces' topic lists shared by the streams."""

from __future__ import annotations

import asyncio
import random
import time

import pytest

from danube.discovery.catalog.topic_lists import TopicLists
from danube.discovery.doors.http.multi_topic import (
    INVALID_PATTERN,
    Lender,
    Loan,
    TopicSelector,
    runs_by_topic,
)
from danube.discovery.errors import BadRequestError, StreamProtocolError
from danube.wire.consume.models import AckRequest

pytestmark = pytest.mark.unit

NAMES = ["orders", "orders-eu", "orders-dlq", "xorders", "payments"]


def test_a_pattern_matches_whole_names_as_the_sdk_does() -> None:
    selector = TopicSelector("shop", pattern="orders.*", topics_max=10)
    assert selector.select(NAMES) == ["orders", "orders-dlq", "orders-eu"]
    assert TopicSelector("shop", pattern="orders", topics_max=10).select(NAMES) == ["orders"]
    no_dlq = TopicSelector("shop", pattern=r"orders(?!.*-dlq$).*", topics_max=10)
    assert no_dlq.select(NAMES) == ["orders", "orders-eu"]


def test_a_list_selects_the_names_it_lists() -> None:
    selector = TopicSelector("shop", topics=["orders", "missing"], topics_max=10)
    assert selector.select(NAMES) == ["orders"]
    assert selector.listed == frozenset({"orders", "missing"})


@pytest.mark.parametrize(
    ("kw", "code"),
    [
        ({"pattern": "("}, INVALID_PATTERN),
        ({"pattern": "a{2,1}"}, INVALID_PATTERN),
        ({"pattern": "x" * 513}, INVALID_PATTERN),
        ({"topics": ["a", "b", "c"]}, "invalid_request"),  # over topics_max
        ({"topics": ["a.b"]}, "invalid_name"),
        ({"topics": ["orders-part-1"]}, "invalid_name"),  # a partition: name its topic
        ({}, "invalid_request"),
        ({"topics": ["a"], "pattern": "a"}, "invalid_request"),
    ],
)
def test_bad_selections_are_refused(kw: dict[str, object], code: str) -> None:
    with pytest.raises(BadRequestError) as refused:
        TopicSelector("shop", topics_max=2, **kw)  # type: ignore[arg-type]
    assert refused.value.code == code


def test_a_pattern_that_backtracks_without_end_is_refused_quickly() -> None:
    selector = TopicSelector("shop", pattern="(a|aa)+$", topics_max=10)
    started = time.monotonic()
    with pytest.raises(BadRequestError) as refused:
        selector.select(["a" * 60 + "!"])  # ~Fibonacci(60) steps
    assert refused.value.code == INVALID_PATTERN
    assert time.monotonic() - started < 1.0


def test_credits_go_to_topics_in_turn_and_never_past_the_grant() -> None:
    lender = Lender(limit=100, batch_max=1000)
    assert lender.ask("a", busy=False) == []  # nothing granted yet
    assert lender.ask("b", busy=False) == []
    assert lender.grant(1) == [Loan("a", 1)]  # idle topics borrow one credit each
    assert lender.waiting == ["b"]
    assert lender.settle(Loan("a", 1), 0) == [Loan("b", 1)]  # given back: b's turn
    assert lender.ask("a", busy=False) == []  # a again, behind b
    assert lender.settle(Loan("b", 1), 1) == []  # b spent it on a message: a waits
    assert lender.grant(2) == [Loan("a", 1)]
    assert (lender.available, lender.lent, lender.spent) == (1, 1, 1)
    with pytest.raises(StreamProtocolError) as over:
        lender.grant(99)  # 1 available + 1 lent + 99 > 100
    assert over.value.code == "too_many_credits"


def test_busy_topics_share_what_the_idle_ones_leave() -> None:
    lender = Lender(limit=10_000, batch_max=1000)
    for topic, busy in (("hot-1", True), ("idle", False), ("hot-2", True)):
        lender.ask(topic, busy=busy)
    loans = lender.grant(101)
    assert loans == [Loan("hot-1", 50), Loan("idle", 1), Loan("hot-2", 50)]
    lender.withdraw("gone")  # not of the stream: nothing happens
    lender.ask("big", busy=True)  # three busy now: a third each of what idle leaves
    assert lender.settle(Loan("hot-1", 50), 0) == [Loan("big", 33)]


def test_a_deep_backlog_does_not_starve_the_other_topics() -> None:
    """A simulated stream: topic "deep" always has a full batch, the others one message now
    and then; each of them is served within one turn of the line, and credits outstanding
    never pass the limit."""
    rng = random.Random(7)
    lender = Lender(limit=200, batch_max=1000)
    topics = ["deep"] + [f"t{i}" for i in range(9)]
    backlog = dict.fromkeys(topics, 0)
    busy = dict.fromkeys(topics, False)
    waited = dict.fromkeys(topics, 0)  # loans made to others since the topic's last one
    pending: list[Loan] = []
    for topic in topics:
        pending += lender.ask(topic, busy=False)
    pending += lender.grant(200)
    peak = 0  # the largest backlog a quiet topic had
    for _ in range(5000):
        backlog["deep"] = 10_000
        quiet = rng.choice(topics[1:])
        backlog[quiet] += 1
        loan = pending.pop(0)
        for other in topics:
            waited[other] = 0 if other == loan.topic else waited[other] + 1
        assert max(waited.values()) <= len(topics), waited  # everyone served in turn
        used = min(loan.credits, backlog[loan.topic])
        backlog[loan.topic] -= used
        busy[loan.topic] = used > 0
        pending += lender.settle(loan, used)
        pending += lender.grant(used) if used else []  # the client acks and grants again
        pending += lender.ask(loan.topic, busy=busy[loan.topic])
        assert lender.available + lender.lent <= lender.limit
        peak = max(peak, *(backlog[t] for t in topics[1:]))
    # The quiet topics kept up (lending the deep one all that is available at its turn,
    # they fell behind for good: 94 messages behind after 5000 loans).
    assert peak <= 12, peak


def test_ack_refs_are_split_by_topic_in_their_order() -> None:
    body = AckRequest.model_validate(
        {
            "messages": [
                {"partition": "/shop/orders-part-1", "offset": 4},
                {"partition": "/shop/payments", "offset": 9},
            ],
            "ranges": [{"partition": "/shop/orders-part-0", "first": 1, "last": 3}],
        }
    )
    assert runs_by_topic("shop", body) == {
        "orders": [("orders-part-1", 4, 4), ("orders-part-0", 1, 3)],
        "payments": [("payments", 9, 9)],
    }
    for partition in ("/other/orders", "orders", "/shop/a.b"):
        bad = AckRequest.model_validate({"messages": [{"partition": partition, "offset": 0}]})
        with pytest.raises(BadRequestError) as refused:
            runs_by_topic("shop", bad)
        assert refused.value.code == "invalid_partition"


async def test_topic_lists_are_shared_by_the_streams_and_refreshed_by_age() -> None:
    calls: list[str] = []
    release = asyncio.Event()

    async def list_topics(namespace: str) -> list[str]:
        calls.append(namespace)
        await release.wait()
        if namespace == "gone":
            raise BadRequestError("no such namespace", code="namespace_not_found")
        return [f"t{len(calls)}"]

    lists = TopicLists(list_topics, max_age_s=0.05)
    askers = [asyncio.create_task(lists.names("shop")) for _ in range(50)]
    await asyncio.sleep(0)
    askers[0].cancel()  # one stream leaves: the listing goes on for the others
    release.set()
    answers = await asyncio.gather(*askers[1:])
    assert calls == ["shop"]
    assert answers == [["t1"]] * 49
    assert await lists.names("shop") == ["t1"]  # fresh enough: not listed again
    await asyncio.sleep(0.06)
    assert await lists.names("shop") == ["t2"]
    with pytest.raises(BadRequestError):
        await lists.names("gone")
    assert calls == ["shop", "shop", "gone"]

"""Dispatchers share subscriptions: 60 subscriptions with consumers polling and acking through
discovery are served by one dispatcher; two more start and each serves 20 ± 5 within 60 s; then
one of them gets SIGTERM and hands its share over, then another is drained through the admin
route and hands everything over. Per subscription, no acknowledged message is
lost (tests/history.py) and the duplicates stay within the in-flight windows of the hand-overs."""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import httpx
import pytest

from danube.up import ProcessSpec, ServerProcess
from tests.history import History, Produce

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]

TOPIC = "balanced"
SUBSCRIPTIONS = 60
POLL_MAX = 20  # also each consumer's window: at most this many unacked per hand-over
BATCH = 10
PRODUCE_EVERY_S = 0.5
BALANCE_WITHIN_S = 60.0
SHARE, SHARE_SLACK = SUBSCRIPTIONS // 3, 5
DISPATCHER_ENV = {
    "DANUBE_DISPATCHER__BALANCE_INTERVAL_S": "1",
    "DANUBE_DISPATCHER__MAX_UNACKED_PER_CONSUMER": str(POLL_MAX),
}
_SERVED = re.compile(r'^danube_dispatcher_subscriptions\{dispatch="reliable"\} (\S+)$', re.M)


@dataclass
class Consumer:
    """One subscription's consumer: what it received, and how often it attached again."""

    sub: str
    history: History = field(default_factory=History)
    attaches: int = 0
    received: set[tuple[str, int]] = field(default_factory=set)


async def _attach(http: httpx.AsyncClient, consumer: Consumer) -> str:
    path = f"/v1/topics/default/{TOPIC}/subscriptions/{consumer.sub}/consumers"
    body = {"name": consumer.sub, "type": "exclusive", "start": "earliest"}
    answers: list[str] = []  # what it was told before, for the failure's message
    try:
        async with asyncio.timeout(30):
            while True:
                response = await http.post(path, json=body)
                if response.status_code == 201:
                    consumer.attaches += 1
                    return str(response.json()["consumer_id"])
                answers.append(f"{response.status_code} {response.text[:200]}")
                # moving: claim refused, retried
                assert response.status_code == 503, (consumer.sub, answers)
                await asyncio.sleep(0.1)
    except TimeoutError:
        raise AssertionError(f"{consumer.sub} not attached within 30 s: {answers}") from None


async def _consume(http: httpx.AsyncClient, consumer: Consumer, done: asyncio.Event) -> None:
    consumer_id = await _attach(http, consumer)
    while not done.is_set():
        try:
            response = await http.get(
                f"/v1/consumers/{consumer_id}/messages", params={"max": POLL_MAX, "wait_ms": 500}
            )
        except httpx.TransportError:  # a kept-alive connection the server closed as it was
            await asyncio.sleep(0.05)  # reused (HTTP/1.1's race): ask again, as clients do
            continue
        if response.status_code == 404:  # handed over: the new owner does not know us
            consumer_id = await _attach(http, consumer)
            continue
        if response.status_code == 503:  # nobody answered in time (claim refused, moving)
            await asyncio.sleep(0.05)
            continue
        assert response.status_code == 200, response.text
        messages = response.json()["messages"]
        for m in messages:
            consumer.history.delivered(
                m["payload"], partition=m["partition"], offset=m["offset"], consumer=consumer.sub
            )
            consumer.received.add((m["partition"], m["offset"]))
        if messages:
            refs = [{"partition": m["partition"], "offset": m["offset"]} for m in messages]
            try:
                ack = await http.post(f"/v1/consumers/{consumer_id}/ack", json={"messages": refs})
            except httpx.TransportError:
                continue  # not known to be stored: these may and should come again
            # Not known to be stored (moving): these may and should come again.
            assert ack.status_code in (204, 404, 503), ack.text


async def _produce(http: httpx.AsyncClient, produced: list[Produce], done: asyncio.Event) -> None:
    n = 0
    while not done.is_set():
        ids = [f"m-{i}" for i in range(n, n + BATCH)]
        n += BATCH
        response = await http.post(
            f"/v1/topics/default/{TOPIC}/messages",
            json={"messages": [{"payload": i} for i in ids]},
        )
        results = response.json()["results"] if response.status_code == 200 else None
        for i, msg_id in enumerate(ids):
            if results is None:
                produced.append(Produce(msg_id, None, None, acked=False))
            else:
                r = results[i]
                produced.append(Produce(msg_id, r["partition"], r["offset"], acked=True))
        await asyncio.sleep(PRODUCE_EVERY_S)


async def _served(http: httpx.AsyncClient, dispatchers: dict[str, ServerProcess]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for name, process in dispatchers.items():
        text = (await http.get(f"http://127.0.0.1:{process.spec.port}/metrics")).text
        found = _SERVED.search(text)
        counts[name] = int(float(found.group(1))) if found else 0
    return counts


async def _wait_for(
    http: httpx.AsyncClient,
    dispatchers: dict[str, ServerProcess],
    ok: Callable[[dict[str, int]], bool],
    timeout_s: float,
    consumers: list[asyncio.Task[None]],
) -> tuple[float, dict[str, int]]:
    started = time.monotonic()
    counts: dict[str, int] = {}
    while time.monotonic() - started < timeout_s:
        for task in consumers:  # a consumer that gave up leaves its subscription unclaimed
            if task.done():
                task.result()
        counts = await _served(http, dispatchers)
        if ok(counts):
            return time.monotonic() - started, counts
        await asyncio.sleep(0.5)
    raise AssertionError(f"not balanced within {timeout_s}s: {counts}")


def _fair(counts: dict[str, int]) -> bool:
    return sum(counts.values()) == SUBSCRIPTIONS and all(
        abs(c - SHARE) <= SHARE_SLACK for c in counts.values()
    )


async def test_new_dispatchers_take_their_share_and_sigterm_hands_over(
    spec_for: Callable[..., ProcessSpec], services: Callable[..., ServerProcess]
) -> None:
    services("ingest", "ingest-0")
    discovery = services("discovery", "discovery-0")
    dispatchers = {"dispatcher-0": services("dispatcher", "dispatcher-0", **DISPATCHER_ENV)}
    consumers = [Consumer(f"s{i:02d}") for i in range(SUBSCRIPTIONS)]
    produced: list[Produce] = []
    done, stop_producing = asyncio.Event(), asyncio.Event()
    limits = httpx.Limits(max_connections=2 * SUBSCRIPTIONS + 8)
    base_url = f"http://127.0.0.1:{discovery.spec.port}"
    async with httpx.AsyncClient(base_url=base_url, timeout=30, limits=limits) as http:
        created = await http.put(f"/v1/topics/default/{TOPIC}", json={"partitions": 0})
        assert created.status_code in (200, 201), created.text
        tasks = [asyncio.create_task(_consume(http, c, done)) for c in consumers]
        async with asyncio.timeout(60):
            while sum(c.attaches for c in consumers) < SUBSCRIPTIONS:
                for task in tasks:
                    if task.done():
                        task.result()  # a consumer that failed to attach says why
                await asyncio.sleep(0.1)
        producer = asyncio.create_task(_produce(http, produced, stop_producing))
        assert (await _served(http, dispatchers)) == {"dispatcher-0": SUBSCRIPTIONS}
        async with asyncio.timeout(30):  # messages flowing to every consumer
            while not all(c.received for c in consumers):  # noqa: ASYNC110
                await asyncio.sleep(0.1)

        # Two more dispatchers: each takes its share while consumers poll and ack.
        started = time.monotonic()
        more = await asyncio.gather(
            *(
                asyncio.to_thread(services, "dispatcher", f"dispatcher-{n}", **DISPATCHER_ENV)
                for n in (1, 2)
            )
        )
        dispatchers.update({f"dispatcher-{n}": p for n, p in zip((1, 2), more, strict=True)})
        up_s = time.monotonic() - started
        balanced_s, counts = await _wait_for(http, dispatchers, _fair, BALANCE_WITHIN_S, tasks)
        balanced_s += up_s
        moves = sum(c.attaches for c in consumers) - SUBSCRIPTIONS
        await asyncio.sleep(3)
        settled = await _served(http, dispatchers)
        assert _fair(settled), settled  # and it stays so: no ping-pong

        # SIGTERM: dispatcher-2 hands every subscription over before it exits.
        attaches_before = sum(c.attaches for c in consumers)
        stopping = time.monotonic()
        await asyncio.to_thread(dispatchers.pop("dispatcher-2").stop)
        stop_s = time.monotonic() - stopping
        sigterm_s, after = await _wait_for(
            http, dispatchers, lambda c: sum(c.values()) == SUBSCRIPTIONS, BALANCE_WITHIN_S, tasks
        )
        sigterm_moves = sum(c.attaches for c in consumers) - attaches_before

        # Drain (the admin route): dispatcher-1 hands everything to dispatcher-0.
        drained = await http.post("/v1/nodes/dispatcher-1/drain")
        assert drained.status_code == 201, drained.text
        assert drained.json()["kinds"] == ["dispatcher"]
        drain_s, _ = await _wait_for(
            http,
            dispatchers,
            lambda c: c == {"dispatcher-0": SUBSCRIPTIONS, "dispatcher-1": 0},
            BALANCE_WITHIN_S,
            tasks,
        )
        status = (await http.get("/v1/nodes/dispatcher-1/drain")).json()
        assert (status["subscriptions"], status["done"]) == ([], True)

        # Drain: stop producing, wait until every consumer has every acked message.
        stop_producing.set()
        await producer
        acked = {(p.partition, p.offset) for p in produced if p.acked}
        async with asyncio.timeout(45):
            while not all(acked <= c.received for c in consumers):
                await asyncio.sleep(0.2)
                for task in tasks:
                    assert not task.done(), task
        done.set()
        await asyncio.gather(*tasks)

    handovers = sum(c.attaches for c in consumers) - SUBSCRIPTIONS
    duplicates = 0
    for consumer in consumers:
        consumer.history.events[:0] = produced
        report = consumer.history.check()
        assert report.ok, f"{consumer.sub}: {report.summary()}"
        duplicates += report.duplicates
    print(
        f"\nbalance: dispatchers 1 and 2 ready after {up_s:.1f}s, fair after {balanced_s:.1f}s "
        f"{counts}, {moves} subscriptions moved; settled {settled}"
        f"\nSIGTERM of dispatcher-2: its exit took {stop_s:.1f}s, all 60 served again "
        f"{sigterm_s:.1f}s later {after}, {sigterm_moves} re-attached"
        f"\ndrain of dispatcher-1: every subscription on dispatcher-0 {drain_s:.1f}s later"
        f"\nmessages produced {len(produced)} (acked {len(acked)}), consumer re-attaches "
        f"{handovers}, duplicates {duplicates} (bound {handovers} x {POLL_MAX} = "
        f"{handovers * POLL_MAX})"
    )
    assert duplicates <= handovers * POLL_MAX

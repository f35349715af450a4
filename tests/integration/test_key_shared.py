"""Key-shared subscriptions over HTTP on real NATS and etcd (ingest, dispatcher, discovery
in-process): one consumer per key in order, key filters, the 400s, and per-key order while
consumers join and leave under 10 000 keyed messages."""

from __future__ import annotations

import asyncio
import itertools
import random
import time
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest

from danube.client import AsyncDanubeClient, InvalidArgumentError
from danube.meta.failure_policy import MAX_REDELIVERIES_MAX

pytestmark = pytest.mark.integration

SUBS = "/v1/topics/default/{topic}/subscriptions/{sub}/consumers"


async def _attach(http: httpx.AsyncClient, topic: str, name: str, **body: Any) -> str:
    response = await http.post(
        SUBS.format(topic=topic, sub="ks"),
        json={"name": name, "type": "key_shared", "start": "earliest"} | body,
    )
    assert response.status_code == 201, response.text
    cid: str = response.json()["consumer_id"]
    return cid


async def _produce(http: httpx.AsyncClient, topic: str, keys: list[str | None]) -> list[int]:
    messages = [
        {"payload": f"{key}:{i}"} | ({} if key is None else {"key": key})
        for i, key in enumerate(keys)
    ]
    response = await http.post(f"/v1/topics/default/{topic}/messages", json={"messages": messages})
    assert response.status_code == 200, response.text
    return [r["offset"] for r in response.json()["results"]]


async def _poll(http: httpx.AsyncClient, cid: str, wait_ms: int = 200) -> list[dict[str, Any]]:
    response = await http.get(
        f"/v1/consumers/{cid}/messages", params={"max": 500, "wait_ms": wait_ms}
    )
    assert response.status_code == 200, response.text
    messages: list[dict[str, Any]] = response.json()["messages"]
    return messages


async def _ack(http: httpx.AsyncClient, cid: str, messages: list[dict[str, Any]]) -> None:
    if not messages:
        return
    refs = [{"partition": m["partition"], "offset": m["offset"]} for m in messages]
    response = await http.post(f"/v1/consumers/{cid}/ack", json={"messages": refs})
    assert response.status_code == 204, response.text  # every ref was in flight


async def test_two_consumers_each_key_to_one_consumer_in_order(
    consume_http: httpx.AsyncClient,
) -> None:
    http = consume_http
    a = await _attach(http, "ks-two", "a")
    b = await _attach(http, "ks-two", "b")
    keys = [f"key-{i % 20}" for i in range(20 * 15)]
    offsets = await _produce(http, "ks-two", keys)  # type: ignore[arg-type]
    key_of = dict(zip(offsets, keys, strict=True))
    got: dict[str, list[int]] = {a: [], b: []}
    async with asyncio.timeout(15):
        while sum(len(v) for v in got.values()) < len(keys):
            for cid in (a, b):
                messages = await _poll(http, cid, wait_ms=100)
                got[cid] += [m["offset"] for m in messages]
                assert all(m["key"] == key_of[m["offset"]] for m in messages)
                await _ack(http, cid, messages)
    owner: dict[str, str] = {}
    per_key: dict[str, list[int]] = {}
    for cid, seen in got.items():
        for offset in seen:
            key = key_of[offset]
            assert owner.setdefault(key, cid) == cid, f"{key} went to both consumers"
            per_key.setdefault(key, []).append(offset)
    assert set(owner.values()) == {a, b}  # both got keys
    for key, seen in per_key.items():
        assert seen == [o for o in offsets if key_of[o] == key], f"{key} out of order"
    listed = await http.get("/v1/topics/default/ks-two/subscriptions")
    assert [s["type"] for s in listed.json()["subscriptions"]] == ["key_shared"]


async def test_key_filters_route_and_unmatched_keys_wait(consume_http: httpx.AsyncClient) -> None:
    http = consume_http
    users = await _attach(http, "ks-filters", "users", key_filters=["user-*", "eu-west-?"])
    offsets = await _produce(http, "ks-filters", ["user-1", "order-1", "eu-west-2", None])
    got = await _poll(http, users, wait_ms=2000)
    got += await _poll(http, users, wait_ms=300)
    # user-1, eu-west-2 and the keyless message; order-1 matches nobody: it waits.
    assert sorted(m["offset"] for m in got) == [offsets[0], offsets[2], offsets[3]]
    await _ack(http, users, got)
    assert await _poll(http, users, wait_ms=300) == []
    orders = await _attach(http, "ks-filters", "orders", key_filters=["order-*"])
    late = await _poll(http, orders, wait_ms=2000)
    assert [(m["offset"], m["key"]) for m in late] == [(offsets[1], "order-1")]


@pytest.mark.parametrize("mode", ["stream", "poll"])
async def test_the_sdk_consumer_attaches_key_shared_with_filters(
    consume_http: httpx.AsyncClient, mode: str
) -> None:
    topic = f"ks-sdk-{mode}"
    offsets = await _produce(consume_http, topic, ["eu-1", "us-1", "eu-2", "eu-1"])
    url = str(consume_http.base_url).rstrip("/")
    with pytest.raises(InvalidArgumentError, match="key_shared"):
        AsyncDanubeClient(url).consumer(f"/default/{topic}", "s", key_filters=("eu-*",))
    async with (
        AsyncDanubeClient(url) as client,
        client.consumer(
            f"/default/{topic}",
            "s",
            type="key_shared",
            key_filters=("eu-*",),
            start="earliest",
            mode=mode,
        ) as consumer,
    ):
        got = [await consumer.receive(10.0) for _ in range(3)]
        for message in got:
            message.ack()
        # us-1 matches no filter; each key in order (keys may interleave any way).
        assert sorted((m.offset, m.key) for m in got) == [
            (offsets[0], "eu-1"),
            (offsets[2], "eu-2"),
            (offsets[3], "eu-1"),
        ]
        assert [m.offset for m in got if m.key == "eu-1"] == [offsets[0], offsets[3]]


async def test_a_non_reliable_topic_refuses_key_shared(consume_http: httpx.AsyncClient) -> None:
    created = await consume_http.put(
        "/v1/topics/default/ks-nr", json={"partitions": 0, "dispatch": "non_reliable"}
    )
    assert created.status_code == 201, created.text
    response = await consume_http.post(
        SUBS.format(topic="ks-nr", sub="s"), json={"name": "c", "type": "key_shared"}
    )
    assert response.status_code == 400, response.text
    assert response.json()["error"]["code"] == "unsupported_subscription_type"
    listed = await consume_http.get("/v1/topics/default/ks-nr/subscriptions")
    assert listed.json()["subscriptions"] == []  # nothing was created


BAD_ATTACHES: list[dict[str, Any]] = [
    {"type": "shared", "key_filters": ["a-*"]},  # filters need key_shared
    {"type": "key_shared", "key_filters": ["k"] * 33},
    {"type": "key_shared", "key_filters": ["x" * 257]},
    {"type": "key_shared", "key_filters": [""]},
]


async def test_bad_key_filters_are_400(consume_http: httpx.AsyncClient) -> None:
    for body in BAD_ATTACHES:
        response = await consume_http.post(
            SUBS.format(topic="ks-bad", sub="s"), json={"name": "c"} | body
        )
        assert response.status_code == 400, response.text
        assert response.json()["error"]["code"] == "invalid_request"
        assert "key_filters" in response.text
    listed = await consume_http.get("/v1/topics/default/ks-bad/subscriptions")
    assert listed.status_code == 404  # refused before anything, the topic included, was made


# --- ordering under churn ----------------------------------------------------------------

TOTAL = 10_000
KEYS = 200
BATCH = 1000
CHURN_S = 30.0


@dataclass
class Log:
    """What the consumers saw, with client-side monotonic times: a delivery is recorded once
    its reply is in (after the server sent it), an ack or a detach before it is sent (before
    the server took it), so each interval [delivered, acked) lies inside the server's."""

    key_of: dict[int, str] = field(default_factory=dict)
    # (time, consumer, offset, redelivery_count) per delivery
    deliveries: list[tuple[float, str, int, int]] = field(default_factory=list)
    released: dict[tuple[str, int, int], float] = field(default_factory=dict)  # (c, o, n) -> t
    acked: dict[int, float] = field(default_factory=dict)


def check(log: Log) -> None:
    """Per key: no delivery while an earlier delivery of the key to another consumer is not
    yet acked or given back; first deliveries in offset order; redeliveries only of what was
    not acked."""
    intervals: dict[str, list[tuple[float, float, str]]] = {}
    for t, consumer, offset, nth in log.deliveries:
        end = log.released.get((consumer, offset, nth), float("inf"))
        intervals.setdefault(log.key_of[offset], []).append((t, end, consumer))
    for key, spans in intervals.items():
        spans.sort()
        for (_, end, consumer), (next_start, _, other) in itertools.pairwise(spans):
            if consumer != other:
                assert end <= next_start, (
                    f"{key}: to {other} at {next_start} while held until {end}"
                )
    expected = {key: sorted(o for o, k in log.key_of.items() if k == key) for key in intervals}
    firsts: dict[str, list[int]] = {}
    for t, _consumer, offset, nth in sorted(log.deliveries):
        acked_at = log.acked.get(offset)
        assert acked_at is None or t < acked_at or nth == 0, f"{offset} redelivered after its ack"
        seen = firsts.setdefault(log.key_of[offset], [])
        if offset not in seen:
            seen.append(offset)
    for key, seen in firsts.items():
        assert seen == expected[key], f"{key}: first deliveries out of order"


async def _churning_consumer(
    http: httpx.AsyncClient, slot: int, log: Log, done: asyncio.Event, seed: int
) -> None:
    rng = random.Random(seed)
    deliveries: dict[tuple[str, int], int] = {}  # per (consumer, offset): deliveries so far
    while not done.is_set():
        name = f"slot{slot}"
        cid = await _attach(http, "ks-churn", name)
        held: list[dict[str, Any]] = []
        # It leaves after a few non-empty polls (so churn happens however fast the mesh is)
        # or a while, whichever comes first.
        until, polls_left = time.monotonic() + rng.uniform(0.1, 0.5), rng.randint(2, 4)
        while time.monotonic() < until and polls_left > 0 and not done.is_set():
            messages = await _poll(http, cid, wait_ms=100)
            polls_left -= 1 if messages else 0
            now = time.monotonic()
            for m in messages:
                nth = deliveries[(cid, m["offset"])] = deliveries.get((cid, m["offset"]), -1) + 1
                log.deliveries.append((now, cid, m["offset"], nth))
            # Hold the newest batch a round (in flight while others come and go), ack the rest.
            done_with, held = held, messages
            now = time.monotonic()
            for m in done_with:
                log.released[(cid, m["offset"], deliveries[(cid, m["offset"])])] = now
                log.acked.setdefault(m["offset"], now)
            await _ack(http, cid, done_with)
            if len(log.acked) == TOTAL:
                done.set()
        # Leave with the last batch unacked: it goes to the keys' new owners.
        now = time.monotonic()
        for m in held:
            log.released[(cid, m["offset"], deliveries[(cid, m["offset"])])] = now
        response = await http.delete(f"/v1/consumers/{cid}")
        assert response.status_code == 204, response.text
        await asyncio.sleep(rng.uniform(0.05, 0.3))


async def test_key_shared_ordering_under_consumer_churn(consume_http: httpx.AsyncClient) -> None:
    http = consume_http
    log = Log()
    # Creates the subscription at earliest. Every consumer leaves with its last batch unacked
    # (or, on a slow machine, after one poll with all of it): a message may go round more
    # than the default 5 times and be dead-lettered, never acked here; this test is about
    # ordering, so it may go round as often as it takes.
    churn = {"max_redeliveries": MAX_REDELIVERIES_MAX}
    first = await _attach(http, "ks-churn", "first", failure_policy=churn)
    assert (await http.delete(f"/v1/consumers/{first}")).status_code == 204
    done = asyncio.Event()
    started = time.monotonic()
    async with asyncio.timeout(CHURN_S), asyncio.TaskGroup() as group:
        for slot in range(3):
            group.create_task(_churning_consumer(http, slot, log, done, seed=slot))
        rng = random.Random(7)
        for _ in range(TOTAL // BATCH):
            keys = [f"key-{rng.randrange(KEYS)}" for _ in range(BATCH)]
            offsets = await _produce(http, "ks-churn", keys)  # type: ignore[arg-type]
            log.key_of.update(zip(offsets, keys, strict=True))
        await done.wait()
    assert len(log.key_of) == TOTAL
    assert set(log.acked) == set(log.key_of)  # every message acked in the end
    check(log)
    # Churn really happened: consumers left with messages unacked and others took them.
    assert len({d[1] for d in log.deliveries}) >= 6
    assert len(log.deliveries) > TOTAL, "no redelivery after a consumer left"
    consumers = len({d[1] for d in log.deliveries})
    took_s = time.monotonic() - started
    print(f"churn: {len(log.deliveries)} deliveries to {consumers} consumers in {took_s:.1f}s")

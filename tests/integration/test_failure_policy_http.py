"""Failure policies over HTTP on real NATS and etcd (ingest, dispatcher, discovery in-process):
poison messages dropped, dead-lettered to a named topic, or blocking their partition until
acked or skipped; a policy replaced on a live subscription; attach conflicts and bad values;
the `danube` command's failure-policy get/set and consume options."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from tests.integration.test_cli import _danube, _url

pytestmark = pytest.mark.integration

SUBS = "/v1/topics/default/{topic}/subscriptions/{sub}"


def _error(response: httpx.Response) -> tuple[int, str]:
    return response.status_code, response.json()["error"]["code"]


async def _attach(http: httpx.AsyncClient, topic: str, sub: str, **body: Any) -> str:
    path = SUBS.format(topic=topic, sub=sub) + "/consumers"
    response = await http.post(path, json={"name": "c", "start": "earliest"} | body)
    assert response.status_code == 201, response.text
    cid: str = response.json()["consumer_id"]
    return cid


async def _produce(http: httpx.AsyncClient, topic: str, payloads: list[str]) -> None:
    messages = [{"payload": p} for p in payloads]
    response = await http.post(f"/v1/topics/default/{topic}/messages", json={"messages": messages})
    assert response.status_code == 200, response.text


async def _poll(http: httpx.AsyncClient, cid: str, wait_ms: int = 5000) -> list[dict[str, Any]]:
    """One message (waiting up to ``wait_ms``), or none."""
    response = await http.get(
        f"/v1/consumers/{cid}/messages", params={"max": 1, "wait_ms": wait_ms}
    )
    assert response.status_code == 200, response.text
    messages: list[dict[str, Any]] = response.json()["messages"]
    return messages


async def _nack(http: httpx.AsyncClient, cid: str, message: dict[str, Any]) -> None:
    ref = {"partition": message["partition"], "offset": message["offset"]}
    response = await http.post(f"/v1/consumers/{cid}/nack", json={"messages": [ref]})
    assert response.status_code == 204, response.text


async def _refuse(http: httpx.AsyncClient, cid: str, payload: str, times: int) -> None:
    """Poll ``payload`` and nack it ``times`` times, its redelivery count going 0, 1, ..."""
    for count in range(times):
        (message,) = await _poll(http, cid)
        assert (message["payload"], message["redelivery_count"]) == (payload, count)
        await _nack(http, cid, message)


async def _subscription(http: httpx.AsyncClient, topic: str, sub: str) -> dict[str, Any]:
    response = await http.get(f"/v1/topics/default/{topic}/subscriptions")
    assert response.status_code == 200, response.text
    (found,) = [s for s in response.json()["subscriptions"] if s["name"] == sub]
    return found  # type: ignore[no-any-return]


async def test_drop_and_dead_letter_after_max_redeliveries(
    consume_http: httpx.AsyncClient,
) -> None:
    http = consume_http
    await _produce(http, "orders", ["m0", "m1"])
    drop = {"max_redeliveries": 2, "poison_policy": "drop"}
    dlq = {
        "max_redeliveries": 2,
        "poison_policy": "dead_letter",
        "dead_letter_topic": "/default/poison-box",
    }
    dropper = await _attach(http, "orders", "dropper", failure_policy=drop)
    letters = await _attach(http, "orders", "letters", failure_policy=dlq)

    await _refuse(http, dropper, "m0", 3)  # delivered 1 + 2 times, refused each time
    (after,) = await _poll(http, dropper)
    assert (after["payload"], after["offset"], after["redelivery_count"]) == ("m1", 1, 0)
    listed = await _subscription(http, "orders", "dropper")
    assert listed["failure_policy"] == {
        "max_redeliveries": 2,
        "ack_timeout_ms": None,
        "backoff": None,
        "poison_policy": "drop",
        "dead_letter_topic": None,
    }
    assert listed["effective_failure_policy"]["poison_policy"] == "drop"
    assert listed["effective_failure_policy"]["dead_letter_topic"] == "/default/orders-dlq"

    await _refuse(http, letters, "m0", 3)
    (after,) = await _poll(http, letters)
    assert (after["payload"], after["redelivery_count"]) == ("m1", 0)
    reader = await _attach(http, "poison-box", "reader")
    (letter,) = await _poll(http, reader)
    assert (letter["partition"], letter["offset"], letter["payload"]) == (
        "/default/poison-box",
        0,
        "m0",
    )
    # Only the dead_letter subscription wrote there, once; the default topic got nothing.
    assert await _poll(http, reader, wait_ms=200) == []
    assert (await http.get("/v1/topics/default/orders-dlq")).status_code == 404


async def test_block_holds_the_partition_until_acked_or_skipped(
    consume_http: httpx.AsyncClient,
) -> None:
    http = consume_http
    await _produce(http, "jobs", ["m0", "m1", "m2"])
    policy = {"max_redeliveries": 2, "poison_policy": "block"}
    cid = await _attach(http, "jobs", "s", failure_policy=policy)

    await _refuse(http, cid, "m0", 3)
    assert await _poll(http, cid, wait_ms=300) == []  # neither m0 again nor m1
    (partition,) = (await _subscription(http, "jobs", "s"))["partitions"]
    assert (partition["cursor"], partition["blocked_offset"]) == (0, 0)
    # Acked (the consumer fixed its bug): the partition moves on.
    ack = {"messages": [{"partition": "/default/jobs", "offset": 0}]}
    assert (await http.post(f"/v1/consumers/{cid}/ack", json=ack)).status_code == 204
    await _refuse(http, cid, "m1", 3)
    assert await _poll(http, cid, wait_ms=300) == []
    (partition,) = (await _subscription(http, "jobs", "s"))["partitions"]
    assert partition["blocked_offset"] == 1
    # Skipped by an operator (no offset: past the poison message at the head): m2 comes,
    # m1 never again.
    skipped = await http.post(SUBS.format(topic="jobs", sub="s") + "/skip", json={})
    assert skipped.status_code == 200, skipped.text
    assert (skipped.json()["from_offset"], skipped.json()["to_offset"]) == (1, 2)
    (after,) = await _poll(http, cid)
    assert (after["payload"], after["redelivery_count"]) == ("m2", 0)
    (partition,) = (await _subscription(http, "jobs", "s"))["partitions"]
    assert partition["blocked_offset"] is None


async def test_a_policy_put_applies_to_the_live_subscription_and_attach_conflicts(
    consume_http: httpx.AsyncClient,
) -> None:
    http = consume_http
    path = SUBS.format(topic="live", sub="s") + "/failure-policy"
    assert _error(await http.get(path)) == (404, "topic_not_found")
    await _produce(http, "live", ["m0", "m1"])
    assert _error(await http.get(path)) == (404, "subscription_not_found")
    policy = {"max_redeliveries": 2, "poison_policy": "block"}
    cid = await _attach(http, "live", "s", type="shared", failure_policy=policy)
    # The same policy again, or none: fine; another one: refused, nothing changed.
    await _attach(http, "live", "s", type="shared", name="c2", failure_policy=policy)
    await _attach(http, "live", "s", type="shared", name="c3")
    conflict = await http.post(
        SUBS.format(topic="live", sub="s") + "/consumers",
        json={"name": "c4", "type": "shared", "failure_policy": {"max_redeliveries": 3}},
    )
    assert _error(conflict) == (409, "policy_conflict")

    got = (await http.get(path)).json()
    assert got["policy"]["max_redeliveries"] == 2
    assert got["effective"]["backoff"]["kind"] == "exponential"

    await _refuse(http, cid, "m0", 3)
    assert await _poll(http, cid, wait_ms=300) == []  # blocked
    # Replaced on the live subscription: the blocked message is dropped at once, m1 comes.
    put = await http.put(path, json={"max_redeliveries": 2, "poison_policy": "drop"})
    assert put.status_code == 200, put.text
    assert put.json()["effective"]["poison_policy"] == "drop"
    (after,) = await _poll(http, cid)
    assert (after["payload"], after["redelivery_count"]) == ("m1", 0)
    # A higher maximum from now on: m1 survives a third refusal.
    put = await http.put(path, json={"max_redeliveries": 5, "poison_policy": "drop"})
    assert put.status_code == 200, put.text
    await _nack(http, cid, after)
    for count in (1, 2, 3):
        (again,) = await _poll(http, cid)
        assert (again["payload"], again["redelivery_count"]) == ("m1", count)
        await _nack(http, cid, again)
    stored = (await http.get(path)).json()
    assert stored["policy"]["max_redeliveries"] == 5

    bad = await http.put(path, json={"backoff": {"base_ms": 500, "max_ms": 10}})
    assert _error(bad) == (400, "invalid_request")
    assert "body.backoff" in bad.json()["error"]["message"]
    bad = await http.put(path, json={"max_redeliveries": 1001})
    assert _error(bad) == (400, "invalid_request")
    assert "body.max_redeliveries" in bad.json()["error"]["message"]
    bad = await http.post(
        SUBS.format(topic="live", sub="t") + "/consumers",
        json={"name": "c", "failure_policy": {"backoff": {"kind": "linear"}}},
    )
    assert _error(bad) == (400, "invalid_request")
    assert "body.failure_policy.backoff.kind" in bad.json()["error"]["message"]
    own = await http.put(path, json={"dead_letter_topic": "/default/live"})
    assert _error(own) == (400, "bad_request")
    assert (await http.get(path)).json()["policy"]["max_redeliveries"] == 5


async def test_failure_policy_set_by_consume_then_get_and_set_by_admin(
    consume_http: httpx.AsyncClient,
) -> None:
    url = _url(consume_http)
    assert (await _danube("produce", "-s", url, "-t", "pol", "-m", "x", "-c", "1", "-q"))[0] == 0
    code, _, err = await _danube(
        "consume", "-s", url, "-t", "pol", "-m", "s", "--start", "earliest", "-c", "1",
        "--max-redeliveries", "3", "--poison", "drop",
    )  # fmt: skip
    assert code == 0, err
    get = ("admin", "subscriptions", "failure-policy", "get", "pol", "s", "-s", url, "--json")
    code, out, err = await _danube(*get)
    assert code == 0, err
    shown = json.loads(out)
    assert (shown["policy"]["max_redeliveries"], shown["policy"]["poison_policy"]) == (3, "drop")
    assert shown["effective"]["dead_letter_topic"] == "/default/pol-dlq"

    code, _, err = await _danube(
        "admin", "subscriptions", "failure-policy", "set", "pol", "s", "-s", url,
        "--poison", "dead-letter", "--dead-letter-topic", "/default/bad-pol",
        "--backoff", "fixed", "--backoff-base-ms", "250", "--ack-timeout-ms", "5000",
    )  # fmt: skip
    assert code == 0, err
    code, out, err = await _danube(*get)
    policy = json.loads(out)["policy"]
    assert policy["max_redeliveries"] is None  # set replaces: back to the cluster's
    assert (policy["poison_policy"], policy["dead_letter_topic"]) == (
        "dead_letter",
        "/default/bad-pol",
    )
    assert policy["backoff"] == {"kind": "fixed", "base_ms": 250, "max_ms": None}
    assert policy["ack_timeout_ms"] == 5000
    code, out, err = await _danube(*get[:-1])  # the table
    assert code == 0, err
    assert "dead_letter" in out

    code, _, err = await _danube(
        "consume", "-s", url, "-t", "pol", "-m", "s", "-c", "1", "--timeout", "2",
        "--max-redeliveries", "9",
    )  # fmt: skip
    assert code == 1
    assert "policy_conflict" in err
    code, _, err = await _danube(
        "admin", "subscriptions", "failure-policy", "get", "pol", "nope", "-s", url
    )
    assert code == 1
    assert "subscription_not_found" in err

"""The discovery consume HTTP API (attach, long-poll, ack, nack, detach) and subscription
admin (seek, list with backlog, delete) on real NATS and etcd with ingest, dispatcher and
discovery in-process: order, payload encodings, acks across consumers, exclusive refusal,
delayed redelivery, seek and start by time, seek and start past the end refused, backlog,
delete and the 400/404 answers."""

from __future__ import annotations

import asyncio
import base64
import time
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from danube.meta import MetaStore, TopicName
from danube.meta import keys as meta_keys
from danube.meta.records import SubscriptionConfig, SubscriptionCursor
from tests.integration.conftest import ConsumeMesh

pytestmark = pytest.mark.integration

BINARY = bytes([0xFF, 0x00, 0xFE, 0x80])


def _error(response: httpx.Response) -> tuple[int, str]:
    return response.status_code, response.json()["error"]["code"]


async def _attach(http: httpx.AsyncClient, path: str, **body: Any) -> str:
    response = await http.post(f"/v1/topics/{path}/consumers", json={"name": "c"} | body)
    assert response.status_code == 201, response.text
    cid: str = response.json()["consumer_id"]
    return cid


async def _poll_until(http: httpx.AsyncClient, cid: str, count: int) -> list[dict[str, Any]]:
    got: list[dict[str, Any]] = []
    async with asyncio.timeout(15):
        while len(got) < count:
            response = await http.get(
                f"/v1/consumers/{cid}/messages", params={"max": count - len(got), "wait_ms": 500}
            )
            assert response.status_code == 200, response.text
            got += response.json()["messages"]
    return got


def _refs(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{"partition": m["partition"], "offset": m["offset"]} for m in messages]


async def test_attach_produce_poll_ack_and_a_new_consumer_gets_only_unacked(
    consume_http: httpx.AsyncClient,
) -> None:
    assert (
        await consume_http.put("/v1/topics/default/orders", json={"partitions": 2})
    ).status_code == 201
    cid = await _attach(
        consume_http, "default/orders/subscriptions/s", type="shared", start="earliest"
    )
    assert cid.startswith("default.orders.s.")
    messages = [
        {"payload": f"k{i % 2}-{i}", "key": f"k{i % 2}", "attributes": {"i": str(i)}}
        for i in range(6)
    ]
    messages.append({"payload": base64.b64encode(BINARY).decode(), "encoding": "base64"})
    produced = await consume_http.post(
        "/v1/topics/default/orders/messages", json={"messages": messages, "producer": "p1"}
    )
    assert produced.status_code == 200, produced.text
    results = produced.json()["results"]

    got = await _poll_until(consume_http, cid, len(messages))
    by_position = {(m["partition"], m["offset"]): m for m in got}
    assert len(by_position) == len(messages)
    for sent, result in zip(messages, results, strict=True):
        out = by_position[(result["partition"], result["offset"])]
        assert (out["payload"], out["encoding"]) == (sent["payload"], sent.get("encoding", "utf8"))
        assert out["key"] == sent.get("key")
        assert out["attributes"] == sent.get("attributes", {})
        assert (out["producer"], out["redelivery_count"]) == ("p1", 0)
        assert out["publish_time_ms"] > 0
    # In offset order within each partition.
    for partition in {m["partition"] for m in got}:
        offsets = [m["offset"] for m in got if m["partition"] == partition]
        assert offsets == sorted(offsets)

    acked, unacked = got[:4], got[4:]
    response = await consume_http.post(f"/v1/consumers/{cid}/ack", json={"messages": _refs(acked)})
    assert response.status_code == 204, response.text
    assert (await consume_http.delete(f"/v1/consumers/{cid}")).status_code == 204

    again = await _attach(consume_http, "default/orders/subscriptions/s", type="shared")
    regot = await _poll_until(consume_http, again, len(unacked))
    assert sorted(_key(m) for m in regot) == sorted(_key(m) for m in unacked)
    nothing = await consume_http.get(f"/v1/consumers/{again}/messages", params={"wait_ms": 300})
    assert nothing.json() == {"messages": []}


def _key(message: dict[str, Any]) -> tuple[str, int]:
    return message["partition"], message["offset"]


async def test_exclusive_second_attach_is_refused(consume_http: httpx.AsyncClient) -> None:
    first = await _attach(consume_http, "default/excl/subscriptions/s", type="exclusive")
    second = await consume_http.post(
        "/v1/topics/default/excl/subscriptions/s/consumers",
        json={"name": "other", "type": "exclusive"},
    )
    assert _error(second) == (409, "subscription_taken")
    assert (await consume_http.delete(f"/v1/consumers/{first}")).status_code == 204
    await _attach(consume_http, "default/excl/subscriptions/s", type="exclusive")


async def test_nack_with_delay_redelivers_with_count_one(consume_http: httpx.AsyncClient) -> None:
    cid = await _attach(consume_http, "default/retry/subscriptions/s", start="earliest")
    body = {"messages": [{"payload": "again"}]}
    assert (
        await consume_http.post("/v1/topics/default/retry/messages", json=body)
    ).status_code == 200
    (first,) = await _poll_until(consume_http, cid, 1)
    assert (first["payload"], first["redelivery_count"]) == ("again", 0)
    assert first["partition"] == "/default/retry"
    for partition in ("/default/other", "retry", "/default/retry-part-0x"):
        wrong = {"messages": [{"partition": partition, "offset": 0}]}
        refused = await consume_http.post(f"/v1/consumers/{cid}/ack", json=wrong)
        assert _error(refused) == (400, "invalid_partition"), partition
    nacked = await consume_http.post(
        f"/v1/consumers/{cid}/nack", json={"messages": _refs([first]), "delay_ms": 200}
    )
    assert nacked.status_code == 204, nacked.text
    (redelivered,) = await _poll_until(consume_http, cid, 1)
    assert _key(redelivered) == _key(first)
    assert (redelivered["payload"], redelivered["redelivery_count"]) == ("again", 1)


BAD_IDS = [
    "nodots",
    "a.b.c",
    "a.b.c.d.e",
    "a.b.c.",
    "a b.t.s.x",
    "default.t-part-0.s.abc",
    "d.t.s.x!",
]


async def test_a_malformed_consumer_id_is_400(consume_http: httpx.AsyncClient) -> None:
    refs = {"messages": [{"partition": "/default/t", "offset": 0}]}
    for cid in BAD_IDS:
        expected = (400, "invalid_consumer_id")
        assert _error(await consume_http.get(f"/v1/consumers/{cid}/messages")) == expected, cid
        assert _error(await consume_http.post(f"/v1/consumers/{cid}/ack", json=refs)) == expected, (
            cid
        )
        assert (
            _error(await consume_http.post(f"/v1/consumers/{cid}/nack", json=refs)) == expected
        ), cid
        assert _error(await consume_http.delete(f"/v1/consumers/{cid}")) == expected, cid


async def test_an_unknown_consumer_is_404(consume_http: httpx.AsyncClient) -> None:
    cid = await _attach(consume_http, "default/known/subscriptions/s")
    unknown = cid.rsplit(".", 1)[0] + ".0123456789abcdef"
    got = await consume_http.get(f"/v1/consumers/{unknown}/messages", params={"wait_ms": 0})
    assert _error(got) == (404, "consumer_not_found")
    refs = {"messages": [{"partition": "/default/known", "offset": 0}]}
    assert _error(await consume_http.post(f"/v1/consumers/{unknown}/ack", json=refs)) == (
        404,
        "consumer_not_found",
    )
    assert (await consume_http.delete(f"/v1/consumers/{cid}")).status_code == 204
    detached = await consume_http.get(f"/v1/consumers/{cid}/messages", params={"wait_ms": 0})
    assert _error(detached) == (404, "consumer_not_found")


async def test_poll_limits_out_of_range_are_400(consume_http: httpx.AsyncClient) -> None:
    bad: list[dict[str, Any]] = [
        {"max": 0},
        {"max": 1001},
        {"wait_ms": -1},
        {"wait_ms": 30_001},
        {"max": "x"},
    ]
    for params in bad:
        got = await consume_http.get("/v1/consumers/default.t.s.abc/messages", params=params)
        assert _error(got) == (400, "invalid_request"), params


async def test_bad_attach_bodies_are_400(consume_http: httpx.AsyncClient) -> None:
    path = "/v1/topics/default/t/subscriptions/s/consumers"
    assert _error(await consume_http.post(path, json={"name": "c", "type": "nope"}))[0] == 400
    assert (
        _error(await consume_http.post(path, json={"name": "c", "start": {"offset": -1}}))[0] == 400
    )
    assert _error(await consume_http.post(path, json={"name": ""}))[0] == 400
    bad_sub = "/v1/topics/default/t/subscriptions/a.b/consumers"
    assert _error(await consume_http.post(bad_sub, json={"name": "c"})) == (400, "invalid_name")


# --- subscription admin: seek, list with backlog, delete ------------------------------------


async def _produce(
    http: httpx.AsyncClient, topic: str, payloads: list[str]
) -> list[dict[str, Any]]:
    messages = [{"payload": p, "key": p} for p in payloads]
    response = await http.post(f"/v1/topics/{topic}/messages", json={"messages": messages})
    assert response.status_code == 200, response.text
    results: list[dict[str, Any]] = response.json()["results"]
    return results


def _firsts(results: list[dict[str, Any]]) -> dict[str, int]:
    """The first offset produced to each partition."""
    firsts: dict[str, int] = {}
    for result in results:
        firsts.setdefault(result["partition"], result["offset"])
    return firsts


async def _subscriptions(http: httpx.AsyncClient, topic: str) -> dict[str, dict[str, Any]]:
    response = await http.get(f"/v1/topics/{topic}/subscriptions")
    assert response.status_code == 200, response.text
    listed = response.json()
    assert listed["topic"] == "/" + topic
    return {s["name"]: s for s in listed["subscriptions"]}


async def test_seek_and_attach_by_timestamp_start_at_the_first_message_published_then(
    http: httpx.AsyncClient,
) -> None:
    assert (await http.put("/v1/topics/default/timed", json={"partitions": 2})).status_code == 201
    cid = await _attach(http, "default/timed/subscriptions/s", type="shared", start="earliest")
    batch_a = await _produce(http, "default/timed", [f"a{i}" for i in range(6)])
    # Every message of A was published before `mark`, every message of B after it.
    mark = int(time.time() * 1000) + 1
    await asyncio.sleep(0.05)
    batch_b = await _produce(http, "default/timed", [f"b{i}" for i in range(6)])
    got = await _poll_until(http, cid, 12)
    assert (await http.post(f"/v1/consumers/{cid}/ack", json={"messages": _refs(got)})).is_success

    seek = await http.post(
        "/v1/topics/default/timed/subscriptions/s/seek", json={"position": {"timestamp_ms": mark}}
    )
    assert seek.status_code == 200, seek.text
    moved = {p["name"]: p["offset"] for p in seek.json()["partitions"]}
    assert moved == _firsts(batch_b)
    again = await _poll_until(http, cid, 6)
    assert sorted(_key(m) for m in again) == sorted(_key(r) for r in batch_b)
    assert {m["payload"][0] for m in again} == {"b"}
    assert {m["redelivery_count"] for m in again} == {0}

    # A new subscription starting at that time gets B only.
    late = await _attach(
        http, "default/timed/subscriptions/late", type="shared", start={"timestamp_ms": mark}
    )
    first_got = await _poll_until(http, late, 6)
    assert sorted(_key(m) for m in first_got) == sorted(_key(r) for r in batch_b)
    nothing = await http.get(f"/v1/consumers/{late}/messages", params={"wait_ms": 300})
    assert nothing.json() == {"messages": []}

    # Older than everything: the start; newer than everything: the end (nothing to deliver).
    seek = await http.post(
        "/v1/topics/default/timed/subscriptions/s/seek", json={"position": {"timestamp_ms": 0}}
    )
    assert {p["offset"] for p in seek.json()["partitions"]} == {0}
    future = int(time.time() * 1000) + 3_600_000
    seek = await http.post(
        "/v1/topics/default/timed/subscriptions/s/seek",
        json={"position": {"timestamp_ms": future}},
    )
    ends: dict[str, int] = {}
    for result in batch_a + batch_b:
        ends[result["partition"]] = max(ends.get(result["partition"], 0), result["offset"] + 1)
    assert {p["name"]: p["offset"] for p in seek.json()["partitions"]} == ends


async def test_seek_earliest_then_to_an_offset_over_http(http: httpx.AsyncClient) -> None:
    cid = await _attach(http, "default/rewind/subscriptions/s", start="earliest")
    await _produce(http, "default/rewind", [f"m{i}" for i in range(5)])
    got = await _poll_until(http, cid, 5)
    assert (await http.post(f"/v1/consumers/{cid}/ack", json={"messages": _refs(got)})).is_success
    path = "/v1/topics/default/rewind/subscriptions/s/seek"
    seek = await http.post(path, json={"position": "earliest"})
    assert seek.json() == {"partitions": [{"name": "/default/rewind", "offset": 0}]}
    again = await _poll_until(http, cid, 5)
    assert [(m["offset"], m["payload"]) for m in again] == [(i, f"m{i}") for i in range(5)]
    seek = await http.post(path, json={"position": {"offset": 3}})
    assert seek.json() == {"partitions": [{"name": "/default/rewind", "offset": 3}]}
    assert [m["offset"] for m in await _poll_until(http, cid, 2)] == [3, 4]


async def test_seek_or_start_past_the_end_is_refused_and_the_next_message_still_comes(
    http: httpx.AsyncClient,
) -> None:
    cid = await _attach(http, "default/ends/subscriptions/s", start="earliest")
    await _produce(http, "default/ends", [f"m{i}" for i in range(9)])  # offsets 0..8
    got = await _poll_until(http, cid, 9)
    assert (await http.post(f"/v1/consumers/{cid}/ack", json={"messages": _refs(got)})).is_success
    path = "/v1/topics/default/ends/subscriptions/s/seek"
    refused = await http.post(path, json={"position": {"offset": 1000}})
    assert _error(refused) == (400, "offset_out_of_range")
    message = refused.json()["error"]["message"]
    for named in ("/default/ends", "1000", "[0, 9]"):  # partition, offset, valid range
        assert named in message
    # The end itself is "the next message": accepted, and offset 9 is delivered.
    seek = await http.post(path, json={"position": {"offset": 9}})
    assert seek.json() == {"partitions": [{"name": "/default/ends", "offset": 9}]}
    await _produce(http, "default/ends", ["m9"])
    (next_one,) = await _poll_until(http, cid, 1)
    assert (next_one["offset"], next_one["payload"]) == (9, "m9")

    # A new subscription starting past the end is refused and nothing of it is stored.
    start = {"name": "c", "start": {"offset": 11}}
    late = await http.post("/v1/topics/default/ends/subscriptions/late/consumers", json=start)
    assert _error(late) == (400, "offset_out_of_range")
    assert "late" not in await _subscriptions(http, "default/ends")

    # Partitioned: past the end of both partitions, the refusal names the first.
    assert (await http.put("/v1/topics/default/ends2", json={"partitions": 2})).status_code == 201
    await _attach(http, "default/ends2/subscriptions/s", start="earliest")
    await _produce(http, "default/ends2", [f"k{i}" for i in range(6)])
    refused = await http.post(
        "/v1/topics/default/ends2/subscriptions/s/seek", json={"position": {"offset": 7}}
    )
    assert _error(refused) == (400, "offset_out_of_range")
    assert "/default/ends2-part-0" in refused.json()["error"]["message"]


async def test_list_shows_backlog_that_goes_down_with_acks_and_delete_starts_afresh(
    own_http: httpx.AsyncClient, store: MetaStore
) -> None:
    http = own_http  # a mesh on this test's etcd prefix: ``store`` reads and writes its keys
    assert (await http.put("/v1/topics/default/lagging", json={"partitions": 2})).status_code == 201
    cid = await _attach(
        http, "default/lagging/subscriptions/s", name="w", type="shared", start="earliest"
    )
    results = await _produce(http, "default/lagging", [f"k{i}" for i in range(8)])
    per_partition = {p: sum(r["partition"] == p for r in results) for p in _firsts(results)}
    names = ["/default/lagging-part-0", "/default/lagging-part-1"]

    listed = (await _subscriptions(http, "default/lagging"))["s"]
    assert (listed["type"], listed["backlog"]) == ("shared", 8)
    assert listed["owner"] is not None
    assert [p["name"] for p in listed["partitions"]] == names
    for row in listed["partitions"]:
        assert row["backlog"] == row["end_offset"] == per_partition.get(row["name"], 0)
        assert row["cursor"] == 0
    assert listed["consumers"] == [{"consumer_id": cid, "name": "w", "unacked": 0}]

    got = await _poll_until(http, cid, 8)
    acked = got[:5]
    assert (await http.post(f"/v1/consumers/{cid}/ack", json={"messages": _refs(acked)})).is_success
    listed = (await _subscriptions(http, "default/lagging"))["s"]
    assert listed["backlog"] == 3
    assert listed["consumers"] == [{"consumer_id": cid, "name": "w", "unacked": 3}]
    for row in listed["partitions"]:
        unacked = [m for m in got[5:] if m["partition"] == row["name"]]
        assert row["backlog"] == len(unacked)
    described = (await http.get("/v1/topics/default/lagging")).json()
    assert [(s["name"], s["backlog"]) for s in described["subscriptions"]] == [("s", 3)]

    # A subscription nobody serves is listed from etcd (its stored cursor) without a claim.
    topic = TopicName("default", "lagging")
    offline = SubscriptionConfig(type="failover", initial_position="earliest", created_ms=1)
    await store.put_model(meta_keys.subscription_key(topic, "offline"), offline)
    part0 = topic.partition_name(0)
    stored = SubscriptionCursor(next_offset=1, acked_beyond=(2,), updated_ms=1)
    await store.put_model(meta_keys.subscription_cursor_key(topic, "offline", part0), stored)
    listed_all = await _subscriptions(http, "default/lagging")
    assert sorted(listed_all) == ["offline", "s"]
    off = listed_all["offline"]
    assert (off["type"], off["owner"], off["consumers"]) == ("failover", None, [])
    end0 = per_partition.get(names[0], 0)
    row0, row1 = off["partitions"]
    assert (row0["cursor"], row0["acked_beyond"], row0["end_offset"]) == (1, 1, end0)
    assert row0["backlog"] == max(0, end0 - 1 - (1 if end0 > 2 else 0))
    assert (row1["cursor"], row1["backlog"]) == (None, None)  # no cursor stored there
    assert off["backlog"] == row0["backlog"]
    assert await store.get(meta_keys.subscription_owner_key(topic, "offline")) is None

    # Delete: gone from the list, its consumer with it; a new attach starts where it says.
    deleted = await http.delete("/v1/topics/default/lagging/subscriptions/s")
    assert deleted.status_code == 204, deleted.text
    assert sorted(await _subscriptions(http, "default/lagging")) == ["offline"]
    assert await store.range(meta_keys.subscription_prefix(topic, "s")) == []
    gone = await http.get(f"/v1/consumers/{cid}/messages", params={"wait_ms": 0})
    assert _error(gone) == (404, "consumer_not_found")
    # Said as what happened, not "no consumer was ever attached" (issue 35).
    assert gone.json()["error"]["message"] == (
        "subscription 's' of /default/lagging does not exist (it was deleted, or no consumer "
        "ever attached to it): attach again to create it"
    )
    again = await _attach(http, "default/lagging/subscriptions/s", type="exclusive")
    fresh = (await _subscriptions(http, "default/lagging"))["s"]
    assert (fresh["type"], fresh["backlog"]) == ("exclusive", 0)  # latest: nothing behind
    assert [p["cursor"] for p in fresh["partitions"]] == [per_partition.get(n, 0) for n in names]
    await _produce(http, "default/lagging", ["after"])
    (after,) = await _poll_until(http, again, 1)
    assert (after["payload"], after["redelivery_count"]) == ("after", 0)


async def test_subscription_admin_refusals(http: httpx.AsyncClient) -> None:
    await _attach(http, "default/admin/subscriptions/s")
    seek = "/v1/topics/default/admin/subscriptions/s/seek"
    for body, code in [
        ({"position": "first"}, "invalid_request"),
        # An offset out of range is that (not an unknown field to the position's other shapes).
        ({"position": {"offset": -1}}, "invalid_request"),
        ({"position": {"timestamp_ms": 2**63}}, "invalid_request"),
        ({"position": {"offset": 1, "timestamp_ms": 2}}, "unknown_field"),
        ({}, "invalid_request"),
        ({"position": "earliest", "force": True}, "unknown_field"),
    ]:
        assert _error(await http.post(seek, json=body)) == (400, code), body
    missing = "/v1/topics/default/admin/subscriptions/nope"
    assert _error(await http.post(f"{missing}/seek", json={"position": "earliest"})) == (
        404,
        "subscription_not_found",
    )
    assert _error(await http.delete(missing)) == (404, "subscription_not_found")
    assert _error(await http.delete("/v1/topics/default/absent/subscriptions/s")) == (
        404,
        "topic_not_found",
    )
    assert _error(await http.get("/v1/topics/default/absent/subscriptions")) == (
        404,
        "topic_not_found",
    )
    bad_name = "/v1/topics/default/admin/subscriptions/a.b"
    assert _error(await http.delete(bad_name)) == (400, "invalid_name")


@pytest.fixture
def http(consume_http: httpx.AsyncClient) -> httpx.AsyncClient:
    """The subscription admin tests' name for the consume mesh's client."""
    return consume_http


@pytest.fixture
async def own_http(consume_mesh: ConsumeMesh) -> AsyncIterator[httpx.AsyncClient]:
    """A consume mesh of the test's own, on its etcd prefix (``meta_prefix``, ``store``)."""
    async with consume_mesh() as client:
        yield client


async def test_ack_by_ranges_acks_every_offset_of_them_and_bad_ranges_are_400(
    consume_http: httpx.AsyncClient,
) -> None:
    path = "default/ranged/subscriptions/s"
    cid = await _attach(consume_http, path, start="earliest")
    messages = [{"payload": f"m{i}"} for i in range(6)]
    produced = await consume_http.post(
        "/v1/topics/default/ranged/messages", json={"messages": messages}
    )
    assert produced.status_code == 200, produced.text
    got = await _poll_until(consume_http, cid, 6)
    partition, offsets = got[0]["partition"], [m["offset"] for m in got]
    bad_bodies = [
        ({"ranges": [{"partition": partition, "first": 3, "last": 2}]}, "invalid_request"),
        ({"ranges": []}, "invalid_request"),
        ({"ranges": [{"partition": "/default/other", "first": 0, "last": 1}]}, "invalid_partition"),
    ]
    for body, code in bad_bodies:
        refused = await consume_http.post(f"/v1/consumers/{cid}/ack", json=body)
        assert _error(refused) == (400, code), body
    # Two runs and one single ref: offsets 0-1, 3-4 and 5; offset 2 stays unacked.
    body = {
        "ranges": [
            {"partition": partition, "first": offsets[0], "last": offsets[1]},
            {"partition": partition, "first": offsets[3], "last": offsets[4]},
        ],
        "messages": [{"partition": partition, "offset": offsets[5]}],
    }
    acked = await consume_http.post(f"/v1/consumers/{cid}/ack", json=body)
    assert acked.status_code == 204, acked.text
    assert (await consume_http.delete(f"/v1/consumers/{cid}")).status_code == 204
    again = await _attach(consume_http, path)
    (left,) = await _poll_until(consume_http, again, 1)
    assert (left["offset"], left["payload"]) == (offsets[2], "m2")
    nothing = await consume_http.get(f"/v1/consumers/{again}/messages", params={"wait_ms": 300})
    assert nothing.json() == {"messages": []}

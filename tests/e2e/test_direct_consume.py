"""Lookup, then connect (DESIGN §10) for consume, with real processes: each dispatcher serves
the consumer-id routes and the stream of the subscriptions it owns on its consume door;
attach (on discovery) names the owner's door; the SDK's consumer polls, streams and acks
there, so discovery carries no message; a door asked about a subscription it does not own
answers 421 ``not_leader``; and a subscription moved under a consumer (its dispatcher
killed) costs it a fall back to discovery and an attach, every message delivered, none
acked delivered again."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import orjson
import pytest
import websockets
from doors import metric, registered_doors

from danube.client import AsyncDanubeClient, ConsumerOptions
from danube.client.errors import DeadlineExceededError
from danube.meta import MetaStore, TopicName
from danube.meta import keys as meta_keys
from danube.meta.records import Owner
from danube.security import ensure_signing_key, issue_token
from danube.up import ServerProcess

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]

DISPATCHER_ENV = {"DANUBE_DISPATCHER__LEASE_TTL_S": "2"}


async def _produce(http: httpx.AsyncClient, base: str, topic: str, payloads: list[str]) -> None:
    for first in range(0, len(payloads), 100):
        body = {"messages": [{"payload": p} for p in payloads[first : first + 100]]}
        answer = await http.post(f"{base}/v1/topics/default/{topic}/messages", json=body)
        assert answer.status_code == 200, answer.text


async def _owned_elsewhere(store: MetaStore, topic: TopicName, sub: str, old: str) -> None:
    """Wait until etcd names another owner of ``sub`` than ``old`` (a hand-over done)."""
    key = meta_keys.subscription_owner_key(topic, sub)
    async with asyncio.timeout(30):
        while True:
            owner = await store.get_model(key, Owner)
            if owner is not None and owner.node_id != old:
                return
            await asyncio.sleep(0.1)


def _metrics_url(process: ServerProcess) -> str:
    return f"http://127.0.0.1:{process.spec.port}/metrics"


async def test_the_door_serves_what_its_dispatcher_owns_and_refuses_the_rest(
    services: Callable[..., ServerProcess], store: MetaStore
) -> None:
    services("ingest", "ingest-0")
    discovery = services("discovery", "discovery-0")
    limits = {
        "DANUBE_DISPATCHER__DATA_BODY_BYTES_MAX": "4096",
        "DANUBE_DISPATCHER__DATA_MAX_STREAMS": "1",
    }
    services("dispatcher", "dispatcher-0", **DISPATCHER_ENV, **limits)
    services("dispatcher", "dispatcher-1", **DISPATCHER_ENV, **limits)
    base = f"http://127.0.0.1:{discovery.spec.port}"
    async with httpx.AsyncClient(timeout=10) as http:
        await _produce(http, base, "raw", [f"m-{i}" for i in range(10)])
        attach = await http.post(
            f"{base}/v1/topics/default/raw/subscriptions/s/consumers",
            json={"name": "c", "start": "earliest"},
        )
        assert attach.status_code == 201, attach.text
        cid, url = attach.json()["consumer_id"], attach.json()["url"]
        doors = await registered_doors(store, "dispatcher")
        assert url in doors.values()
        other = next(u for u in doors.values() if u != url)
        # A lookup names the subscription's owner and its door as the attach did.
        looked = await http.get(f"{base}/v1/lookup/default/raw", params={"subscription": "s"})
        owner = next(node for node, door in doors.items() if door == url)
        assert looked.json()["subscription"] == {"name": "s", "owner": owner, "url": url}
        unknown = await http.get(f"{base}/v1/lookup/default/raw", params={"subscription": "x"})
        assert unknown.json()["subscription"] == {"name": "x", "owner": None, "url": None}
        plain = await http.get(f"{base}/v1/lookup/default/raw")
        assert plain.json()["subscription"] is None
        # The owner's door: a poll in JSON, then an ack, as discovery answers them.
        polled = await http.get(f"{url}/v1/consumers/{cid}/messages", params={"wait_ms": 2000})
        assert polled.status_code == 200, polled.text
        messages = polled.json()["messages"]
        assert [m["payload"] for m in messages] == [f"m-{i}" for i in range(10)]
        assert [m["offset"] for m in messages] == list(range(10))
        ranges = [{"partition": messages[0]["partition"], "first": 0, "last": 9}]
        acked = await http.post(f"{url}/v1/consumers/{cid}/ack", json={"ranges": ranges})
        assert acked.status_code == 204, acked.text
        again = await http.post(f"{url}/v1/consumers/{cid}/ack", json={"ranges": ranges})
        assert again.status_code == 204  # acked before: nothing to name
        # Not owned there: 421 not_leader naming the owner's door.
        misdirected = await http.get(f"{other}/v1/consumers/{cid}/messages", params={"wait_ms": 0})
        assert misdirected.status_code == 421, misdirected.text
        assert misdirected.json()["error"]["code"] == "not_leader"
        assert misdirected.headers["danube-leader-url"] == url
        # A consumer id that is not one: 400; an unknown route: 404; a wrong method: 405.
        bad = await http.get(f"{url}/v1/consumers/not-an-id/messages")
        assert (bad.status_code, bad.json()["error"]["code"]) == (400, "invalid_consumer_id")
        assert (await http.get(f"{url}/v1/topics")).status_code == 404
        for query in ({"max": "0"}, {"wait_ms": "30001"}, {"max": "x"}):
            out_of_range = await http.get(f"{url}/v1/consumers/{cid}/messages", params=query)
            assert (out_of_range.status_code, out_of_range.json()["error"]["code"]) == (
                400,
                "invalid_request",
            ), query
        wrong = await http.put(f"{url}/v1/consumers/{cid}/ack")
        assert (wrong.status_code, wrong.headers["allow"]) == (405, "POST")
        bad_body = await http.post(f"{url}/v1/consumers/{cid}/ack", json={"ranges": []})
        assert (bad_body.status_code, bad_body.json()["error"]["code"]) == (
            400,
            "invalid_request",
        )
        # The door's limits: a body past data_body_bytes_max (413); a second stream past
        # data_max_streams (closed with 4429); the first one streams.
        many = [{"partition": messages[0]["partition"], "offset": o} for o in range(400)]
        too_large = await http.post(f"{url}/v1/consumers/{cid}/ack", json={"messages": many})
        assert (too_large.status_code, too_large.json()["error"]["code"]) == (
            413,
            "body_too_large",
        )
        ws_url = url.replace("http://", "ws://") + f"/v1/consumers/{cid}/stream"
        async with websockets.connect(ws_url, proxy=None) as first:
            await first.send(orjson.dumps({"type": "flow", "credits": 5}).decode())
            async with websockets.connect(ws_url, proxy=None) as second:
                frame = orjson.loads(await second.recv())
                assert frame["error"]["code"] == "too_many_streams"
                with pytest.raises(websockets.ConnectionClosed):
                    await second.recv()
            assert second.close_code == 4429
            await _produce(http, base, "raw", ["streamed"])
            pushed = orjson.loads(await asyncio.wait_for(first.recv(), 10))
            assert (pushed["type"], pushed["payload"], pushed["offset"]) == (
                "message",
                "streamed",
                10,
            )
        # Detach on the door: the consumer is gone (404 consumer_not_found after it).
        assert (await http.delete(f"{url}/v1/consumers/{cid}")).status_code == 204
        gone = await http.get(f"{url}/v1/consumers/{cid}/messages", params={"wait_ms": 0})
        assert (gone.status_code, gone.json()["error"]["code"]) == (404, "consumer_not_found")


def _consume_routes_used(metrics_text: str) -> float:
    """Requests discovery answered on its consumer-id routes (not attach)."""
    total = 0.0
    for line in metrics_text.splitlines():
        if line.startswith("danube_discovery_http_requests_total") and "/v1/consumers/" in line:
            total += float(line.rsplit(" ", 1)[1])
    return total


@pytest.mark.parametrize("mode", ["stream", "poll"])
async def test_a_consumer_receives_and_acks_on_the_owners_door(
    services: Callable[..., ServerProcess], store: MetaStore, mode: str
) -> None:
    services("ingest", "ingest-0")
    discovery = services("discovery", "discovery-0")
    dispatcher = services("dispatcher", "dispatcher-0", **DISPATCHER_ENV)
    base = f"http://127.0.0.1:{discovery.spec.port}"
    payloads = [f"{mode}-{i}" for i in range(300)]
    async with AsyncDanubeClient(base) as sdk, httpx.AsyncClient(timeout=10) as http:
        await _produce(http, base, "direct", payloads)
        before = await metric(http, _metrics_url(dispatcher), "danube_dispatcher_door_messages")
        options = ConsumerOptions(start="earliest", mode=mode, ack_interval_ms=10)  # type: ignore[arg-type]
        async with sdk.consumer("/default/direct", "s", options) as consumer:
            assert (
                consumer.door_url == (await registered_doors(store, "dispatcher"))["dispatcher-0"]
            )
            got = []
            for _ in payloads:
                message = await consumer.receive(timeout_s=20)
                got.append((message.offset, message.payload.decode()))
                consumer.ack(message)
            await consumer.flush_acks()
            assert consumer.door_fallbacks == 0
            assert consumer.acks_failed == 0
        assert got == list(enumerate(payloads))  # every message, in order, once
        delivered = await metric(http, _metrics_url(dispatcher), "danube_dispatcher_door_messages")
        assert delivered - before >= len(payloads)
        # Discovery answered the attach and nothing on the consumer's routes.
        assert _consume_routes_used((await http.get(f"{base}/metrics")).text) == 0
        # Every ack counted: a new consumer of the subscription gets nothing.
        async with sdk.consumer("/default/direct", "s", start="earliest", mode=mode) as again:
            with pytest.raises(DeadlineExceededError):
                await again.receive(timeout_s=2)


async def test_a_subscription_moved_under_a_streaming_consumer_is_followed(
    services: Callable[..., ServerProcess], store: MetaStore
) -> None:
    services("ingest", "ingest-0")
    discovery = services("discovery", "discovery-0")
    dispatchers = {
        f"dispatcher-{n}": services("dispatcher", f"dispatcher-{n}", **DISPATCHER_ENV)
        for n in range(2)
    }
    base = f"http://127.0.0.1:{discovery.spec.port}"
    total = 600
    payloads = [f"m-{i}" for i in range(total)]
    async with AsyncDanubeClient(base) as sdk, httpx.AsyncClient(timeout=10) as http:
        await _produce(http, base, "moved", payloads[:300])
        options = ConsumerOptions(start="earliest", ack_interval_ms=10, reconnect_timeout_s=60)
        async with sdk.consumer("/default/moved", "s", options) as consumer:
            first_door = consumer.door_url
            doors = await registered_doors(store, "dispatcher")
            owner = next(node for node, url in doors.items() if url == first_door)
            seen: dict[int, int] = {}  # offset -> deliveries
            acked: set[int] = set()
            acked_then_delivered: list[int] = []
            while len(seen) < 150:
                message = await consumer.receive(timeout_s=20)
                seen[message.offset] = seen.get(message.offset, 0) + 1
                consumer.ack(message)
            await consumer.flush_acks()
            acked |= set(seen)
            dispatchers[owner].kill()  # SIGKILL: the subscription moves to the other one
            await _produce(http, base, "moved", payloads[300:])
            deadline = time.monotonic() + 90
            while len(seen) < total:
                assert time.monotonic() < deadline, f"{len(seen)} of {total} delivered"
                message = await consumer.receive(timeout_s=60)
                if message.offset in acked:
                    acked_then_delivered.append(message.offset)
                seen[message.offset] = seen.get(message.offset, 0) + 1
                consumer.ack(message)
            await consumer.flush_acks()
            assert consumer.door_fallbacks >= 1
            survivor = next(url for node, url in doors.items() if node != owner)
            assert consumer.door_url in (survivor, None)
        assert sorted(seen) == list(range(total))  # every produced message delivered
        assert acked_then_delivered == []  # nothing whose ack was answered came again


async def test_with_security_on_the_door_asks_who_and_whether_they_may_consume(
    services: Callable[..., ServerProcess], tmp_path: Path
) -> None:
    key = ensure_signing_key(tmp_path / "keys")
    admin = issue_token(key, "admin", 600, issuer="danube", audience="danube")
    stranger = issue_token(key, "mallory", 600, issuer="danube", audience="danube")
    secure = {
        "DANUBE_SECURITY__ENABLED": "true",
        "DANUBE_SECURITY__KEYS_DIR": str(tmp_path / "keys"),
        "DANUBE_SECURITY__SUPER_ADMINS": '["admin"]',
    }
    services("ingest", "ingest-0", **secure)
    discovery = services("discovery", "discovery-0", **secure)
    services("dispatcher", "dispatcher-0", **secure, **DISPATCHER_ENV)
    base = f"http://127.0.0.1:{discovery.spec.port}"
    as_admin = {"authorization": f"Bearer {admin}"}
    async with httpx.AsyncClient(timeout=10) as http:
        await http.put(f"{base}/v1/topics/default/guarded", json={}, headers=as_admin)
        attach = await http.post(
            f"{base}/v1/topics/default/guarded/subscriptions/s/consumers",
            json={"name": "c", "start": "earliest"},
            headers=as_admin,
        )
        assert attach.status_code == 201, attach.text
        cid, url = attach.json()["consumer_id"], attach.json()["url"]
        poll = f"{url}/v1/consumers/{cid}/messages"
        nobody = await http.get(poll, params={"wait_ms": 0})
        assert (nobody.status_code, nobody.json()["error"]["code"]) == (401, "unauthenticated")
        denied = await http.get(
            poll, params={"wait_ms": 0}, headers={"authorization": f"Bearer {stranger}"}
        )
        assert denied.status_code == 403, denied.text
        assert "Consume" in denied.json()["error"]["message"]
        allowed = await http.get(poll, params={"wait_ms": 0}, headers=as_admin)
        assert allowed.status_code == 200, allowed.text
        # A stream without a token is accepted, told why, and closed with 4401.
        ws_url = url.replace("http://", "ws://") + f"/v1/consumers/{cid}/stream"
        async with websockets.connect(ws_url, proxy=None) as ws:
            frame = orjson.loads(await ws.recv())
            assert frame["error"]["code"] == "unauthenticated"
            with pytest.raises(websockets.ConnectionClosed):
                await ws.recv()
        assert ws.close_code == 4401
        detached = await http.delete(f"{url}/v1/consumers/{cid}", headers=as_admin)
        assert detached.status_code == 204, detached.text
    # The SDK with the token streams through the door.
    async with AsyncDanubeClient(base, token=admin) as sdk:
        await sdk.producer("/default/guarded").send_and_wait(b"secret")
        async with sdk.consumer("/default/guarded", "s", start="earliest") as consumer:
            assert consumer.door_url == url
            message = await consumer.receive(timeout_s=20)
            assert message.payload == b"secret"
            consumer.ack(message)
            await consumer.flush_acks()
            assert consumer.acks_failed == 0


@pytest.mark.parametrize("mode", ["stream", "poll"])
async def test_a_subscription_handed_over_under_a_consumer_costs_it_a_421_not_a_timeout(
    services: Callable[..., ServerProcess], store: MetaStore, mode: str
) -> None:
    services("ingest", "ingest-0")
    discovery = services("discovery", "discovery-0")
    balance = {**DISPATCHER_ENV, "DANUBE_DISPATCHER__BALANCE_INTERVAL_S": "0.5"}
    services("dispatcher", "dispatcher-0", **balance)
    services("dispatcher", "dispatcher-1", **balance)
    base = f"http://127.0.0.1:{discovery.spec.port}"
    total = 400
    payloads = [f"h-{i}" for i in range(total)]
    async with AsyncDanubeClient(base) as sdk, httpx.AsyncClient(timeout=10) as http:
        await _produce(http, base, "handed", payloads[:200])
        options = ConsumerOptions(start="earliest", mode=mode, ack_interval_ms=10)  # type: ignore[arg-type]
        async with sdk.consumer("/default/handed", "s", options) as consumer:
            doors = await registered_doors(store, "dispatcher")
            owner = next(node for node, url in doors.items() if url == consumer.door_url)
            survivor = next(url for node, url in doors.items() if node != owner)
            seen: dict[int, str] = {}
            while len(seen) < 100:
                message = await consumer.receive(timeout_s=20)
                seen[message.offset] = message.payload.decode()
                consumer.ack(message)
            await consumer.flush_acks()
            acked = set(seen)
            # The owner drained: it hands the subscription over (a clean hand-over, no crash).
            drained = await http.post(f"{base}/v1/nodes/{owner}/drain")
            assert drained.status_code in (200, 201), drained.text
            await _owned_elsewhere(store, TopicName("default", "handed"), "s", owner)
            await _produce(http, base, "handed", payloads[200:])
            started = time.monotonic()
            again: list[int] = []
            while len(seen) < total:
                message = await consumer.receive(timeout_s=30)
                if message.offset in acked:
                    again.append(message.offset)
                seen[message.offset] = message.payload.decode()
                consumer.ack(message)
            took_s = time.monotonic() - started
            await consumer.flush_acks()
            assert consumer.door_fallbacks >= 1  # a 421 (or a closed stream), then discovery
            assert consumer.door_url == survivor  # the new attach named the new owner's door
            assert consumer.acks_failed == 0
        assert [seen[o] for o in range(total)] == payloads  # every message, once at least
        assert again == []  # nothing whose ack was answered came again
        assert took_s < 20, took_s  # followed at once, not after a session timeout

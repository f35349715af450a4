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

import httpx
import pytest

from danube.bus import TopicName
from danube.client import AsyncDanubeClient, ConsumerOptions
from danube.meta import MetaStore
from danube.meta import keys as meta_keys
from danube.meta.records import NodeRecord
from danube.up import ServerProcess

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]

DISPATCHER_ENV = {"DANUBE_DISPATCHER__LEASE_TTL_S": "2"}


async def _doors(store: MetaStore) -> dict[str, str]:
    """Each dispatcher's consume door, as it registered it."""
    doors = {}
    for kv in await store.range(meta_keys.nodes_prefix("dispatcher")):
        record = NodeRecord.model_validate_json(kv.value)
        assert record.data_url is not None, f"{record.node_id} registered no consume door"
        doors[record.node_id] = record.data_url
    return doors


async def _metric(http: httpx.AsyncClient, url: str, name: str) -> float:
    text = (await http.get(url)).text
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith(name) and not line.startswith("#")
    )


async def _produce(http: httpx.AsyncClient, base: str, topic: str, payloads: list[str]) -> None:
    for first in range(0, len(payloads), 100):
        body = {"messages": [{"payload": p} for p in payloads[first : first + 100]]}
        answer = await http.post(f"{base}/v1/topics/default/{topic}/messages", json=body)
        assert answer.status_code == 200, answer.text


def _metrics_url(process: ServerProcess) -> str:
    return f"http://127.0.0.1:{process.spec.port}/metrics"


async def test_the_door_serves_what_its_dispatcher_owns_and_refuses_the_rest(
    services: Callable[..., ServerProcess], store: MetaStore
) -> None:
    services("ingest", "ingest-0")
    discovery = services("discovery", "discovery-0")
    services("dispatcher", "dispatcher-0", **DISPATCHER_ENV)
    services("dispatcher", "dispatcher-1", **DISPATCHER_ENV)
    base = f"http://127.0.0.1:{discovery.spec.port}"
    async with httpx.AsyncClient(timeout=10) as http:
        await _produce(http, base, "raw", [f"m-{i}" for i in range(10)])
        attach = await http.post(
            f"{base}/v1/topics/default/raw/subscriptions/s/consumers",
            json={"name": "c", "start": "earliest"},
        )
        assert attach.status_code == 201, attach.text
        cid, url = attach.json()["consumer_id"], attach.json()["url"]
        doors = await _doors(store)
        assert url in doors.values()
        other = next(u for u in doors.values() if u != url)
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
        misdirected = await http.get(
            f"{other}/v1/consumers/{cid}/messages", params={"wait_ms": 0}
        )
        assert misdirected.status_code == 421, misdirected.text
        assert misdirected.json()["error"]["code"] == "not_leader"
        assert misdirected.headers["danube-leader-url"] == url
        # A consumer id that is not one: 400; an unknown route: 404; a wrong method: 405.
        bad = await http.get(f"{url}/v1/consumers/not-an-id/messages")
        assert (bad.status_code, bad.json()["error"]["code"]) == (400, "invalid_consumer_id")
        assert (await http.get(f"{url}/v1/topics")).status_code == 404
        wrong = await http.put(f"{url}/v1/consumers/{cid}/ack")
        assert (wrong.status_code, wrong.headers["allow"]) == (405, "POST")
        bad_body = await http.post(f"{url}/v1/consumers/{cid}/ack", json={"ranges": []})
        assert (bad_body.status_code, bad_body.json()["error"]["code"]) == (
            400,
            "invalid_request",
        )
        # Detach on the door: the consumer is gone (404 consumer_not_found after it).
        assert (await http.delete(f"{url}/v1/consumers/{cid}")).status_code == 204
        gone = await http.get(f"{url}/v1/consumers/{cid}/messages", params={"wait_ms": 0})
        assert (gone.status_code, gone.json()["error"]["code"]) == (404, "consumer_not_found")

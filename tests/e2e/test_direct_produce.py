"""Lookup, then connect (DESIGN §10) with real processes: ingest nodes serve the produce of
the partitions they lead on their data doors; a lookup names each leader's door; the SDK
posts there, so discovery carries no message; a door asked for a partition it does not lead
answers 421 ``not_leader`` naming the leader; and a leadership moved under a producer costs
it one redirect, not a timeout, every message stored once (tests/history.py)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import httpx
import pytest
from doors import metric, registered_doors

from danube.bus import TopicName
from danube.client import AsyncDanubeClient
from danube.client._records import encode_frame
from danube.meta import MetaStore
from danube.meta import keys as meta_keys
from danube.meta.records import NodeRecord
from danube.up import ServerProcess
from tests.history import History

from replication import Cluster, connect, leader, new_leader, read_all, wait_isr

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]

RECORDS = "application/vnd.danube.records"


async def test_a_producer_posts_to_the_leaders_doors_and_discovery_carries_no_message(
    cluster: Callable[..., Cluster],
    services: Callable[..., ServerProcess],
    store: MetaStore,
    nats_url: str,
) -> None:
    cluster(2, factor=1, min_insync=1)
    discovery = services("discovery", "discovery-0")
    base = f"http://127.0.0.1:{discovery.spec.port}"
    topic = TopicName("default", "direct")
    history = History()
    async with AsyncDanubeClient(base) as sdk, httpx.AsyncClient(timeout=10) as http:
        await sdk.admin.create_topic(topic, partitions=4)
        producer = sdk.producer(topic, linger_ms=1)
        await producer.send_and_wait(b"warm-up", key="k-0")  # every leader elected
        looked = (await http.get(f"{base}/v1/lookup/default/direct")).json()
        doors = await registered_doors(store, "ingest")
        assert len(set(doors.values())) == 2
        for partition in looked["partitions"]:
            owner = partition["owner"]
            assert owner is not None
            assert partition["url"] == doors[owner["node_id"]]
        # The SDK's admin (and `danube admin topics lookup`) read the same doors.
        assert [p.url for p in (await sdk.admin.lookup(topic)).partitions] == [
            p["url"] for p in looked["partitions"]
        ]
        produced_before = await metric(
            http, f"{base}/metrics", "danube_discovery_messages_produced_total"
        )
        ids = [f"m-{i}" for i in range(400)]
        futures = [await producer.send(i.encode(), key=f"k-{n % 16}") for n, i in enumerate(ids)]
        for msg_id, result in zip(ids, await asyncio.gather(*futures), strict=True):
            history.produced(msg_id, partition=result.partition, offset=result.offset, acked=True)
        await producer.close()
        produced_after = await metric(
            http, f"{base}/metrics", "danube_discovery_messages_produced_total"
        )
        through_doors = 0.0
        for kv in await store.range(meta_keys.nodes_prefix("ingest")):
            address = NodeRecord.model_validate_json(kv.value).address
            through_doors += await metric(
                http, f"http://{address}/metrics", "danube_ingest_door_messages_total"
            )
    assert produced_after == produced_before, "discovery carried messages"
    assert through_doors == 401  # and the warm-up
    bus, client = await connect(nats_url, "direct-reader")
    try:
        stored = 0
        for index in range(4):
            offsets = await read_all(client, topic.partition_name(index), history)
            assert offsets == list(range(len(offsets)))
            stored += len(offsets)
    finally:
        await bus.close()
    assert stored == 401
    report = history.check(exactly_once=True)
    assert report.ok, report.summary()


async def test_a_door_answers_only_for_what_its_node_leads(
    cluster: Callable[..., Cluster],
    services: Callable[..., ServerProcess],
    store: MetaStore,
) -> None:
    """421 ``not_leader`` naming the leader's door, nothing stored; the leader's door stores
    the same body; another type, encoding or route is refused, and a body over the limit."""
    cluster(2, factor=1, min_insync=1, DANUBE_INGEST__DATA_BODY_BYTES_MAX="4096")
    discovery = services("discovery", "discovery-0")
    base = f"http://127.0.0.1:{discovery.spec.port}"
    body = b"".join(
        encode_frame(
            f"p{i}".encode(),
            None,
            None,
            producer=b"curl",
            max_payload_bytes=1024,
            sequenced=False,
            codec=0,
        )
        for i in range(3)
    )
    async with AsyncDanubeClient(base) as sdk, httpx.AsyncClient(timeout=10) as http:
        await sdk.admin.create_topic(TopicName("default", "doors"), partitions=1)
        await sdk.producer(TopicName("default", "doors")).send_and_wait(b"elect")
        owner = await leader(store, TopicName("default", "doors-part-0"))
        doors = await registered_doors(store, "ingest")
        (other,) = [node for node in doors if node != owner.node_id]
        path = "/v1/topics/default/doors-part-0/messages"
        refused = await http.post(
            doors[other] + path, content=body, headers={"content-type": RECORDS}
        )
        assert refused.status_code == 421, refused.text
        assert refused.json()["error"]["code"] == "not_leader"
        assert refused.headers["danube-leader-url"] == doors[owner.node_id]
        stored = await http.post(
            doors[owner.node_id] + path, content=body, headers={"content-type": RECORDS}
        )
        assert stored.status_code == 200, stored.text
        assert stored.json() == {
            "runs": [{"partition": "/default/doors-part-0", "offset": 1, "count": 3}],
            "partitions": 1,
        }  # offset 0 is "elect": the refused request stored nothing
        door = doors[owner.node_id]
        json_body = await http.post(door + path, json={"messages": [{"payload": "x"}]})
        assert (json_body.status_code, json_body.json()["error"]["code"]) == (
            415,
            "unsupported_media_type",
        )
        gzipped = await http.post(
            door + path,
            content=body,
            headers={"content-type": RECORDS, "content-encoding": "gzip"},
        )
        assert gzipped.json()["error"]["code"] == "unsupported_content_encoding"
        missing = await http.post(
            door + "/v1/topics/default/nope/messages",
            content=body,
            headers={"content-type": RECORDS},
        )
        assert (missing.status_code, missing.json()["error"]["code"]) == (503, "no_owner")
        whole = await http.post(
            door + "/v1/topics/default/doors/messages",
            content=body,
            headers={"content-type": RECORDS},
        )
        assert (whole.status_code, whole.json()["error"]["code"]) == (400, "partition_required")
        assert (await http.get(door + "/v1/lookup/default/doors")).status_code == 404
        # A producer over the topic's publish rate meets 429 rate_limited at the door and
        # retries there: every message stored once, at the rate.
        rate = {"policies": {"publish_rate_msgs_s": 20}}
        assert (await http.put(f"{base}/v1/topics/default/paced", json=rate)).status_code == 201
        paced = sdk.producer(TopicName("default", "paced"), linger_ms=0)
        started = time.monotonic()
        results = [await paced.send_and_wait(f"r{i}".encode()) for i in range(40)]
        assert [r.offset for r in results] == list(range(40))
        assert time.monotonic() - started > 1.0  # 40 at 20/s, a burst of 20 allowed first
        await paced.close()
        large = await http.post(door + path, content=body * 200, headers={"content-type": RECORDS})
        assert (large.status_code, large.json()["error"]["code"]) == (413, "body_too_large")


async def test_a_leadership_moved_under_a_producer_costs_it_a_redirect_not_a_timeout(
    cluster: Callable[..., Cluster],
    services: Callable[..., ServerProcess],
    store: MetaStore,
    nats_url: str,
) -> None:
    """A controlled transfer (a reassignment to the same nodes in another order) while an
    SDK producer sends batch after batch: the old leader's door answers ``not_leader``, the
    producer looks up and follows; no batch waits anywhere near its send timeout."""
    cluster(2, factor=2, min_insync=1)
    discovery = services("discovery", "discovery-0")
    base = f"http://127.0.0.1:{discovery.spec.port}"
    topic = TopicName("default", "moved")
    partition = topic.partition_name(0)
    history = History()
    async with AsyncDanubeClient(base) as sdk, httpx.AsyncClient(timeout=10) as http:
        await sdk.admin.create_topic(topic, partitions=1, replication_factor=2)
        producer = sdk.producer(topic, linger_ms=1, send_timeout_s=20)
        await producer.send_and_wait(b"m-0")
        history.produced("m-0", partition=str(partition), offset=0, acked=True)
        await wait_isr(store, partition, 2)
        owner = await leader(store, partition)
        doors = await registered_doors(store, "ingest")
        (other,) = [node for node in doors if node != owner.node_id]
        slowest_s = 0.0
        sent = 1
        stop = asyncio.Event()
        progress = asyncio.Condition()

        async def send() -> None:
            nonlocal slowest_s, sent
            while not stop.is_set():
                msg_id = f"m-{sent}"
                sent += 1
                started = time.monotonic()
                result = await producer.send_and_wait(msg_id.encode())
                slowest_s = max(slowest_s, time.monotonic() - started)
                history.produced(
                    msg_id, partition=result.partition, offset=result.offset, acked=True
                )
                async with progress:
                    progress.notify_all()

        async def sent_past(count: int) -> None:
            async with asyncio.timeout(20), progress:
                await progress.wait_for(lambda: sent >= count)

        sending = asyncio.create_task(send())
        await sent_past(50)  # under way at the old leader
        moved = await http.post(
            f"{base}/v1/partitions/default/{partition.topic}/reassign",
            json={"replicas": [other, owner.node_id]},
        )
        assert moved.status_code == 200, moved.text
        elected = await new_leader(store, partition, owner.epoch)
        assert elected.node_id == other
        await sent_past(sent + 50)  # and on at the new one
        stop.set()
        await sending
        redirects = producer._sequenced.doors.failures if producer._sequenced else -1
        await producer.close()
    assert redirects >= 1, "the producer never met the old leader's refusal"
    assert slowest_s < 2.0, f"a batch took {slowest_s:.2f} s across the move"
    bus, client = await connect(nats_url, "moved-reader")
    try:
        offsets = await read_all(client, partition, history)
    finally:
        await bus.close()
    assert offsets == list(range(sent))
    report = history.check(exactly_once=True)
    assert report.ok, report.summary()
    print(f"moved: {sent} sent, {redirects} redirects, slowest batch {slowest_s * 1000:.0f} ms")

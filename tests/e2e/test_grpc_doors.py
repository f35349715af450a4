"""The ingest leaders' gRPC doors (docs/grpc-api.md, "Ingest doors") with real processes:
discovery's TopicLookup redirects Danube's official client (``danube-client``, driven as a
subprocess: tests/interop/danube_client_driver.py) to each partition's leader, which stores
its messages with no hop through discovery; a leader moved under the client is followed
(one more lookup, at the old door) with nothing lost; lookups answer Redirect or Connect as
documented, and always Connect with ``discovery.grpc_redirect`` off."""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Callable
from typing import Any

import grpc
import httpx
import pytest
from doors import metric, registered_doors

from danube.bus import TopicName
from danube.client import AsyncDanubeClient
from danube.meta import MetaStore
from danube.meta import keys as meta_keys
from danube.meta.records import NodeRecord
from danube.up import ServerProcess, free_port
from danube.wire import DanubeApi_pb2 as pb

from meshrun import ROOT
from replication import Cluster, leader, new_leader, wait_isr

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240)]

CLIENT_PYTHON = ROOT / ".venv-danube-client" / "bin" / "python"
DRIVER = ROOT / "tests" / "interop" / "danube_client_driver.py"
Lookup = pb.TopicLookupResponse


def mesh(
    cluster: Callable[..., Cluster],
    services: Callable[..., ServerProcess],
    *,
    nodes: int,
    factor: int,
) -> tuple[str, str]:
    """Ingest nodes, a discovery instance and a dispatcher: discovery's HTTP and gRPC URLs."""
    assert CLIENT_PYTHON.exists(), "the official client's venv is missing: run `make setup-interop`"
    cluster(nodes, factor=factor, min_insync=1)
    grpc_port = free_port()
    discovery = services("discovery", "discovery-0", DANUBE_DISCOVERY__GRPC_PORT=str(grpc_port))
    services("dispatcher", "dispatcher-0")
    return f"http://127.0.0.1:{discovery.spec.port}", f"http://127.0.0.1:{grpc_port}"


async def drive(grpc_url: str, scenario: str, *args: str, timeout_s: float = 120) -> Any:
    """Run a scenario of the official client; its JSON result."""
    process = await asyncio.create_subprocess_exec(
        str(CLIENT_PYTHON),
        str(DRIVER),
        scenario,
        grpc_url,
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env={k: v for k, v in os.environ.items() if not k.startswith("PYTHON")},
    )
    out, err = await asyncio.wait_for(process.communicate(), timeout_s)
    failed = f"{scenario} failed:\n{out.decode()[-3000:]}\n{err.decode()[-6000:]}"
    assert process.returncode == 0, failed
    return json.loads(out.decode().splitlines()[-1])


async def ingest_metric(http: httpx.AsyncClient, store: MetaStore, name: str) -> float:
    total = 0.0
    for kv in await store.range(meta_keys.nodes_prefix("ingest")):
        address = NodeRecord.model_validate_json(kv.value).address
        total += await metric(http, f"http://{address}/metrics", name)
    return total


async def call(url: str, method: str, request: Any, response_type: Any) -> Any:
    """One unary call of Danube's API at ``url`` (``http://host:port``)."""
    async with grpc.aio.insecure_channel(url.removeprefix("http://")) as channel:
        stub = channel.unary_unary(
            method,
            request_serializer=type(request).SerializeToString,
            response_deserializer=response_type.FromString,
        )
        return await stub(request, timeout=10)


async def lookup(url: str, topic: str) -> Any:
    return await call(
        url, "/danube.Discovery/TopicLookup", pb.TopicLookupRequest(topic=topic), Lookup
    )


async def test_the_official_client_is_redirected_to_the_leaders_and_discovery_carries_nothing(
    cluster: Callable[..., Cluster],
    services: Callable[..., ServerProcess],
    store: MetaStore,
) -> None:
    base, grpc_url = mesh(cluster, services, nodes=2, factor=1)
    topic = TopicName("default", "obo")
    count = 200
    async with AsyncDanubeClient(base) as sdk, httpx.AsyncClient(timeout=10) as http:
        await sdk.admin.create_topic(topic, partitions=2)
        warm = sdk.producer(topic, linger_ms=1)
        await warm.send_and_wait(b"warm-up", key="k-0")  # every leader elected
        await warm.close()
        owners = [await leader(store, topic.partition_name(i)) for i in range(2)]
        doors = await registered_doors(store, "ingest", "grpc_url")
        assert len(set(doors.values())) == 2
        produced_before = await metric(
            http, f"{base}/metrics", "danube_discovery_messages_produced_total"
        )
        through_before = await ingest_metric(http, store, "danube_ingest_grpc_messages_total")
        result = await drive(grpc_url, "one_by_one", "/default/obo", str(count), "2")
        produced_after = await metric(
            http, f"{base}/metrics", "danube_discovery_messages_produced_total"
        )
        through_after = await ingest_metric(http, store, "danube_ingest_grpc_messages_total")
    # Each partition's producer talked to its leader's door itself (no proxy).
    assert result["doors"] == [{"url": doors[o.node_id], "proxy": False} for o in owners]
    assert produced_after == produced_before, "discovery carried messages"
    assert through_after - through_before == count
    received = result["received"]
    assert sorted(m["payload"] for m in received) == sorted(result["sent"])
    for index in range(2):
        mine = [m for m in received if m["topic"] == f"/default/obo-part-{index}"]
        # Round robin: partition i got every other message, in the order sent, at
        # consecutive offsets.
        assert [int(m["attributes"]["index"]) for m in mine] == list(range(index, count, 2))
        offsets = [m["offset"] for m in mine]
        assert offsets == list(range(offsets[0], offsets[0] + len(mine)))


async def test_the_official_client_follows_a_moved_leader_and_loses_nothing(
    cluster: Callable[..., Cluster],
    services: Callable[..., ServerProcess],
    store: MetaStore,
) -> None:
    base, grpc_url = mesh(cluster, services, nodes=2, factor=2)
    topic = TopicName("default", "follow")
    partition = topic.partition_name(0)
    async with AsyncDanubeClient(base) as sdk, httpx.AsyncClient(timeout=10) as http:
        await sdk.admin.create_topic(topic, partitions=1, replication_factor=2)
        warm = sdk.producer(topic, linger_ms=1)
        await warm.send_and_wait(b"warm-up")
        await warm.close()
        await wait_isr(store, partition, 2)
        owner = await leader(store, partition)
        doors = await registered_doors(store, "ingest", "grpc_url")
        (other,) = [node for node in doors if node != owner.node_id]
        process = await asyncio.create_subprocess_exec(
            str(CLIENT_PYTHON),
            str(DRIVER),
            "follow",
            grpc_url,
            "/default/follow",
            "8",
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env={k: v for k, v in os.environ.items() if not k.startswith("PYTHON")},
        )
        assert process.stdout is not None
        ready = await asyncio.wait_for(process.stdout.readline(), 60)
        assert ready.strip() == b"ready", ready
        await asyncio.sleep(2.0)
        moved = await http.post(
            f"{base}/v1/partitions/default/{partition.topic}/reassign",
            json={"replicas": [other, owner.node_id]},
        )
        assert moved.status_code == 200, moved.text
        elected = await new_leader(store, partition, owner.epoch)
        assert elected.node_id == other
        out, err = await asyncio.wait_for(process.communicate(), 90)
    assert process.returncode == 0, f"{out.decode()[-3000:]}\n{err.decode()[-6000:]}"
    result = json.loads(out.decode().splitlines()[-1])
    assert result["before"] == [{"url": doors[owner.node_id], "proxy": False}]
    assert result["after"] == [{"url": doors[other], "proxy": False}]  # it followed
    acked, received = result["acked"], result["received"]
    assert len(acked) > 20
    assert set(acked) <= set(received), "acknowledged messages were lost"
    # In order, each once at least (a send retried across the move may be stored twice).
    firsts = list(dict.fromkeys(received))
    assert firsts == [f"fl-{i}" for i in range(len(firsts))]
    print(f"followed: {len(acked)} acked, slowest send {result['slowest_s'] * 1000:.0f} ms")


async def test_lookups_redirect_to_the_leader_or_connect_to_discovery(
    cluster: Callable[..., Cluster],
    services: Callable[..., ServerProcess],
    store: MetaStore,
) -> None:
    base, grpc_url = mesh(cluster, services, nodes=2, factor=1)
    topic = TopicName("default", "looked")
    async with AsyncDanubeClient(base) as sdk:
        await sdk.admin.create_topic(topic, partitions=2)
        await sdk.admin.create_topic(TopicName("default", "plain"), partitions=0)
        warm = sdk.producer(topic, linger_ms=1)
        await warm.send_and_wait(b"warm-up", key="k-0")
        await warm.close()
        plain = sdk.producer(TopicName("default", "plain"), linger_ms=1)
        await plain.send_and_wait(b"warm-up")
        await plain.close()
    owner = await leader(store, topic.partition_name(0))
    plain_owner = await leader(store, TopicName("default", "plain"))
    doors = await registered_doors(store, "ingest", "grpc_url")
    leader_door = doors[owner.node_id]
    (other_door,) = [url for node, url in doors.items() if node != owner.node_id]

    # Discovery: a partition with a leader, or a topic without partitions: Redirect there.
    answer = await lookup(grpc_url, "/default/looked-part-0")
    assert (answer.response_type, answer.connect_url, answer.broker_url, answer.proxy) == (
        Lookup.Redirect,
        leader_door,
        leader_door,
        False,
    )
    answer = await lookup(grpc_url, "/default/plain")
    assert (answer.response_type, answer.connect_url) == (
        Lookup.Redirect,
        doors[plain_owner.node_id],
    )
    # A partitioned topic's own name, or a topic that does not exist: Connect, itself.
    for name in ("/default/looked", "/default/not-yet"):
        answer = await lookup(grpc_url, name)
        assert (answer.response_type, answer.connect_url, answer.proxy) == (
            Lookup.Connect,
            grpc_url,
            True,
        ), name

    # An ingest door: the leader's door (itself or the other), else discovery's.
    for door in (leader_door, other_door):
        answer = await lookup(door, "/default/looked-part-0")
        assert (answer.response_type, answer.connect_url, answer.proxy) == (
            Lookup.Redirect,
            leader_door,
            False,
        )
        answer = await lookup(door, "/default/not-yet")
        assert (answer.response_type, answer.connect_url, answer.proxy) == (
            Lookup.Connect,
            grpc_url,
            True,
        )
    # A produce at a door that does not lead the partition: UNAVAILABLE not_leader (Danube's
    # clients look the topic up again).
    send = pb.StreamMessage(
        msg_id=pb.MsgID(producer_id=1, topic_name="/default/looked-part-0"), payload=b"x"
    )
    send_path = "/danube.ProducerService/SendMessage"
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await call(other_door, send_path, send, pb.MessageResponse)
    assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
    assert (refused.value.details() or "").startswith("not_leader: ")
    assert leader_door in (refused.value.details() or "")
    stored = await call(leader_door, send_path, send, pb.MessageResponse)
    assert isinstance(stored, pb.MessageResponse)

    # discovery.grpc_redirect off: always Connect with proxy, itself.
    proxy_port = free_port()
    services(
        "discovery",
        "discovery-1",
        DANUBE_DISCOVERY__GRPC_PORT=str(proxy_port),
        DANUBE_DISCOVERY__GRPC_REDIRECT="false",
    )
    proxy_url = f"http://127.0.0.1:{proxy_port}"
    for name in ("/default/looked-part-0", "/default/plain", "/default/not-yet"):
        answer = await lookup(proxy_url, name)
        assert (answer.response_type, answer.connect_url, answer.proxy) == (
            Lookup.Connect,
            proxy_url,
            True,
        ), name

"""Partition growth (docs/http-api.md, "Growing a topic"): PATCH of ``partitions`` and its
codes, and 4 -> 8 partitions under a keyed SDK producer with a consumer attached: every
acknowledged message read back once, and the keys that move exactly those FNV-1a predicts; a
subscription resumed after a growth reads the new partitions from their start."""

from __future__ import annotations

import asyncio
import os
import sys
import time
from pathlib import Path

import httpx
import pytest

from danube.client import AsyncDanubeClient, ConflictError, ReceivedMessage
from danube.discovery import app as discovery_app
from danube.discovery.catalog.growth import moved_fraction
from danube.dispatcher import app as dispatcher_app
from danube.ingest import app as ingest_app
from danube.routing import fnv1a_32, partition_for_key
from danube.runtime.service import run_in_process
from tests.integration.conftest import ConsumeMesh, MeshSettings
from tests.readiness import until_ready

pytestmark = pytest.mark.integration

KEYS = [f"key-{i}" for i in range(256)]
ROUNDS_BEFORE = 3  # full rounds of every key before the growth, and as many after it
RECEIVE_TIMEOUT_S = 15.0
# An idempotent producer learns the new count from its leaders' answers once their caches
# heard of the change (a watch; ingest.data_cache_ttl_s, 2 s, while it is broken).
GROWTH_SEEN_S = 10.0


async def test_patch_partitions_grows_only(consume_http: httpx.AsyncClient) -> None:
    http = consume_http
    assert (await http.put("/v1/topics/default/g", json={"partitions": 2})).status_code == 201
    assert (await http.put("/v1/topics/default/flat")).status_code == 201

    grown = await http.patch("/v1/topics/default/g", json={"partitions": 5})
    assert grown.status_code == 200, grown.text
    assert grown.json()["config"]["partitions"] == 5
    lookup = (await http.get("/v1/lookup/default/g")).json()
    assert [p["name"] for p in lookup["partitions"]] == [f"/default/g-part-{i}" for i in range(5)]
    # Placed like a new topic's: each new partition has an owner before the first produce.
    assert all(p["owner"] is not None for p in lookup["partitions"]), lookup

    same = await http.patch("/v1/topics/default/g", json={"partitions": 5})
    assert same.status_code == 200
    assert same.json()["config"]["partitions"] == 5

    def code(answer: httpx.Response) -> tuple[int, str]:
        return answer.status_code, answer.json()["error"]["code"]

    shrink = await http.patch("/v1/topics/default/g", json={"partitions": 3})
    assert code(shrink) == (409, "partitions_cannot_shrink")
    flat = await http.patch("/v1/topics/default/flat", json={"partitions": 4})
    assert code(flat) == (409, "not_partitioned")
    assert (await http.patch("/v1/topics/default/g", json={"partitions": 0})).status_code == 400
    assert (await http.patch("/v1/topics/default/g", json={"partitions": 1025})).status_code == 400
    missing = await http.patch("/v1/topics/default/nope", json={"partitions": 4})
    assert code(missing) == (404, "topic_not_found")
    # Policies and a growth in one PATCH: one compare-and-swap.
    both = await http.patch(
        "/v1/topics/default/g", json={"partitions": 6, "policies": {"max_producers": 3}}
    )
    assert both.status_code == 200
    assert both.json()["config"]["partitions"] == 6
    assert both.json()["config"]["policies"]["max_producers"] == 3

    async with AsyncDanubeClient(str(http.base_url)) as client:
        assert (await client.admin.update_topic("/default/g", partitions=7)).config.partitions == 7
        with pytest.raises(ConflictError) as refused:
            await client.admin.update_topic("/default/g", partitions=2)
        assert refused.value.code == "partitions_cannot_shrink"

    # The CLI: grows, and says why it will not shrink.
    update = ("admin", "topics", "update", "/default/g", "-s", str(http.base_url).rstrip("/"))
    status, out, _ = await _danube(*update, "--partitions", "9")
    assert (status, out.split(":")[0:2]) == (0, ["/default/g", " 9 partitions; policies"]), out
    status, _, err = await _danube(*update, "--partitions", "3")
    assert status != 0
    assert "partitions_cannot_shrink" in err


async def _danube(*args: str) -> tuple[int, str, str]:
    """Run the ``danube`` command; its exit code, stdout and stderr."""
    env = {**os.environ, "COLUMNS": "200", "NO_COLOR": "1"}
    process = await asyncio.create_subprocess_exec(
        str(Path(sys.executable).parent / "danube"),
        *args,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=env,
    )
    async with asyncio.timeout(60):
        out, err = await process.communicate()
    return process.returncode or 0, out.decode(), err.decode()


@pytest.mark.parametrize("idempotent", [True, False])
async def test_growth_under_a_keyed_producer(consume_mesh: ConsumeMesh, idempotent: bool) -> None:
    # An idempotent producer routes itself, over the count its last produce answer gave
    # (from the leaders' doors: the new count once their caches heard of the change); the
    # other is routed by discovery, over the new count at once.
    async with (
        consume_mesh() as http,
        AsyncDanubeClient(str(http.base_url)) as client,
    ):
        topic = "/default/growing"
        await client.admin.create_topic(topic, partitions=4)
        received: list[ReceivedMessage] = []
        async with client.consumer(topic, "s", type="shared", start="earliest") as consumer:
            sent = await _produce_around_growth(client, topic, idempotent=idempotent)
            deadline = time.monotonic() + 60
            while len(received) < len(sent) and time.monotonic() < deadline:
                message = await consumer.receive(RECEIVE_TIMEOUT_S)
                message.ack()
                received.append(message)

    # Every acknowledged message read back, once.
    got = [(m.partition, m.offset, m.payload.decode(), m.key) for m in received]
    assert len(got) == len(set(got)), "a message was read twice"
    assert sorted(got) == sorted(sent)

    # Each message went where the count at its routing said; a key moved at most once.
    before: dict[str, str] = {}
    after: dict[str, str] = {}
    for partition, _, payload, key in sent:
        assert key is not None
        phase = payload.split(":")[0]
        old = f"{topic}-part-{partition_for_key(key, 4)}"
        new = f"{topic}-part-{partition_for_key(key, 8)}"
        assert partition in (old, new), (key, partition)
        if phase == "before":
            assert partition == old
            before[key] = partition
        if phase == "after":
            assert partition == new
            after[key] = partition
    moved = {key for key in KEYS if before[key] != after[key]}
    predicted = {key for key in KEYS if fnv1a_32(key.encode()) % 4 != fnv1a_32(key.encode()) % 8}
    assert moved == predicted
    fraction = moved_fraction([fnv1a_32(key.encode()) for key in KEYS], 4, 8)
    assert len(moved) / len(KEYS) == fraction
    print(
        f"\ngrowth 4 -> 8 (idempotent={idempotent}): {len(sent)} messages sent, read back once; "
        f"{len(moved)} of {len(KEYS)} keys moved ({fraction:.1%}), the keys the formula predicts"
    )


async def _produce_around_growth(
    client: AsyncDanubeClient, topic: str, *, idempotent: bool
) -> list[tuple[str, int, str, str | None]]:
    """Rounds of every key, the growth to 8 sent while a round is in flight, then rounds
    (routed over 8); the sent messages as ``(partition, offset, payload, key)``."""
    sent: list[tuple[str, int, str, str | None]] = []
    producer = client.producer(topic, name="keyed", linger_ms=5, idempotent=idempotent)
    async with producer:

        async def round_of(phase: str, n: int) -> None:
            futures = [(await producer.send(f"{phase}:{n}:{key}", key=key), key) for key in KEYS]
            for future, key in futures:
                result = await future
                sent.append((result.partition, result.offset, f"{phase}:{n}:{key}", key))

        for n in range(ROUNDS_BEFORE):
            await round_of("before", n)
        growth = asyncio.create_task(client.admin.update_topic(topic, partitions=8))
        await round_of("during", 0)
        assert (await growth).config.partitions == 8
        # "during" rounds until the producer routes over the new count (at once for the
        # one discovery routes for; an idempotent one within the doors' cache TTL).
        deadline = time.monotonic() + GROWTH_SEEN_S
        rounds = 1
        while producer.partitions not in (None, 8):
            assert time.monotonic() < deadline, f"still routing over {producer.partitions}"
            await round_of("during", rounds)
            rounds += 1
        for n in range(ROUNDS_BEFORE):
            await round_of("after", n)
    return sent


async def test_a_subscription_resumed_after_a_growth_reads_the_new_partitions(
    mesh_settings: MeshSettings,
) -> None:
    # The topic grows while no dispatcher serves its subscription: the dispatcher that
    # resumes it finds no cursor for the new partitions and reads them from offset 0 (not
    # from the subscription's "latest"), so what was produced to them meanwhile is read.
    settings = mesh_settings()
    base_url = f"http://127.0.0.1:{settings.discovery.port}"
    topic = "/default/regrown"
    async with (
        run_in_process(ingest_app.serve, settings, "ingest-1", must_stop_cleanly=True),
        run_in_process(discovery_app.serve, settings, "disc-1", must_stop_cleanly=True) as task,
        httpx.AsyncClient(base_url=base_url, timeout=30) as http,
        AsyncDanubeClient(base_url) as client,
    ):
        await until_ready(http, task)
        await client.admin.create_topic(topic, partitions=2)
        async with (
            run_in_process(dispatcher_app.serve, settings, "disp-1", must_stop_cleanly=True),
            client.consumer(topic, "s", type="shared", start="latest") as consumer,
            client.producer(topic) as first,
        ):
            sent = await first.send_and_wait("first", key="a")
            received = await consumer.receive(RECEIVE_TIMEOUT_S)
            assert received.offset == sent.offset
            received.ack()  # sent at the latest when the consumer closes
        # No dispatcher now: grow, and produce to every partition.
        await client.admin.update_topic(topic, partitions=4)
        keys = [f"k{i}" for i in range(40)]
        async with client.producer(topic) as producer:
            for key in keys:
                await producer.send(f"v-{key}", key=key)
        assert {partition_for_key(k, 4) for k in keys} == {0, 1, 2, 3}
        async with (
            run_in_process(dispatcher_app.serve, settings, "disp-2", must_stop_cleanly=True),
            client.consumer(topic, "s", type="shared", start="latest") as consumer,
        ):
            got = [await consumer.receive(RECEIVE_TIMEOUT_S) for _ in keys]
            for message in got:
                message.ack()
        assert sorted(m.payload.decode() for m in got) == sorted(f"v-{k}" for k in keys)
        assert {m.partition for m in got} == {f"{topic}-part-{i}" for i in range(4)}

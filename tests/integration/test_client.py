"""The client SDK (danube.client) against discovery, ingest and a dispatcher in-process on
real NATS and etcd: batched produce and its offsets, key routing, consume over the stream
and long-poll in order, acks and nacks, typed errors, and the blocking client."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import httpx
import pytest

from danube.client import (
    AsyncConsumer,
    AsyncDanubeClient,
    ConflictError,
    DanubeClient,
    DeadlineExceededError,
    InvalidArgumentError,
    InvalidMessageError,
    NotFoundError,
    ReceivedMessage,
    Timestamp,
    TooLargeError,
)
from danube.routing import partition_for_key

pytestmark = pytest.mark.integration

BINARY = bytes([0xFF, 0x00, 0xFE, 0x80])
RECEIVE_TIMEOUT_S = 10.0
QUIET_S = 0.7  # "nothing more" means nothing within this long


class CountingTransport(httpx.AsyncBaseTransport):
    """The real transport, counting requests by method and path start, and statuses."""

    def __init__(self) -> None:
        self.inner = httpx.AsyncHTTPTransport()
        self.requests: list[tuple[str, str, str]] = []  # method, host:port, path
        self.statuses: list[int] = []

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        url = request.url
        self.requests.append((request.method, f"{url.host}:{url.port}", url.path))
        response = await self.inner.handle_async_request(request)
        self.statuses.append(response.status_code)
        return response

    async def aclose(self) -> None:
        await self.inner.aclose()

    def count(self, method: str, suffix: str, *, server: httpx.URL | None = None) -> int:
        """Requests of ``method`` whose path ends with ``suffix`` (to ``server`` only)."""
        at = None if server is None else f"{server.host}:{server.port}"
        return sum(
            1
            for m, host, path in self.requests
            if m == method and path.endswith(suffix) and at in (None, host)
        )


@pytest.fixture
async def client(consume_http: httpx.AsyncClient) -> AsyncIterator[AsyncDanubeClient]:
    async with AsyncDanubeClient(str(consume_http.base_url)) as client:
        yield client


async def _receive(consumer: AsyncConsumer, count: int) -> list[ReceivedMessage]:
    return [await consumer.receive(RECEIVE_TIMEOUT_S) for _ in range(count)]


async def _nothing_more(consumer: AsyncConsumer) -> None:
    try:
        extra = await consumer.receive(QUIET_S)
    except DeadlineExceededError:
        return
    raise AssertionError(f"unexpected message {extra}")


async def test_producer_batches_and_offsets_follow_send_order(
    consume_http: httpx.AsyncClient,
) -> None:
    transport = CountingTransport()
    async with (
        AsyncDanubeClient(str(consume_http.base_url), transport=transport) as client,
        client.producer(
            "/default/batched", linger_ms=50, batch_max_messages=100, name="p-batch"
        ) as producer,
    ):
        futures = [await producer.send(f"m{i}".encode()) for i in range(1000)]
        await producer.flush()
        results = [f.result() for f in futures]

    assert [r.offset for r in results] == list(range(1000))
    assert {r.partition for r in results} == {"/default/batched"}
    posts = transport.count("POST", "/messages")
    assert 10 <= posts <= 12, posts  # 100 per batch (a linger may cut one short)


async def test_keys_route_to_one_partition_each_in_send_order(
    client: AsyncDanubeClient,
) -> None:
    created = await client.admin.create_topic("/default/keyed", partitions=3)
    assert (created.created, created.config.partitions) == (True, 3)
    again = await client.admin.create_topic("/default/keyed", partitions=3)
    assert again.created is False
    keys = [f"user-{i % 5}" for i in range(60)]
    async with client.producer("/default/keyed", linger_ms=20) as producer:
        futures = [await producer.send(f"v{i}", key=key) for i, key in enumerate(keys)]
    results = [await f for f in futures]

    for key, result in zip(keys, results, strict=True):
        assert result.partition == f"/default/keyed-part-{partition_for_key(key, 3)}"
    for partition in {r.partition for r in results}:
        offsets = [r.offset for r in results if r.partition == partition]
        assert offsets == list(range(len(offsets)))  # dense, in send order


@pytest.mark.parametrize("direct", [False, True], ids=["proxy", "direct"])
@pytest.mark.parametrize("mode", ["stream", "poll"])
async def test_consumer_receives_exactly_what_was_produced_in_order(
    consume_http: httpx.AsyncClient, mode: str, direct: bool
) -> None:
    transport = CountingTransport()
    async with AsyncDanubeClient(str(consume_http.base_url), transport=transport) as client:
        topic = f"/default/exact-{mode}-{'direct' if direct else 'proxy'}"
        await _produce_and_consume(client, topic, mode, direct=direct)
    polls = transport.count("GET", "/messages", server=consume_http.base_url)
    if direct:  # on the dispatcher's consume door: nothing through the client's server
        assert polls == 0, polls
        if mode == "poll":
            assert transport.count("GET", "/messages") >= 300 / 50, transport.requests
    else:
        assert polls == 0 if mode == "stream" else polls >= 300 / 50, polls


async def _produce_and_consume(
    client: AsyncDanubeClient, topic: str, mode: str, *, direct: bool = True
) -> tuple[list[ReceivedMessage], list[tuple[bytes, str | None, dict[str, str]]]]:
    sent: list[tuple[bytes, str | None, dict[str, str]]] = [
        (f"text-{i}".encode(), f"k{i}", {"i": str(i)}) for i in range(300)
    ]
    sent.insert(7, (BINARY, None, {}))
    async with client.producer(topic, name="p-exact") as producer:
        for payload, key, attributes in sent:
            await producer.send(payload, key=key, attributes=attributes)
    async with client.consumer(
        topic, "s", mode=mode, start="earliest", receiver_queue_size=50, direct=direct
    ) as consumer:
        assert (consumer.door_url is not None) == direct
        got = await _receive(consumer, len(sent))
        await _nothing_more(consumer)
        for message in got:
            message.ack()

    assert [m.offset for m in got] == list(range(len(sent)))
    assert [(m.payload, m.key, dict(m.attributes)) for m in got] == sent
    assert {(m.partition, m.producer, m.redelivery_count) for m in got} == {(topic, "p-exact", 0)}
    assert all(m.publish_time_ms > 0 for m in got)
    return got, sent


@pytest.mark.parametrize("mode", ["stream", "poll"])
async def test_acked_messages_do_not_come_again_and_the_rest_do(
    client: AsyncDanubeClient, mode: str
) -> None:
    topic = f"/default/acks-{mode}"
    async with client.producer(topic) as producer:
        for i in range(10):
            await producer.send(f"a{i}")
    async with client.consumer(topic, "s", mode=mode, type="shared", start="earliest") as first:
        got = await _receive(first, 10)
        for message in got[:6]:
            first.ack(message)
        await first.flush_acks()
    # Closing detached the first consumer: its unacked messages are the next one's at once.
    async with client.consumer(topic, "s", mode=mode, type="shared") as second:
        again = await _receive(second, 4)
        await _nothing_more(second)
    assert [m.text for m in again] == [f"a{i}" for i in range(6, 10)]
    assert [m.redelivery_count for m in again] == [1, 1, 1, 1]


@pytest.mark.parametrize("mode", ["stream", "poll"])
async def test_nack_redelivers_with_a_count(client: AsyncDanubeClient, mode: str) -> None:
    topic = f"/default/nack-{mode}"
    async with client.producer(topic) as producer:
        await producer.send_and_wait("again")
        await producer.send_and_wait("next")
    async with client.consumer(topic, "s", mode=mode, start="earliest") as consumer:
        first, second = await _receive(consumer, 2)
        assert (first.text, first.redelivery_count) == ("again", 0)
        first.nack()
        second.ack()
        (redelivered,) = await _receive(consumer, 1)
        assert (redelivered.offset, redelivered.text) == (0, "again")
        assert redelivered.redelivery_count == 1
        redelivered.ack()
        await _nothing_more(consumer)


async def test_errors_are_typed_with_the_server_code(client: AsyncDanubeClient) -> None:
    with pytest.raises(NotFoundError) as missing:
        await client.producer("/nowhere/t").send_and_wait("x")
    assert (missing.value.status, missing.value.code) == (404, "namespace_not_found")

    await client.admin.create_topic("/default/conf", partitions=2)
    with pytest.raises(ConflictError) as conflict:
        await client.admin.create_topic("/default/conf", partitions=3)
    assert (conflict.value.status, conflict.value.code) == (409, "topic_exists")

    async with client.consumer("/default/conf", "only", type="exclusive"):
        with pytest.raises(ConflictError) as taken:
            await client.subscribe("/default/conf", "only", type="exclusive")
        assert taken.value.code == "subscription_taken"

    with pytest.raises(NotFoundError) as unknown:
        await client.admin.describe_topic("/default/never")
    assert unknown.value.code == "topic_not_found"

    # Refused by the client before anything is sent:
    with pytest.raises(InvalidArgumentError) as bad_name:
        client.producer("/default/bad.name")
    assert bad_name.value.code == "invalid_name"
    producer = client.producer("/default/limits", max_payload_bytes=2 * 1024 * 1024)
    with pytest.raises(InvalidMessageError):
        await producer.send("x", key="k" * 5000)
    # ... and by the server (over ingest.max_message_bytes, 512 KiB): the batch fails typed.
    with pytest.raises(TooLargeError) as too_large:
        await producer.send_and_wait(b"\x00" * (600 * 1024))
    assert (too_large.value.status, too_large.value.code) == (413, "payload_too_large")
    assert await producer.send_and_wait("fits") is not None


async def test_admin_namespaces_topics_lookup_and_cluster(client: AsyncDanubeClient) -> None:
    admin = client.admin
    created = await admin.create_namespace("team-a", max_topics=5)
    assert (created.name, created.max_topics) == ("team-a", 5)
    assert "team-a" in await admin.namespaces()
    await admin.create_topic("/team-a/orders", partitions=2, dispatch="non_reliable")
    assert await admin.topics("team-a") == ["orders"]
    looked = await admin.lookup("/team-a/orders")
    assert looked.dispatch == "non_reliable"
    assert [p.name for p in looked.partitions] == ["/team-a/orders-part-0", "/team-a/orders-part-1"]
    described = await admin.describe_topic("/team-a/orders")
    assert described.config.partitions == 2
    with pytest.raises(ConflictError) as not_empty:
        await admin.delete_namespace("team-a")
    assert not_empty.value.code == "namespace_not_empty"
    await admin.delete_topic("/team-a/orders")
    await admin.delete_namespace("team-a")
    assert "team-a" not in await admin.namespaces()
    cluster = await admin.cluster()
    assert [n.node_id for n in cluster.nodes["ingest"]] == ["ingest-1"]
    assert [n.node_id for n in cluster.nodes["dispatcher"]] == ["disp-1"]


async def test_the_blocking_client_produces_and_consumes(consume_http: httpx.AsyncClient) -> None:
    url = str(consume_http.base_url)

    def roundtrip() -> tuple[list[int], list[str]]:
        with DanubeClient(url) as client:
            with client.producer("/default/sync", linger_ms=10) as producer:
                futures = [producer.send(f"s{i}") for i in range(20)]
                producer.flush()
                offsets = [f.result(timeout=10).offset for f in futures]
            texts = []
            with client.consumer("/default/sync", "s", start="earliest") as consumer:
                for message in consumer:
                    texts.append(message.text)
                    message.ack()
                    if len(texts) == 20:
                        break
                consumer.flush_acks()
            return offsets, texts

    # The mesh runs on this test's loop: the blocking client must run in another thread.
    offsets, texts = await asyncio.to_thread(roundtrip)
    assert offsets == list(range(20))
    assert texts == [f"s{i}" for i in range(20)]


async def test_subscription_admin_lists_seeks_and_deletes(client: AsyncDanubeClient) -> None:
    topic = "/default/subs"
    async with client.producer(topic) as producer:
        for i in range(5):
            await producer.send(f"a{i}")
        await producer.flush()
        await asyncio.sleep(0.05)  # the second half gets a later publish time
        for i in range(5, 10):
            await producer.send(f"a{i}")
    async with client.consumer(topic, "s", type="shared", start="earliest", name="w1") as first:
        got = await _receive(first, 10)
        for message in got[:4]:
            message.ack()
        await first.flush_acks()
        (sub,) = await client.admin.subscriptions(topic)
        assert (sub.name, sub.type, sub.backlog) == ("s", "shared", 6)
        assert [(c.name, c.unacked) for c in sub.consumers] == [("w1", 6)]
        assert [(p.name, p.cursor, p.end_offset) for p in sub.partitions] == [(topic, 4, 10)]

        moved = await client.admin.seek(topic, "s", "earliest")
        assert [(p.name, p.offset) for p in moved] == [(topic, 0)]
        again = await _receive(first, 10)  # acked ones too: the cursor went back
        assert [(m.offset, m.text) for m in again] == [(i, f"a{i}") for i in range(10)]
        for message in again:
            message.ack()

    await client.admin.delete_subscription(topic, "s")
    assert await client.admin.subscriptions(topic) == []
    with pytest.raises(NotFoundError) as gone:
        await client.admin.delete_subscription(topic, "s")
    assert gone.value.code == "subscription_not_found"

    assert got[4].publish_time_ms < got[5].publish_time_ms
    at = Timestamp(got[5].publish_time_ms)
    async with client.consumer(topic, "from-time", start=at) as timed:
        later = await _receive(timed, 5)
        await _nothing_more(timed)
    assert [m.offset for m in later] == [5, 6, 7, 8, 9]

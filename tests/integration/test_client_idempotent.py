"""The SDK's idempotent producer against discovery and ingest on real NATS and etcd: a batch
whose answer is lost (and one sent twice) is stored once, answered with its first offsets;
a partitioned topic gets consecutive sequences per partition, read back from the WAL; a
named producer's new instance fences the old one; a topic partitioned meanwhile is routed
again; a non-reliable topic takes sequenced messages too."""

from __future__ import annotations

import httpx
import pytest

from danube.bus import Bus
from danube.client import AsyncDanubeClient, ConflictError, RetryPolicy
from danube.frame import Record, decode_record
from danube.names import TopicName
from danube.routing import partition_for_key
from danube.wire.ingest.client import IngestClient

pytestmark = pytest.mark.integration

FAST = RetryPolicy(base_s=0.01, cap_s=0.1)


@pytest.fixture
def ingest(consume_bus: Bus) -> IngestClient:
    """The WAL of the consume mesh's ingest, read over its bus."""
    return IngestClient(consume_bus)


async def _stored(ingest: IngestClient, partition: str) -> list[Record]:
    """Every record of the partition's WAL, in offset order."""
    reply = await ingest.fetch(TopicName.parse(partition), 0, max_count=10_000)
    assert [frame.offset for frame in reply.frames] == list(range(len(reply.frames)))
    return [decode_record(frame.payload) for frame in reply.frames]


class LoseAnswers(httpx.AsyncBaseTransport):
    """The real transport; the first ``count`` produce answers are read, then lost (the
    connection reset after the leader stored the batch). Other requests pass, and are noted
    as (method, path); ``before_produce`` runs once, before the first produce goes."""

    def __init__(self, count: int) -> None:
        self.inner = httpx.AsyncHTTPTransport()
        self.left = count
        self.produces: list[bytes] = []
        self.other: list[tuple[str, str]] = []

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        if not request.url.path.endswith("/messages"):
            self.other.append((request.method, request.url.path))
            return await self.inner.handle_async_request(request)
        self.produces.append(await request.aread())
        response = await self.inner.handle_async_request(request)
        await response.aread()
        if self.left > 0 and response.status_code == 200:
            self.left -= 1
            raise httpx.ReadError("connection reset after the answer was sent", request=request)
        return response

    async def aclose(self) -> None:
        await self.inner.aclose()


async def test_a_batch_whose_answer_is_lost_is_stored_once(
    consume_http: httpx.AsyncClient, ingest: IngestClient
) -> None:
    transport = LoseAnswers(count=2)
    url = str(consume_http.base_url)
    async with (
        AsyncDanubeClient(url, transport=transport, retry=FAST) as client,
        client.producer("/default/lost", batch_max_messages=50) as producer,
    ):
        results = await (await producer.send_many([f"m{i}" for i in range(50)]))
        after = await producer.send_and_wait("after")
    assert len(transport.produces) == 4  # the batch three times, then "after"
    assert len(set(transport.produces[:3])) == 1  # every attempt the same bytes
    assert [r.offset for r in results] == list(range(50))
    assert all(r.duplicate for r in results)  # answered by the resend: stored before
    assert (after.offset, after.duplicate) == (50, False)
    stored = await _stored(ingest, "/default/lost")
    assert [r.payload for r in stored] == [f"m{i}".encode() for i in range(50)] + [b"after"]
    assert [(r.producer, r.producer_epoch) for r in stored] == [(producer.name, 0)] * 51
    assert [r.sequence for r in stored] == list(range(51))


async def test_the_same_prepared_batch_sent_twice_is_stored_once(
    consume_http: httpx.AsyncClient, ingest: IngestClient
) -> None:
    async with AsyncDanubeClient(str(consume_http.base_url)) as client:
        producer = client.producer("/default/twice")
        sender = producer._sequenced
        assert sender is not None
        await sender.prepare()
        parts = sender.plan([producer.encode(f"m{i}") for i in range(10)])
        first = await sender.deliver(parts)
        again = await sender.deliver(parts)  # what a retry sends: the same parts' bytes
        await producer.close()
    [(indexes, results)] = first
    [(_, repeated)] = again
    assert indexes == list(range(10))
    assert isinstance(results, list)
    assert isinstance(repeated, list)
    assert [r.offset for r in repeated] == [r.offset for r in results] == list(range(10))
    assert all(r.duplicate for r in repeated)
    assert not any(r.duplicate for r in results)
    assert [r.payload for r in await _stored(ingest, "/default/twice")] == [
        f"m{i}".encode() for i in range(10)
    ]


async def test_a_partitioned_topic_gets_consecutive_sequences_per_partition(
    consume_http: httpx.AsyncClient, ingest: IngestClient
) -> None:
    async with AsyncDanubeClient(str(consume_http.base_url)) as client:
        await client.admin.create_topic("/default/parted", partitions=3)
        async with client.producer("/default/parted", batch_max_messages=8) as producer:
            keyed = [await producer.send(f"k{i}", key=f"user-{i % 7}") for i in range(40)]
            keyless = [await producer.send(f"free{i}") for i in range(24)]
            results = [await f for f in keyed + keyless]
    for i, result in enumerate(results[:40]):
        assert result.partition == f"/default/parted-part-{partition_for_key(f'user-{i % 7}', 3)}"
    total = 0
    for index in range(3):
        stored = await _stored(ingest, f"/default/parted-part-{index}")
        assert [r.sequence for r in stored] == list(range(len(stored)))
        assert {(r.producer, r.producer_epoch) for r in stored} <= {(producer.name, 0)}
        # Each key's messages in send order on its partition.
        for key in {r.key for r in stored if r.key is not None}:
            numbers = [int(r.payload[1:]) for r in stored if r.key == key]
            assert numbers == sorted(numbers)
        total += len(stored)
    assert total == 64


async def test_a_named_producers_new_instance_fences_the_old_one(
    consume_http: httpx.AsyncClient, ingest: IngestClient
) -> None:
    async with AsyncDanubeClient(str(consume_http.base_url)) as client:
        old = client.producer("/default/named", name="billing-writer")
        await old.send_and_wait("old-1")
        new = client.producer("/default/named", name="billing-writer")
        await new.send_and_wait("new-1")
        with pytest.raises(ConflictError) as fenced:
            await old.send_and_wait("old-2")
        assert fenced.value.code == "producer_fenced"
        with pytest.raises(ConflictError):
            await old.send("old-3")  # closed for sending
        await new.send_and_wait("new-2")
        await new.close()
    stored = await _stored(ingest, "/default/named")
    assert [(r.payload, r.producer, r.producer_epoch, r.sequence) for r in stored] == [
        (b"old-1", "billing-writer", 1, 0),
        (b"new-1", "billing-writer", 2, 0),
        (b"new-2", "billing-writer", 2, 1),
    ]


class PartitionOnLookup(httpx.AsyncBaseTransport):
    """The real transport; right after the producer's lookup (which finds no topic), the
    topic is created with 2 partitions: it becomes partitioned between the producer's
    look and its first produce."""

    def __init__(self) -> None:
        self.inner = httpx.AsyncHTTPTransport()
        self.lookups = 0

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        response = await self.inner.handle_async_request(request)
        if request.url.path.startswith("/v1/lookup/") and self.lookups == 0:
            self.lookups += 1
            await response.aread()
            create = httpx.Request(
                "PUT",
                request.url.copy_with(path="/v1/topics/default/later"),
                json={"partitions": 2},
            )
            created = await self.inner.handle_async_request(create)
            await created.aread()
            assert created.status_code == 201
        return response

    async def aclose(self) -> None:
        await self.inner.aclose()


async def test_a_topic_partitioned_meanwhile_is_routed_again(
    consume_http: httpx.AsyncClient, ingest: IngestClient
) -> None:
    url = str(consume_http.base_url)
    async with (
        AsyncDanubeClient(url, transport=PartitionOnLookup()) as client,
        client.producer("/default/later") as producer,
    ):
        results = await (await producer.send_many([f"m{i}" for i in range(5)]))
    (partition,) = {r.partition for r in results}  # keyless: one partition for the batch
    assert partition in ("/default/later-part-0", "/default/later-part-1")
    stored = await _stored(ingest, partition)
    assert [(r.payload, r.sequence) for r in stored] == [(f"m{i}".encode(), i) for i in range(5)]


async def test_a_non_reliable_partitioned_topic_takes_an_idempotent_producers_messages(
    consume_http: httpx.AsyncClient,
) -> None:
    async with AsyncDanubeClient(str(consume_http.base_url)) as client:
        await client.admin.create_topic("/default/live", partitions=2, dispatch="non_reliable")
        consumer = client.consumer("/default/live", "sub", mode="stream")
        async with consumer:
            async with client.producer("/default/live") as producer:
                results = await (await producer.send_many([f"m{i}" for i in range(6)]))
            got = {(await consumer.receive(10.0)).payload for _ in range(6)}
    assert {r.partition for r in results} <= {"/default/live-part-0", "/default/live-part-1"}
    assert got == {f"m{i}".encode() for i in range(6)}

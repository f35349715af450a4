"""`danube bench grpc`: Danube's gRPC API against the HTTP API, in one run, the way each is
used one message at a time (Danube's clients send one unary ``SendMessage`` per message).

Per protocol: ``producers`` senders each send ``count / producers`` messages of ``size``
bytes, one at a time (HTTP: the SDK's producer, each send awaited before the next);
send→stored latency per message; then the topic is consumed from where the subscription
started (gRPC: ``ReceiveMessages`` with an ``Ack`` per message; HTTP: the SDK's stream
consumer), timed until every message arrived. Durability is the topic's (reliable, fsync).
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

from danube.bench.run import payload_of
from danube.bench.stats import Latencies
from danube.cli._common import bearer_token
from danube.client import AsyncDanubeClient, AsyncProducer, ClientTls
from danube.tasks import TaskSet
from danube.wire.client import WireClient, channel_credentials

ACKS_IN_FLIGHT = 256
CONSUME_TIMEOUT_S = 120.0


def _grpc_credentials(tls: ClientTls | None) -> Any:
    """TLS credentials of the gRPC channel from the CLI's CA and client certificate; None
    without (an https:// URL alone: WireClient uses gRPC's default roots)."""
    if tls is None:
        return None
    return channel_credentials(tls.ca_file, tls.cert_file, tls.key_file)


async def grpc_produce_consume(
    grpc_url: str,
    topic: str,
    *,
    size: int,
    count: int,
    producers: int,
    tls: ClientTls | None = None,
) -> dict[str, Any]:
    """Single-message produce over gRPC, then consume it all; rates and latencies."""
    payload = payload_of(size)
    latency = Latencies()
    async with WireClient(
        grpc_url, credentials=_grpc_credentials(tls), token=bearer_token()
    ) as client:
        consumer_id = await client.subscribe(topic, "bench-consumer", "bench-grpc", "exclusive")
        ids = [await client.create_producer(topic, f"bench-{i}") for i in range(producers)]

        async def send_all(producer_id: int, name: str, n: int) -> None:
            for _ in range(n):
                started = time.perf_counter()
                await client.send(topic, producer_id, name, payload)
                latency.add(time.perf_counter() - started)

        shares = [
            count // producers + (1 if i < count % producers else 0) for i in range(producers)
        ]
        started = time.monotonic()
        async with asyncio.TaskGroup() as tg:
            for i, (producer_id, n) in enumerate(zip(ids, shares, strict=True)):
                tg.create_task(send_all(producer_id, f"bench-{i}", n))
        produce_s = time.monotonic() - started

        received = 0
        slots = asyncio.Semaphore(ACKS_IN_FLIGHT)
        # An ack that fails fails the run ("fail"), once the consume is over.
        failed: list[BaseException] = []
        acks = TaskSet("bench acks", on_failure=lambda _, error: failed.append(error))
        started = time.monotonic()
        try:
            async with asyncio.timeout(CONSUME_TIMEOUT_S):
                async for message in client.receive(consumer_id):
                    received += 1
                    await slots.acquire()
                    ack = acks.spawn(client.ack(message), name="ack")
                    ack.add_done_callback(lambda _: slots.release())
                    if received == count:
                        break
                await acks.join(timeout_s=CONSUME_TIMEOUT_S)
        finally:
            await acks.close()
        if failed:
            raise failed[0]
        consume_s = time.monotonic() - started
    return {
        "produced": count,
        "produce_msgs_per_s": round(count / produce_s, 1),
        "produce_latency_ms": latency.summary_ms(),
        "consumed": received,
        "consume_msgs_per_s": round(received / consume_s, 1),
    }


async def http_produce_consume(
    http_url: str,
    topic: str,
    *,
    size: int,
    count: int,
    producers: int,
    tls: ClientTls | None = None,
) -> dict[str, Any]:
    """The same over HTTP with the SDK: each sender sends one message and waits for its
    offset before the next (no batching); then the SDK's stream consumer, acking each."""
    payload = payload_of(size)
    latency = Latencies()
    async with AsyncDanubeClient(http_url, tls=tls, token=bearer_token()) as client:
        senders = [
            client.producer(topic, name=f"bench-{i}", linger_ms=0.0) for i in range(producers)
        ]

        async def send_all(producer: AsyncProducer, n: int) -> None:
            for _ in range(n):
                started = time.perf_counter()
                await producer.send_and_wait(payload)
                latency.add(time.perf_counter() - started)

        shares = _shares(count, producers)
        started = time.monotonic()
        async with asyncio.TaskGroup() as tg:
            for producer, n in zip(senders, shares, strict=True):
                tg.create_task(send_all(producer, n))
        produce_s = time.monotonic() - started
        for producer in senders:
            await producer.close()

        received = 0
        started = time.monotonic()
        consumer = client.consumer(topic, "bench-http", start="earliest")
        async with consumer, asyncio.timeout(CONSUME_TIMEOUT_S):
            while received < count:
                message = await consumer.receive()
                consumer.ack(message)  # acks go in the background, batched
                received += 1
        consume_s = time.monotonic() - started
    return {
        "produced": count,
        "produce_msgs_per_s": round(count / produce_s, 1),
        "produce_latency_ms": latency.summary_ms(),
        "consumed": received,
        "consume_msgs_per_s": round(received / consume_s, 1),
    }


def _shares(count: int, producers: int) -> list[int]:
    return [count // producers + (1 if i < count % producers else 0) for i in range(producers)]


async def compare(
    http_url: str,
    grpc_url: str,
    *,
    size: int,
    count: int,
    producers: int,
    tls: ClientTls | None = None,
) -> dict[str, Any]:
    """Both protocols on fresh topics of the same mesh, gRPC first; ``tls`` the CA and
    client certificate of both APIs when they serve TLS."""
    run_id = uuid.uuid4().hex[:8]
    over_grpc = await _on_fresh_topic(
        http_url,
        f"/default/bench-grpc-{run_id}",
        lambda topic: grpc_produce_consume(
            grpc_url, topic, size=size, count=count, producers=producers, tls=tls
        ),
        tls,
    )
    over_http = await _on_fresh_topic(
        http_url,
        f"/default/bench-http-{run_id}",
        lambda topic: http_produce_consume(
            http_url, topic, size=size, count=count, producers=producers, tls=tls
        ),
        tls,
    )
    return {
        "bench": "grpc",
        "message_size_bytes": size,
        "messages": count,
        "producers": producers,
        "durability": "reliable, fsync",
        "grpc": over_grpc,
        "http": over_http,
        "errors": 0,
    }


async def _on_fresh_topic(
    http_url: str,
    topic: str,
    run: Callable[[str], Awaitable[dict[str, Any]]],
    tls: ClientTls | None,
) -> dict[str, Any]:
    """``run(topic)`` on a topic created for it and deleted after."""
    async with AsyncDanubeClient(http_url, tls=tls, token=bearer_token()) as admin:
        await admin.admin.create_topic(topic, partitions=0)
        try:
            return await run(topic)
        finally:
            await admin.admin.delete_topic(topic)

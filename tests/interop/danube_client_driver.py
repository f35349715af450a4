"""Scenarios run with the official Danube Python client (``danube-client`` from PyPI).

Runs in the client's own virtual environment (its top-level package is also ``danube``), as
``python danube_client_driver.py SCENARIO URL [ARGS...]``; prints one JSON object on the last
line of stdout: what it sent and received, for the test to check. Nothing of the project is
imported here.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from typing import Any

from danube import (
    DanubeClientBuilder,
    DispatchStrategy,
    SchemaType,
    SubType,
    UnrecoverableError,
)

TIME_LIMIT_S = 90.0


async def client(url: str) -> Any:
    return await DanubeClientBuilder().service_url(url).build()


async def producer(c: Any, topic: str, name: str, partitions: int = 0) -> Any:
    builder = (
        c.new_producer()
        .with_topic(topic)
        .with_name(name)
        .with_dispatch_strategy(DispatchStrategy.RELIABLE)
    )
    if partitions:
        builder = builder.with_partitions(partitions)
    p = builder.build()
    await p.create()
    return p


async def consumer(c: Any, topic: str, name: str, sub: str, sub_type: Any, **kw: Any) -> Any:
    builder = (
        c.new_consumer()
        .with_topic(topic)
        .with_consumer_name(name)
        .with_subscription(sub)
        .with_subscription_type(sub_type)
    )
    for pattern in kw.get("filters", []):
        builder = builder.with_key_filter(pattern)
    cons = builder.build()
    await cons.subscribe()
    return cons


def describe(m: Any) -> dict[str, Any]:
    return {
        "topic": m.msg_id.topic_name,
        "offset": m.msg_id.topic_offset,
        "payload": m.payload.decode(),
        "attributes": dict(m.attributes),
        "key": m.routing_key if m.HasField("routing_key") else None,
        "producer": m.producer_name,
        "at": time.monotonic(),
    }


async def take(queue: asyncio.Queue[Any], count: int, timeout_s: float) -> list[Any]:
    got: list[Any] = []
    async with asyncio.timeout(timeout_s):
        while len(got) < count:
            got.append(await queue.get())
    return got


async def roundtrip(url: str, topic: str) -> dict[str, Any]:
    """Exclusive consumer first, then 10 messages with attributes; all received and acked."""
    c = await client(url)
    cons = await consumer(c, topic, "rt-consumer", "rt-sub", SubType.EXCLUSIVE)
    queue = await cons.receive()
    p = await producer(c, topic, "rt-producer")
    for i in range(10):
        await p.send(f"hello-{i}".encode(), {"index": str(i), "kind": "roundtrip"})
    got = await take(queue, 10, 30)
    for m in got:
        await cons.ack(m)
    await cons.close()
    return {"received": [describe(m) for m in got]}


async def partitioned(url: str, topic: str) -> dict[str, Any]:
    """with_partitions(3), keyed sends: every message received, per-key order."""
    c = await client(url)
    p = await producer(c, topic, "part-producer", partitions=3)
    cons = await consumer(c, topic, "part-consumer", "part-sub", SubType.EXCLUSIVE)
    queue = await cons.receive()
    sent = []
    for i in range(60):
        key = f"key-{i % 6}"
        await p.send_with_key(f"{key}:{i}".encode(), {}, key)
        sent.append(f"{key}:{i}")
    got = await take(queue, len(sent), 30)
    for m in got:
        await cons.ack(m)
    await cons.close()
    return {"sent": sent, "received": [describe(m) for m in got]}


async def key_shared(url: str, topic: str) -> dict[str, Any]:
    """Two key-shared consumers: each key on exactly one of them."""
    c = await client(url)
    consumers = [
        await consumer(c, topic, f"ks-{i}", "ks-sub", SubType.KEY_SHARED) for i in range(2)
    ]
    queues = [await cons.receive() for cons in consumers]
    p = await producer(c, topic, "ks-producer")
    total = 100
    for i in range(total):
        key = f"k{i % 10}"
        await p.send_with_key(f"{key}:{i}".encode(), {}, key)
    by_consumer: dict[str, list[dict[str, Any]]] = {"ks-0": [], "ks-1": []}
    received = 0
    async with asyncio.timeout(30):
        while received < total:
            for name, cons, queue in zip(by_consumer, consumers, queues, strict=True):
                while not queue.empty():
                    m = queue.get_nowait()
                    by_consumer[name].append(describe(m))
                    await cons.ack(m)
                    received += 1
            await asyncio.sleep(0.01)
    for cons in consumers:
        await cons.close()
    return {"by_consumer": by_consumer}


async def exclusive_refused(url: str, topic: str) -> dict[str, Any]:
    """A second exclusive consumer on the same subscription is refused."""
    c = await client(url)
    first = await consumer(c, topic, "ex-1", "ex-sub", SubType.EXCLUSIVE)
    try:
        await consumer(c, topic, "ex-2", "ex-sub", SubType.EXCLUSIVE)
    except UnrecoverableError as exc:
        outcome = {"refused": True, "error": str(exc)}
    else:
        outcome = {"refused": False, "error": None}
    await first.close()
    return outcome


async def nack_delay(url: str, topic: str) -> dict[str, Any]:
    """A message nacked with a delay comes again, not before the delay."""
    c = await client(url)
    cons = await consumer(c, topic, "nack-consumer", "nack-sub", SubType.EXCLUSIVE)
    queue = await cons.receive()
    p = await producer(c, topic, "nack-producer")
    await p.send(b"nack-me", {})
    (first,) = await take(queue, 1, 30)
    nacked_at = time.monotonic()
    await cons.nack(first, 1000, "try later")
    (again,) = await take(queue, 1, 30)
    redelivered_after_s = time.monotonic() - nacked_at
    await cons.ack(again)
    await cons.close()
    return {
        "first": describe(first),
        "again": describe(again),
        "redelivered_after_s": redelivered_after_s,
    }


async def survive(url: str, topic: str, seconds: str) -> dict[str, Any]:
    """Produce and consume for ``seconds`` while the test kills services: what was sent
    (acknowledged by the broker) and what was received."""
    c = await client(url)
    cons = await consumer(c, topic, "sv-consumer", "sv-sub", SubType.EXCLUSIVE)
    queue = await cons.receive()
    p = await producer(c, topic, "sv-producer")
    acked: list[str] = []
    received: list[str] = []
    errors: list[str] = []
    ack_errors: list[str] = []
    stop = time.monotonic() + float(seconds)
    print("ready", flush=True)  # the test starts killing after this line

    async def drain() -> None:
        while True:
            m = await queue.get()
            received.append(m.payload.decode())
            try:
                await cons.ack(m)
            except Exception as exc:  # an ack the broker did not store: redelivered, fine
                ack_errors.append(f"{type(exc).__name__}: {str(exc)[:200]}")

    draining = asyncio.create_task(drain())
    i = 0
    while time.monotonic() < stop:
        body = f"sv-{i}"
        try:
            await p.send(body.encode(), {})
            acked.append(body)
            i += 1
        except Exception as exc:  # a send the broker did not acknowledge: try it again
            errors.append(f"{type(exc).__name__}: {str(exc)[:200]}")
            await asyncio.sleep(0.2)
    deadline = time.monotonic() + 45
    while not set(acked) <= set(received) and time.monotonic() < deadline:  # noqa: ASYNC110
        await asyncio.sleep(0.1)  # polled: the drain task appends
    draining.cancel()
    await cons.close()
    return {
        "acked": acked,
        "received": received,
        "errors": errors[-20:],
        "ack_errors": ack_errors[-20:],
    }


async def schema_enforce(url: str, topic: str) -> dict[str, Any]:
    """A JSON schema registered, a producer with its subject, the topic set to enforce: a
    valid payload is stored (with the schema's id and version), one missing a required field
    is refused."""
    c = await client(url)
    registry = c.schema()
    definition = json.dumps(
        {
            "type": "object",
            "properties": {"id": {"type": "integer"}, "item": {"type": "string"}},
            "required": ["id"],
        }
    ).encode()
    subject = f"{topic.rsplit('/', 1)[1]}-value"
    schema_id = await (
        registry.register_schema(subject)
        .with_type(SchemaType.JSON_SCHEMA)
        .with_schema_data(definition)
        .execute()
    )
    again = await (
        registry.register_schema(subject)
        .with_type(SchemaType.JSON_SCHEMA)
        .with_schema_data(definition)
        .execute()
    )
    configured = await registry.configure_topic_schema(topic, subject, "enforce", True)
    cons = await consumer(c, topic, "schema-consumer", "schema-sub", SubType.EXCLUSIVE)
    queue = await cons.receive()
    p = (
        c.new_producer()
        .with_topic(topic)
        .with_name("schema-producer")
        .with_dispatch_strategy(DispatchStrategy.RELIABLE)
        .with_schema_subject(subject)
        .build()
    )
    await p.create()
    await p.send(b'{"id": 1, "item": "book"}', {})
    try:
        await p.send(b'{"item": "no id"}', {})
        refused = None
    except Exception as exc:  # the client raises the gRPC error as it came
        refused = str(exc)
    (got,) = await take(queue, 1, 30)
    await cons.ack(got)
    config = await registry.get_topic_schema_config(topic)
    await cons.close()
    return {
        "schema_id": schema_id,
        "same_id_again": again,
        "configured": list(configured),
        "refused": refused,
        "received": describe(got),
        "received_schema": [got.schema_id, got.schema_version],
        "topic_config": [config.schema_subject, config.validation_policy, config.schema_id],
    }


async def secured(url: str, topic: str, ca_file: str, token: str, stranger: str) -> dict[str, Any]:
    """Over TLS with a bearer token (``with_tls`` + ``with_token``): the producer first (it
    makes the topic: its lookup found none), then the consumer (its lookup finds the topic's
    leader), 5 messages round trip; then a token whose principal has no binding: the
    producer is refused. Where the producer and the consumer talked, too."""
    c = await DanubeClientBuilder().service_url(url).with_tls(ca_file).with_token(token).build()
    p = await producer(c, topic, "sec-producer")
    cons = await consumer(c, topic, "sec-consumer", "sec-sub", SubType.EXCLUSIVE)
    queue = await cons.receive()
    for i in range(5):
        await p.send(f"secret-{i}".encode(), {})
    got = await take(queue, 5, 30)
    for m in got:
        await cons.ack(m)
    consumer_doors = [{"url": tc.connect_url, "proxy": tc.proxy} for tc in cons._consumers.values()]
    await cons.close()
    outsider = (
        await DanubeClientBuilder().service_url(url).with_tls(ca_file).with_token(stranger).build()
    )
    refused = None
    try:
        await producer(outsider, topic, "stranger-producer")
    except Exception as exc:  # the client wraps the gRPC status in its own errors
        refused = f"{type(exc).__name__}: {exc}"
    return {
        "received": [describe(m) for m in got],
        "refused": refused,
        "consumer_doors": consumer_doors,
    }


def doors(p: Any) -> list[dict[str, Any]]:
    """Where each partition's producer talks now (the client's lookup answers)."""
    return [{"url": tp.connect_url, "proxy": tp.proxy} for tp in p._producers]


async def one_by_one(url: str, topic: str, count: str, partitions: str) -> dict[str, Any]:
    """An exclusive consumer, then ``count`` messages sent one at a time (each awaited)
    round robin over ``partitions``: what was sent, received, and where the producers
    talked."""
    c = await client(url)
    cons = await consumer(c, topic, "obo-consumer", "obo-sub", SubType.EXCLUSIVE)
    queue = await cons.receive()
    p = await producer(c, topic, "obo-producer", partitions=int(partitions))
    sent = []
    for i in range(int(count)):
        await p.send(f"obo-{i}".encode(), {"index": str(i)})
        sent.append(f"obo-{i}")
    got = await take(queue, len(sent), 60)
    for m in got:
        await cons.ack(m)
    await cons.close()
    return {"sent": sent, "received": [describe(m) for m in got], "doors": doors(p)}


async def follow(url: str, topic: str, seconds: str) -> dict[str, Any]:
    """One producer (one partition, already made) sends one at a time for ``seconds``
    while the test moves its leader; an exclusive consumer drains. What was acknowledged,
    received, and where the producer talked before and after."""
    c = await client(url)
    cons = await consumer(c, topic, "fl-consumer", "fl-sub", SubType.EXCLUSIVE)
    queue = await cons.receive()
    p = await producer(c, topic, "fl-producer", partitions=1)
    before = doors(p)
    acked: list[str] = []
    received: list[str] = []
    errors: list[str] = []
    slowest_s = 0.0
    stop = time.monotonic() + float(seconds)
    print("ready", flush=True)  # the test moves the leader after this line

    async def drain() -> None:
        while True:
            m = await queue.get()
            received.append(m.payload.decode())
            await cons.ack(m)

    draining = asyncio.create_task(drain())
    i = 0
    while time.monotonic() < stop:
        body = f"fl-{i}"
        started = time.monotonic()
        try:
            await p.send(body.encode(), {})
            acked.append(body)
            i += 1
        except Exception as exc:  # not acknowledged: sent again
            errors.append(f"{type(exc).__name__}: {str(exc)[:200]}")
        slowest_s = max(slowest_s, time.monotonic() - started)
    deadline = time.monotonic() + 30
    while not set(acked) <= set(received) and time.monotonic() < deadline:  # noqa: ASYNC110
        await asyncio.sleep(0.1)  # polled: the drain task appends
    draining.cancel()
    await cons.close()
    return {
        "acked": acked,
        "received": received,
        "errors": errors[-20:],
        "before": before,
        "after": doors(p),
        "slowest_s": slowest_s,
    }


async def latency(url: str, topic: str, count: str, size: str, warmup: str) -> dict[str, Any]:
    """One producer sends ``warmup`` then ``count`` messages of ``size`` bytes one at a
    time (each awaited): the measured sends' latencies (ms), and where it talked."""
    c = await client(url)
    p = await producer(c, topic, "lat-producer")
    body = b"x" * int(size)
    for _ in range(int(warmup)):
        await p.send(body, {})
    times_ms = []
    for _ in range(int(count)):
        started = time.perf_counter()
        await p.send(body, {})
        times_ms.append((time.perf_counter() - started) * 1000)
    times_ms.sort()
    return {
        "p50_ms": times_ms[len(times_ms) // 2],
        "p99_ms": times_ms[min(len(times_ms) - 1, int(len(times_ms) * 0.99))],
        "doors": doors(p),
    }


SCENARIOS = {
    "secured": secured,
    "roundtrip": roundtrip,
    "partitioned": partitioned,
    "key_shared": key_shared,
    "exclusive_refused": exclusive_refused,
    "nack_delay": nack_delay,
    "survive": survive,
    "schema_enforce": schema_enforce,
    "one_by_one": one_by_one,
    "follow": follow,
    "latency": latency,
}


async def main(argv: list[str]) -> None:
    scenario, url, *args = argv[1:]
    async with asyncio.timeout(TIME_LIMIT_S):
        result = await SCENARIOS[scenario](url, *args)
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    asyncio.run(main(sys.argv))

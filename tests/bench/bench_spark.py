"""The Parquet backfill against the consume API, over the same messages, with a mesh of real
processes (nats-server, etcd, ingest, uploader, cloud_reader, dispatcher, discovery, each
`python -m danube.<service>`) and objects on the local filesystem.

1. Produce MESSAGES (1M by default) through the HTTP API into a 2-partition topic; wait
   until the uploader has put every one in objects (2 MiB each).
2. Consume API: one SDK consumer from earliest, acking each message, until it has them all,
   once with the WebSocket stream (10 000 credits) and once with long-poll (a subscription
   each): messages/s of the faster.
3. Spark (local[*], in this process, after a warm-up backfill of 20 000 messages):
   `backfill_to_parquet` of the whole topic: messages/s of the write.

Run: .venv/bin/python tests/bench/bench_spark.py [MESSAGES]
Prints one JSON line: both rates and their ratio.
"""

from __future__ import annotations

import asyncio
import json
import sys
import tempfile
import time
from pathlib import Path

from danube.client import AsyncDanubeClient, ConsumerOptions, Message
from danube.client.consumer import Mode
from danube.up import free_port

from mesh import bench_mesh

TOPIC = "/default/spark-bench"
PARTITIONS = 2
SERVICES = ["ingest", "uploader", "cloud_reader", "dispatcher", "discovery"]
UPLOAD_TIMEOUT_S = 600.0


def _payload(n: int) -> bytes:
    return b"%08d:" % n + bytes([65 + n % 26]) * (n % 51)


async def _produce(client: AsyncDanubeClient, count: int) -> float:
    await client.admin.create_topic(TOPIC, partitions=PARTITIONS)
    started = time.perf_counter()
    async with client.producer(TOPIC, name="bench", max_inflight_batches=4) as producer:
        for n in range(count):
            key = None if n % 3 == 0 else f"user-{n % 1000}"
            await producer.send(Message(_payload(n), key))
        await producer.flush()
    return count / (time.perf_counter() - started)


async def _uploaded(client: AsyncDanubeClient) -> None:
    async with asyncio.timeout(UPLOAD_TIMEOUT_S):
        while True:
            described = await client.admin.describe_topic(TOPIC)
            offsets = [p.offsets for p in described.partitions]
            if all(
                o.next_offset is not None
                and o.uploaded_through is not None
                and o.uploaded_through >= o.next_offset - 1
                for o in offsets
            ):
                return
            await asyncio.sleep(1)


async def _consume(client: AsyncDanubeClient, count: int, mode: Mode) -> float:
    options = ConsumerOptions(start="earliest", mode=mode, receiver_queue_size=10_000)
    received = 0
    async with client.consumer(TOPIC, f"bench-{mode}", options) as consumer:
        started = time.perf_counter()
        async for message in consumer:
            message.ack()
            received += 1
            if received == count:
                break
        return count / (time.perf_counter() - started)


def _parquet(etcd: str, objects: Path, output: Path) -> tuple[float, int, float]:
    from danube.spark import spark_session
    from danube.spark.parquet import backfill_to_parquet

    spark = spark_session(
        "bench", master="local[*]", conf={"spark.ui.showConsoleProgress": "false"}
    )
    options = {
        "topic": TOPIC,
        "etcd_endpoint": etcd,
        "wal_cloud.cloud.backend": "fs",
        "wal_cloud.cloud.root": str(objects),
    }
    try:
        # Warm-up on the first 20 000 offsets: Python workers started, the JVM's Parquet
        # code compiled, as in any backfill longer than a few seconds.
        warm = {**options, "end_offset": "10000"}
        backfill_to_parquet(spark, warm, str(output.with_name("warm-up")))
        result = backfill_to_parquet(spark, options, str(output))
        return result.messages_per_s, result.messages, result.seconds
    finally:
        spark.stop()


async def main(tmp: Path, count: int) -> None:
    etcd_port = free_port()
    env = {
        "DANUBE_WAL_CLOUD__UPLOADER__INTERVAL_SECONDS": "1",
        "DANUBE_WAL_CLOUD__UPLOADER__MAX_OBJECT_MB": "2",
        "DANUBE_WAL_CLOUD__CLOUD__BACKEND": "fs",
        "DANUBE_WAL_CLOUD__CLOUD__ROOT": str(tmp / "objects"),
    }
    async with bench_mesh(tmp, SERVICES, env, etcd_port=etcd_port) as http:
        async with AsyncDanubeClient(str(http.base_url).rstrip("/")) as client:
            produce_rate = await _produce(client, count)
            await _uploaded(client)
            stream_rate = await _consume(client, count, "stream")
            poll_rate = await _consume(client, count, "poll")
            consume_rate = max(stream_rate, poll_rate)
        parquet_rate, written, seconds = await asyncio.to_thread(
            _parquet, f"127.0.0.1:{etcd_port}", tmp / "objects", tmp / "parquet"
        )
    assert written == count, f"Parquet holds {written} of {count} messages"
    print(
        json.dumps(
            {
                "messages": count,
                "produce_msgs_per_s": round(produce_rate),
                "consume_api_stream_msgs_per_s": round(stream_rate),
                "consume_api_poll_msgs_per_s": round(poll_rate),
                "parquet_backfill_msgs_per_s": round(parquet_rate),
                "parquet_backfill_s": round(seconds, 2),
                "ratio_to_the_faster_consume": round(parquet_rate / consume_rate, 1),
            }
        ),
        flush=True,
    )


if __name__ == "__main__":
    with tempfile.TemporaryDirectory() as directory:
        asyncio.run(main(Path(directory), int(sys.argv[1]) if len(sys.argv) > 1 else 1_000_000))

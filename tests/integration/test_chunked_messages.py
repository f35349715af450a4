"""Large messages on real NATS and etcd (discovery, ingest and a dispatcher in-process): a
50 MiB message sent as chunks comes back byte-identical to a consumer in its own process
(its time and peak memory measured), a message that lost a chunk is given up (counted,
acked) while the next one arrives whole, the namespace's max_chunked_message_bytes held by
the front door (HTTP and gRPC), and the CLI's produce --file and consume --save-dir."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import os
import sys
import time
from pathlib import Path

import httpx
import pytest

from danube.client import (
    AsyncDanubeClient,
    DanubeClient,
    DeadlineExceededError,
    FailurePolicy,
    NotFoundError,
    Policies,
    TooLargeError,
)
from danube.client._chunking import ChunkedMessage, chunk_attributes, new_uuid, split
from danube.wire.chunks import TOTAL_BYTES_ATTRIBUTE as TOTAL
from tests.integration.conftest import MeshSettings

pytestmark = pytest.mark.integration

RECEIVE_TIMEOUT_S = 60.0
MIB = 1024 * 1024

# The consumer, in a process of its own so that its peak RSS is its own: receives one
# message, prints its size, sha256, seconds and memory as JSON.
_CONSUMER = """
import asyncio, hashlib, json, sys, time
from danube.client import AsyncDanubeClient

def rss_mib():
    # VmHWM, the peak RSS of this process's memory since its exec (ru_maxrss would count
    # the parent's, from the fork).
    with open("/proc/self/status") as status:
        line = next(x for x in status if x.startswith("VmHWM:"))
    return int(line.split()[1]) / 1024

async def main(url, topic):
    baseline_mib = rss_mib()
    async with AsyncDanubeClient(url) as client:
        async with client.consumer(
            topic, "big", start="earliest"
        ) as consumer:
            started = time.monotonic()
            message = await consumer.receive(60.0)
            seconds = time.monotonic() - started
            message.ack()
            await consumer.flush_acks()
            print(json.dumps({
                "bytes": len(message.payload),
                "sha256": hashlib.sha256(message.payload).hexdigest(),
                "chunks": len(message.chunks),
                "seconds": seconds,
                "baseline_mib": baseline_mib,
                "maxrss_mib": rss_mib(),
                "given_up": sum(consumer.chunked_given_up.values()),
            }))

asyncio.run(main(*sys.argv[1:]))
"""


async def test_a_50_mib_message_round_trips_byte_identical(
    consume_http: httpx.AsyncClient,
) -> None:
    url = str(consume_http.base_url)
    payload = os.urandom(50 * MIB)
    started = time.monotonic()
    async with (
        AsyncDanubeClient(url) as client,
        client.producer("/default/big", chunking=True) as producer,
    ):
        stored = await producer.send_and_wait(payload)
    produce_s = time.monotonic() - started
    assert (stored.partition, stored.offset) == ("/default/big", 0)
    consumer = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        _CONSUMER,
        url,
        "/default/big",
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(consumer.communicate(), RECEIVE_TIMEOUT_S + 30)
    assert consumer.returncode == 0, err.decode()[-2000:]
    got = json.loads(out)
    print(f"\n50 MiB: produced in {produce_s:.2f} s; consumer {got}")
    assert got["bytes"] == len(payload)
    assert got["sha256"] == hashlib.sha256(payload).hexdigest()
    assert got["chunks"] == 100  # 512 KiB chunks
    assert got["given_up"] == 0
    # docs/client.md, "Large messages": the chunks held while partial (50 MiB) and the
    # joined payload (50 MiB), the few chunks in the receive queue, the SDK's imports.
    # Measured: 28 MiB before the client, 143 MiB at the peak.
    assert got["maxrss_mib"] - got["baseline_mib"] < 2 * 50 + 40, got


async def test_a_message_that_lost_a_chunk_is_given_up_and_the_next_arrives(
    consume_http: httpx.AsyncClient,
) -> None:
    topic = "/default/lossy"
    async with AsyncDanubeClient(str(consume_http.base_url)) as client:
        # The chunks of a message one of which was never stored (as a producer that died
        # while sending it), then a whole message of the same producer.
        broken = os.urandom(5000)
        uuid = new_uuid()
        pieces = split(broken, 1000)
        async with client.producer(topic, name="dying", max_payload_bytes=1000) as raw:
            for index, piece in enumerate(pieces):
                if index != 2:
                    attributes = chunk_attributes({}, uuid, index, len(pieces), len(broken))
                    await raw.send(bytes(piece), key=uuid, attributes=attributes)
            await raw.flush()
        whole = os.urandom(3500)
        async with client.producer(
            topic, name="dying", max_payload_bytes=1000, chunking=True
        ) as producer:
            await producer.send_and_wait(whole, attributes={"a": "1"})
        async with client.consumer(topic, "s", start="earliest") as consumer:
            message = await consumer.receive(RECEIVE_TIMEOUT_S)
            assert isinstance(message, ChunkedMessage)
            assert (message.payload, message.key, dict(message.attributes)) == (
                whole,
                None,
                {"a": "1"},
            )
            assert consumer.chunked_given_up["missing_chunk"] == 1
            error = consumer.last_chunk_error
            assert error is not None
            assert error.reason == "missing_chunk"
            assert "4 of 5 chunks received" in error.message
            message.ack()
            await consumer.flush_acks()
        # Every record was acked: the given-up chunks for the policy, the others with
        # the message (4 + 4 records, nothing left in the backlog).
        subscriptions = await client.admin.subscriptions(topic)
        assert [s.backlog for s in subscriptions] == [0]


async def test_the_namespace_limits_the_size_of_chunked_messages(
    consume_http: httpx.AsyncClient,
) -> None:
    async with AsyncDanubeClient(str(consume_http.base_url)) as client:
        await client.admin.create_namespace(
            "small", policies=Policies(max_chunked_message_bytes=MIB)
        )
        async with client.producer("/small/t", chunking=True) as producer:
            stored = await producer.send_and_wait(b"x" * MIB)  # at the limit: stored
            with pytest.raises(TooLargeError) as refused:
                await producer.send_and_wait(b"x" * (MIB + 1))
        assert refused.value.code == "chunked_message_too_large"
        assert stored.offset == 0
        # A JSON client that splits messages itself is held to the same limit.
        for total, status, code in [
            (str(MIB + 1), 413, "chunked_message_too_large"),
            ("1e9", 400, "invalid_chunk"),
        ]:
            attributes = {**chunk_attributes({}, new_uuid(), 0, 2, 2), TOTAL: total}
            answer = await consume_http.post(
                "/v1/topics/small/t/messages",
                json={"messages": [{"payload": "x", "attributes": attributes}]},
            )
            assert (answer.status_code, answer.json()["error"]["code"]) == (status, code)
        described = await client.admin.describe_topic("/small/t")
        # Only the first message's 2 chunks were stored: every chunk of the refused one
        # carried its total and was refused.
        assert [p.offsets.next_offset for p in described.partitions] == [2], described.partitions


async def test_cli_produces_a_large_file_and_consume_saves_it_whole(
    consume_http: httpx.AsyncClient, tmp_path: Path
) -> None:
    url = str(consume_http.base_url).rstrip("/")
    blob = tmp_path / "blob.bin"
    blob.write_bytes(os.urandom(3 * MIB + 5))
    danube = str(Path(sys.executable).parent / "danube")

    async def run(*args: str) -> tuple[int, str, str]:
        process = await asyncio.create_subprocess_exec(
            danube,
            *args,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env={**os.environ, "COLUMNS": "200", "NO_COLOR": "1"},
        )
        out, err = await asyncio.wait_for(process.communicate(), 90)
        assert process.returncode is not None
        return process.returncode, out.decode(), err.decode()

    code, out, err = await run("produce", "-s", url, "-t", "/default/files", "-f", str(blob))
    assert (code, out) == (0, "/default/files 0\n"), err
    saved = tmp_path / "got"
    code, out, err = await run(
        "consume", "-s", url, "-t", "/default/files", "-m", "s", "--start", "earliest",
        "-c", "1", "--json", "--save-dir", str(saved),
    )  # fmt: skip
    assert code == 0, err
    shown = json.loads(out)
    assert (shown["encoding"], shown["bytes"], shown["chunks"]) == ("file", 3 * MIB + 5, 7)
    got = await asyncio.to_thread(Path(shown["payload"]).read_bytes)
    assert got == blob.read_bytes()


async def test_grpc_send_message_holds_the_policy_too(mesh_settings: MeshSettings) -> None:
    import grpc

    from tests.integration.test_grpc_api import grpc_mesh, message, producer_request

    async with grpc_mesh(mesh_settings) as (api, _, _):
        producer = await api.create_producer(producer_request("/default/grpc-chunks", "p"))
        chunk = message("/default/grpc-chunks", producer.producer_id, b"x" * 10)
        uuid = new_uuid()
        chunk.attributes.update(chunk_attributes({}, uuid, 0, 200, 100 * MIB + 1))
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await api.send(chunk)
        assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert refused.value.details().startswith("chunked_message_too_large:")
        chunk.attributes.update(chunk_attributes({}, uuid, 0, 200, 100 * MIB))  # at the limit
        await api.send(chunk)


async def test_the_blocking_client_sends_and_receives_large_messages(
    consume_http: httpx.AsyncClient,
) -> None:
    payload = os.urandom(MIB + 7)

    def blocking() -> tuple[bytes, int]:
        with DanubeClient(str(consume_http.base_url)) as client:
            with client.producer("/default/sync-big", chunking=True) as producer:
                producer.send_and_wait(payload, key="k")
            with client.consumer("/default/sync-big", "s", start="earliest") as consumer:
                message = consumer.receive(RECEIVE_TIMEOUT_S)
                consumer.ack(message)
                return message.payload, len(getattr(message, "chunks", ()))

    assert await asyncio.to_thread(blocking) == (payload, 3)


async def test_nacked_chunks_end_in_the_dead_letter_topic_under_a_failure_policy(
    consume_http: httpx.AsyncClient,
) -> None:
    topic, dead = "/default/nacked", "/default/nacked-dlq"
    async with AsyncDanubeClient(str(consume_http.base_url)) as client:
        # Chunks 1 and 2 of a message whose chunk 0 was never stored, then a whole message.
        lost = os.urandom(3000)
        uuid = new_uuid()
        async with client.producer(topic, name="p", max_payload_bytes=1000) as raw:
            for index, piece in enumerate(split(lost, 1000)):
                if index:
                    attributes = chunk_attributes({}, uuid, index, 3, len(lost))
                    await raw.send(bytes(piece), key=uuid, attributes=attributes)
        whole = os.urandom(2500)
        async with client.producer(
            topic, name="p", max_payload_bytes=1000, chunking=True
        ) as producer:
            await producer.send_and_wait(whole)
        policy = FailurePolicy(
            max_redeliveries=1, poison_policy="dead_letter", dead_letter_topic=dead
        )
        async with client.consumer(
            topic, "s", start="earliest", chunk_give_up="nack", failure_policy=policy.body()
        ) as consumer:
            message = await consumer.receive(RECEIVE_TIMEOUT_S)
            assert message.payload == whole
            message.ack()
            # The strays were nacked (counted once), came again, were nacked again: past
            # max_redeliveries the dispatcher moves them to the dead-letter topic.
            async with asyncio.timeout(30):
                while await _stored(client, dead) != 2:
                    with contextlib.suppress(DeadlineExceededError):
                        extra = await consumer.receive(0.2)
                        raise AssertionError(f"unexpected {extra}")
            assert consumer.chunked_given_up["missing_chunk"] == 1
        assert [s.backlog for s in await client.admin.subscriptions(topic)] == [0]


async def _stored(client: AsyncDanubeClient, topic: str) -> int:
    """How many messages ``topic`` holds (0 while it does not exist)."""
    try:
        described = await client.admin.describe_topic(topic)
    except NotFoundError:
        return 0
    return described.partitions[0].offsets.next_offset or 0

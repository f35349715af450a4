"""Compressed payloads on real NATS, etcd, ingest, dispatcher and discovery: the SDK's zstd and
lz4 producers store compressed records in the WAL, and every door hands them out decompressed
(the SDK's stream and poll consumers, the JSON long poll, Danube's gRPC stream); produce bodies
sent with Content-Encoding gzip or zstd, a bomb refused with 413 and nothing stored; a
schema'd topic checking compressed payloads decompressed."""

from __future__ import annotations

import asyncio
import gzip
import json
import os
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
import zstandard

from danube.client import AsyncDanubeClient, Policies, TooLargeError
from danube.frame import FRAME_HEADER_BYTES, decode_record_fields
from danube.frame.compression import CODEC_LZ4, CODEC_ZSTD
from danube.frame.produce import encode_produce_frame, frame_for_produce
from danube.frame.record import RECORD_FLAGS_AT
from danube.ingest.wal.segment import parse_segment_name
from danube.meta import TopicName
from danube.wire import DanubeApi_pb2 as pb
from tests.integration.test_discovery_api import MAX_BODY, MAX_PAYLOAD, Mesh, MeshFactory, mesh_for
from tests.integration.test_grpc_api import MeshSettings, grpc_mesh
from tests.walfiles import segment_frames

__all__ = ["mesh_for"]  # the fixture

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

BINARY = {"content-type": "application/vnd.danube.records"}
COUNT = 12


def log_line(index: int) -> bytes:
    """A JSON log line of about 1 KiB."""
    return orjson.dumps(
        {
            "ts": f"2026-11-29T05:00:{index % 60:02d}.{index:06d}Z",
            "level": "INFO",
            "service": "checkout",
            "trace_id": f"{index * 104729:032x}",
            "message": " ".join(f"step={s} item=sku-{index}-{s} ok" for s in range(40)),
        }
    )


def stored_records(wal_dir: Path, topic: str) -> list[Any]:
    """The records of ``topic``'s WAL segments as stored (payloads not decompressed)."""
    found = []
    for path in sorted(wal_dir.rglob("*")):
        if path.is_file() and topic in str(path) and parse_segment_name(path.name) is not None:
            frames = segment_frames(path)  # the open segment goes on in zeros
            found += [decode_record_fields(f.payload, decompress=False) for f in frames]
    return found


async def test_compressed_records_are_stored_so_and_every_door_decompresses(
    mesh_settings: MeshSettings, tmp_path: Path
) -> None:
    lines = [log_line(i) for i in range(COUNT)]
    async with grpc_mesh(mesh_settings) as (api, http, _):
        url = str(http.base_url).rstrip("/")
        # Subscribed before anything is produced (a gRPC subscription starts at the end).
        grpc_consumer = await api.subscribe(
            pb.ConsumerRequest(
                request_id=1,
                topic_name="/default/c-zstd",
                consumer_name="gc",
                subscription="g-sub",
                subscription_type=pb.ConsumerRequest.Exclusive,
            )
        )
        async with AsyncDanubeClient(url) as client:
            for topic, compression in (("c-zstd", "zstd"), ("c-lz4", "lz4")):
                async with client.producer(
                    f"/default/{topic}", compression=compression, linger_ms=1
                ) as producer:
                    for line in lines[:-1]:
                        await producer.send(line)
                    await producer.send_and_wait(b"tiny")  # stored as is: no smaller packed
        for topic, compression in (("c-zstd", "zstd"), ("c-lz4", "lz4")):
            stored = stored_records(tmp_path / "wal", topic)
            assert [r.compression for r in stored] == [compression] * (COUNT - 1) + [None]
            assert all(
                len(r.payload) < len(line) / 2 for r, line in zip(stored, lines, strict=False)
            )
        expected = [*lines[:-1], b"tiny"]

        # The SDK, over its stream (binary frames) and its long poll.
        async with AsyncDanubeClient(url) as client:
            for mode in ("stream", "poll"):
                async with client.consumer(
                    "/default/c-zstd", f"sdk-{mode}", mode=mode, start="earliest"
                ) as consumer:
                    got = [await consumer.receive(15) for _ in range(COUNT)]
                    assert [m.payload for m in got] == expected
                    for m in got:
                        m.ack()

        # JSON clients: discovery's long poll.
        attached = await http.post(
            "/v1/topics/default/c-lz4/subscriptions/json/consumers",
            json={"name": "j", "start": "earliest"},
        )
        assert attached.status_code == 201, attached.text
        cid = attached.json()["consumer_id"]
        polled: list[dict[str, Any]] = []
        async with asyncio.timeout(15):
            while len(polled) < COUNT:
                answer = await http.get(f"/v1/consumers/{cid}/messages", params={"wait_ms": 500})
                assert answer.status_code == 200, answer.text
                polled += answer.json()["messages"]
        assert [(m["payload"].encode(), m["encoding"]) for m in polled] == [
            (p, "utf8") for p in expected
        ]

        # Danube's gRPC consumer (its client knows no compression): the payloads as sent.
        receive = api.channel.unary_stream(
            "/danube.ConsumerService/ReceiveMessages",
            request_serializer=pb.ReceiveRequest.SerializeToString,
            response_deserializer=pb.StreamMessage.FromString,
        )
        stream = receive(pb.ReceiveRequest(request_id=2, consumer_id=grpc_consumer.consumer_id))
        received: list[bytes] = []
        async with asyncio.timeout(15):
            async for delivered in stream:
                received.append(delivered.payload)
                if len(received) == COUNT:
                    break
        stream.cancel()
        assert received == expected


async def _post(mesh: Mesh, topic: str, body: bytes, headers: dict[str, str]) -> Any:
    return await mesh.http.post(
        f"/v1/topics/default/{topic}/messages", content=body, headers=headers
    )


async def test_encoded_bodies_are_taken_and_bombs_refused_with_nothing_stored(
    mesh_for: MeshFactory,
) -> None:
    async with mesh_for() as mesh:
        as_json = json.dumps({"messages": [{"payload": "gz-1"}, {"payload": "gz-2"}]}).encode()
        stored = await _post(
            mesh,
            "enc",
            gzip.compress(as_json),
            {"content-type": "application/json", "content-encoding": "gzip"},
        )
        assert stored.status_code == 200, stored.text
        assert [r["offset"] for r in stored.json()["results"]] == [0, 1]
        frames = b"".join(
            encode_produce_frame(log_line(i), producer=b"z", publish_time_ms=1) for i in range(3)
        )
        packed = zstandard.ZstdCompressor().compress(frames)
        stored = await _post(mesh, "enc", packed, BINARY | {"content-encoding": "zstd"})
        assert stored.status_code == 200, stored.text
        assert stored.json()["runs"] == [{"partition": "/default/enc", "offset": 2, "count": 3}]
        # A chunked JSON body (no Content-Length) goes to the route, decoded the same.
        stored = await mesh.http.post(
            "/v1/topics/default/enc/messages",
            content=_chunks(gzip.compress(as_json)),
            headers={"content-type": "application/json", "content-encoding": "gzip"},
        )
        assert stored.status_code == 200, stored.text
        assert [r["offset"] for r in stored.json()["results"]] == [5, 6]

        # Bombs: a few KiB that inflate past discovery.max_body_bytes.
        zeros = b"0" * (MAX_BODY * 40)
        bombs = [
            ("gzip", gzip.compress(zeros), "application/json"),
            ("zstd", zstandard.ZstdCompressor().compress(zeros), "application/json"),
            ("zstd", zstandard.ZstdCompressor().compress(zeros), BINARY["content-type"]),
        ]
        counted = await _produce_answers(mesh, 413)
        for encoding, bomb, kind in bombs:
            assert len(bomb) < MAX_BODY // 10
            refused = await _post(
                mesh, "enc", bomb, {"content-type": kind, "content-encoding": encoding}
            )
            assert (refused.status_code, refused.json()["error"]["code"]) == (
                413,
                "body_too_large",
            )
        # Sent chunked, the compressed body itself is counted against the limit as it comes.
        noise = gzip.compress(os.urandom(MAX_BODY + 1024))
        refused = await mesh.http.post(
            "/v1/topics/default/enc/messages",
            content=_chunks(noise, 64 * 1024),
            headers={"content-type": "application/json", "content-encoding": "gzip"},
        )
        assert (refused.status_code, refused.json()["error"]["code"]) == (413, "body_too_large")
        counted += 1
        # Counted under the produce route, as a body sent plain would be.
        assert await _produce_answers(mesh, 413) == counted + len(bombs)
        cases = [
            (gzip.compress(as_json)[:-5], "gzip", 400, "invalid_content_encoding"),
            (b"not gzip at all", "gzip", 400, "invalid_content_encoding"),
            (
                zstandard.ZstdCompressor().compress(as_json)[:-2],
                "zstd",
                400,
                "invalid_content_encoding",
            ),
            (as_json, "br", 415, "unsupported_content_encoding"),
        ]
        for body, encoding, status, code in cases:
            refused = await _post(
                mesh,
                "enc",
                body,
                {"content-type": "application/json", "content-encoding": encoding},
            )
            assert (refused.status_code, refused.json()["error"]["code"]) == (status, code)
        other_route = await mesh.http.put(
            "/v1/namespaces/zz",
            content=gzip.compress(b"{}"),
            headers={"content-type": "application/json", "content-encoding": "gzip"},
        )
        assert (other_route.status_code, other_route.json()["error"]["code"]) == (
            415,
            "unsupported_content_encoding",
        )
        # A record whose compressed payload inflates past the message limit: 413, as sent plain.
        zeros_record = encode_produce_frame(
            b"\0" * (MAX_PAYLOAD + 1), producer=b"z", publish_time_ms=1, codec=CODEC_ZSTD
        )
        assert len(zeros_record) < 200
        refused = await _post(mesh, "enc", zeros_record, BINARY)
        assert (refused.status_code, refused.json()["error"]["code"]) == (413, "payload_too_large")
        # Nothing refused was stored: offsets 0..6 only.
        fetched = await mesh.client.fetch(TopicName.parse("/default/enc"), 0, max_count=100)
        assert [f.offset for f in fetched.frames] == list(range(7))
        assert [decode_record_fields(f.payload).payload for f in fetched.frames] == [
            b"gz-1",
            b"gz-2",
            *(log_line(i) for i in range(3)),
            b"gz-1",
            b"gz-2",
        ]


async def _produce_answers(mesh: Mesh, status: int) -> float:
    """How many produce requests this discovery answered with ``status`` (its metrics)."""
    text = (await mesh.http.get("/metrics")).text
    wanted = f'route="/v1/topics/{{ns}}/{{topic}}/messages",status="{status}"'
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("danube_discovery_http_requests_total{") and wanted in line
    )


async def _chunks(body: bytes, size: int = 7) -> Any:
    for at in range(0, len(body), size):
        yield body[at : at + size]


async def test_a_schema_topic_checks_compressed_payloads_decompressed(
    mesh_for: MeshFactory,
) -> None:
    schema = json.dumps(
        {"type": "object", "properties": {"id": {"type": "integer"}}, "required": ["id"]}
    )
    async with mesh_for() as mesh:
        http = mesh.http
        registered = await http.post(
            "/v1/schemas/c-ids/versions", json={"schema_type": "json_schema", "schema": schema}
        )
        assert registered.status_code in (200, 201), registered.text
        bound = await http.put(
            "/v1/topics/default/typed-c/schema",
            json={"subject": "c-ids", "validation_policy": "enforce", "payload_validation": True},
        )
        assert bound.status_code == 200, bound.text

        def record(payload: bytes, codec: int) -> bytes:
            return encode_produce_frame(payload, producer=b"p", publish_time_ms=1, codec=codec)

        good = b'{"id": 1, "pad": "' + b"x" * 300 + b'"}'
        bad = b'{"id": "one", "pad": "' + b"x" * 300 + b'"}'
        refused = await _post(
            mesh, "typed-c", record(good, CODEC_LZ4) + record(bad, CODEC_ZSTD), BINARY
        )
        assert (refused.status_code, refused.json()["error"]["code"]) == (400, "schema_violation")
        stored = await _post(
            mesh, "typed-c", record(good, CODEC_ZSTD) + record(good, CODEC_LZ4), BINARY
        )
        assert stored.status_code == 200, stored.text
        fetched = await mesh.client.fetch(TopicName.parse("/default/typed-c"), 0, max_count=10)
        records = [decode_record_fields(f.payload) for f in fetched.frames]
        schema_id = registered.json()["schema_id"]
        assert [(r.payload, r.schema_id, r.compression) for r in records] == [
            (good, schema_id, "zstd"),
            (good, schema_id, "lz4"),
        ]
        # Stamping kept them compressed: the stored flag bits name the codec.
        assert [f.payload[RECORD_FLAGS_AT] >> 3 & 3 for f in fetched.frames] == [1, 2]
        # A record whose compressed payload does not inflate to its stated size is refused.
        lying = bytearray(record(good, CODEC_LZ4)[FRAME_HEADER_BYTES:])
        lying[-1] ^= 0xFF  # the LZ4 block's last literal byte... or its end: either is caught
        lying[-20] ^= 0xFF
        refused = await _post(mesh, "typed-c", frame_for_produce(bytes(lying)), BINARY)
        assert refused.status_code == 400
        fetched = await mesh.client.fetch(TopicName.parse("/default/typed-c"), 0, max_count=10)
        assert len(fetched.frames) == 2


async def test_compressed_chunks_are_held_to_the_chunked_message_limit(
    mesh_for: MeshFactory,
) -> None:
    """A large message sent as compressed chunks: its chunks (each under the message limit,
    and far smaller stored) still name its total, and the namespace's limit holds it."""
    async with mesh_for() as mesh:
        url = str(mesh.http.base_url).rstrip("/")
        limit = 4 * MAX_PAYLOAD
        async with AsyncDanubeClient(url) as client:
            await client.admin.create_namespace(
                "czip", policies=Policies(max_chunked_message_bytes=limit)
            )
            async with client.producer(
                "/czip/t", chunking=True, compression="zstd", max_payload_bytes=MAX_PAYLOAD
            ) as producer:
                # Hex text: compresses about 2:1, so each stored chunk is still tens of KiB
                # (the front door then looks for the total in each record's head).
                text = os.urandom(limit).hex().encode()
                stored = await producer.send_and_wait(text[:limit])  # at the limit
                with pytest.raises(TooLargeError) as refused:
                    await producer.send_and_wait(text[: limit + 1])
        assert refused.value.code == "chunked_message_too_large"
        fetched = await mesh.client.fetch(TopicName.parse("/czip/t"), 0, max_count=100)
        records = [decode_record_fields(f.payload, decompress=False) for f in fetched.frames]
        assert stored.offset == 0
        assert [r.compression for r in records] == ["zstd"] * 4  # the first message only
        assert all(MAX_PAYLOAD / 3 < len(r.payload) < MAX_PAYLOAD * 0.6 for r in records)


async def test_a_message_sent_as_compressed_chunks_comes_back_whole(
    consume_http: httpx.AsyncClient,
) -> None:
    url = str(consume_http.base_url).rstrip("/")
    message = os.urandom(300 * 1024).hex().encode()  # 600 KiB: two chunks, each compressed
    async with AsyncDanubeClient(url) as client:
        async with client.producer("/default/c-chunks", chunking=True, compression="lz4") as p:
            await p.send_and_wait(message)
        async with client.consumer("/default/c-chunks", "s", start="earliest") as consumer:
            got = await consumer.receive(15)
    assert got.payload == message

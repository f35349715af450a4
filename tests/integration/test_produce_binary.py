"""The binary produce body on real NATS, etcd, ingest and discovery: the same records, keys,
attributes, offsets and partitions as the JSON body; a damaged, cut, oversized or
over-counted body refused with its code and nothing stored; a schema'd topic checking the
payloads (and stamping the records); the SDK sending binary by default."""

from __future__ import annotations

import base64
import json
from typing import Any

import httpx
import pytest

from danube.client import AsyncDanubeClient
from danube.frame import Record
from danube.frame.produce import encode_produce_frame
from danube.wire.http1 import WireAnswer
from tests.integration.test_discovery_api import (
    MAX_MESSAGES,
    MAX_PAYLOAD,
    Mesh,
    MeshFactory,
    _fetch_all,
    mesh_for,
)

__all__ = ["mesh_for"]  # the fixture, shared with the JSON tests

pytestmark = pytest.mark.integration

BINARY = {"content-type": "application/vnd.danube.records"}
SCHEMA = json.dumps(
    {"type": "object", "properties": {"id": {"type": "integer"}}, "required": ["id"]}
)


def _frame(
    payload: bytes, key: str | None = None, attributes: dict[str, str] | None = None
) -> bytes:
    return encode_produce_frame(
        payload,
        producer=b"p-1",
        publish_time_ms=1_700_000_000_000,
        key=None if key is None else key.encode(),
        attributes=[(k.encode(), v.encode()) for k, v in (attributes or {}).items()],
    )


def _expand(answer: dict[str, Any]) -> list[tuple[str, int]]:
    return [
        (run["partition"], run["offset"] + i) for run in answer["runs"] for i in range(run["count"])
    ]


async def _post(mesh: Mesh, topic: str, body: bytes, query: str = "") -> httpx.Response:
    return await mesh.http.post(
        f"/v1/topics/default/{topic}/messages{query}", content=body, headers=BINARY
    )


def _fields(record: Record) -> tuple[Any, ...]:
    return (record.payload, record.key, dict(record.attributes), record.producer)


async def test_binary_and_json_store_the_same_and_bad_bodies_store_nothing(
    mesh_for: MeshFactory,
) -> None:
    async with mesh_for() as mesh:
        raw = bytes(range(256))
        messages = [
            (b"h\xc3\xa9llo", "k", {"a": "1", "b": "2"}),
            (raw, None, {}),
            (b"", "", {}),
        ]
        stored = await _post(mesh, "bin", b"".join(_frame(*m) for m in messages))
        assert stored.status_code == 200, stored.text
        assert stored.json() == {
            "runs": [{"partition": "/default/bin", "offset": 0, "count": 3}],
            "partitions": 0,
        }
        as_json = await mesh.http.post(
            "/v1/topics/default/js/messages",
            json={
                "producer": "p-1",
                "messages": [
                    {"payload": "héllo", "key": "k", "attributes": {"a": "1", "b": "2"}},
                    {"payload": base64.b64encode(raw).decode(), "encoding": "base64"},
                    {"payload": "", "key": ""},
                ],
            },
        )
        assert as_json.status_code == 200, as_json.text
        binary = await _fetch_all(mesh, "/default/bin")
        assert [offset for offset, _ in binary] == [0, 1, 2]
        assert [_fields(r) for _, r in binary] == [
            (b"h\xc3\xa9llo", "k", {"a": "1", "b": "2"}, "p-1"),
            (raw, None, {}, "p-1"),
            (b"", "", {}, "p-1"),
        ]
        json_stored = await _fetch_all(mesh, "/default/js")
        for (_, b), (_, j) in zip(binary, json_stored, strict=True):
            assert (b.payload, b.key, dict(b.attributes), b.producer, b.schema_id) == (
                j.payload,
                j.key,
                dict(j.attributes),
                j.producer,
                j.schema_id,
            )
        assert binary[0][1].publish_time_ms == 1_700_000_000_000  # the producer's clock

        # Partitioned: the same key lands where the JSON body puts it, order kept.
        for topic in ("kb", "kj"):
            created = await mesh.http.put(f"/v1/topics/default/{topic}", json={"partitions": 4})
            assert created.status_code == 201
        keys = [f"user-{i % 7}" for i in range(30)]
        places = _expand(
            (
                await _post(
                    mesh, "kb", b"".join(_frame(str(i).encode(), k) for i, k in enumerate(keys))
                )
            ).json()
        )
        json_places = [
            (r["partition"].replace("kj", "kb"), r["offset"])
            for r in (
                await mesh.http.post(
                    "/v1/topics/default/kj/messages",
                    json={"messages": [{"payload": str(i), "key": k} for i, k in enumerate(keys)]},
                )
            ).json()["results"]
        ]
        assert places == json_places
        for (partition, offset), i in zip(places, range(30), strict=True):
            record = dict(await _fetch_all(mesh, partition))[offset]
            assert (record.payload, record.key) == (str(i).encode(), keys[i])

        # Refused bodies: their code, and not a byte more in the WAL.
        good = _frame(b"x") * 2
        flipped = bytearray(good)
        flipped[-1] ^= 0x40
        refusals = [
            (bytes(flipped), "", 400, "corrupt_frame"),
            (good[:-3], "", 400, "truncated_frames"),
            (b"", "", 400, "truncated_frames"),
            (_frame(b"x" * (MAX_PAYLOAD + 1)), "", 413, "payload_too_large"),
            (_frame(b"x") * (MAX_MESSAGES + 1), "", 413, "too_many_messages"),
            (good, "?colour=blue", 400, "unknown_field"),
        ]
        for body, query, status, code in refusals:
            answer = await _post(mesh, "bin", body, query)
            assert (answer.status_code, answer.json()["error"]["code"]) == (status, code), body[:40]
        assert [offset for offset, _ in await _fetch_all(mesh, "/default/bin")] == [0, 1, 2]

        # Sent chunked (no Content-Length), a binary body meets the JSON route: 415.
        async def chunks() -> Any:
            yield good

        chunked = await mesh.http.post(
            "/v1/topics/default/bin/messages", content=chunks(), headers=BINARY
        )
        assert chunked.status_code == 415


async def test_a_schema_topic_checks_binary_payloads_and_the_sdk_sends_binary(
    mesh_for: MeshFactory,
) -> None:
    async with mesh_for() as mesh:
        http = mesh.http
        registered = await http.post(
            "/v1/schemas/ids-value/versions", json={"schema_type": "json_schema", "schema": SCHEMA}
        )
        assert registered.status_code in (200, 201), registered.text
        bound = await http.put(
            "/v1/topics/default/typed/schema",
            json={
                "subject": "ids-value",
                "validation_policy": "enforce",
                "payload_validation": True,
            },
        )
        assert bound.status_code == 200, bound.text
        refused = await _post(mesh, "typed", _frame(b'{"id": 1}') + _frame(b'{"id": "x"}'))
        assert (refused.status_code, refused.json()["error"]["code"]) == (400, "schema_violation")
        stored = await _post(mesh, "typed", _frame(b'{"id": 1}') + _frame(b'{"id": 2}'))
        assert stored.status_code == 200, stored.text
        records = await _fetch_all(mesh, "/default/typed")
        schema_id = registered.json()["schema_id"]
        assert [(o, r.payload, r.schema_id, r.schema_version) for o, r in records] == [
            (0, b'{"id": 1}', schema_id, 1),
            (1, b'{"id": 2}', schema_id, 1),
        ]

        # The SDK's default is the binary body (its posts go over its lean HTTP client).
        seen: list[str] = []
        url = f"http://127.0.0.1:{mesh.settings.discovery.port}"
        async with AsyncDanubeClient(url) as client:
            wire = client._http._wire
            assert wire is not None
            post = wire.request

            async def log_type(
                method: str, target: str, *, content_type: str, body: bytes
            ) -> WireAnswer:
                seen.append(content_type)
                return await post(method, target, content_type=content_type, body=body)

            wire.request = log_type  # type: ignore[method-assign]
            async with client.producer("/default/sdk", name="sdk") as producer:
                results = [await producer.send_and_wait(p) for p in (b"a", b"b")]
            async with client.producer("/default/sdk", name="sdk", transport="json") as producer:
                results.append(await producer.send_and_wait(b"c"))
        assert [(r.partition, r.offset) for r in results] == [("/default/sdk", i) for i in range(3)]
        produced = [t for t in seen if t in ("application/vnd.danube.records", "application/json")]
        assert produced[-3:] == ["application/vnd.danube.records"] * 2 + ["application/json"]
        stored_sdk = await _fetch_all(mesh, "/default/sdk")
        assert [(r.payload, r.producer) for _, r in stored_sdk] == [
            (b"a", "sdk"),
            (b"b", "sdk"),
            (b"c", "sdk"),
        ]

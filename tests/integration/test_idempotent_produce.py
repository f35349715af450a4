"""Idempotent produce through discovery's HTTP doors on real NATS, etcd, ingest and
discovery: the sequence rules of a JSON and a binary body (refused whole, nothing stored),
partition_required and produce to one partition, resends answered with the first offsets and
``duplicate`` and stored once, a gap (409 out_of_order_sequence), an older epoch (409
producer_fenced), the producer epochs route, and a repeated message id (a topic's window)
answered duplicate message by message."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest

from danube.frame.produce import encode_produce_frame
from tests.integration.test_discovery_api import Mesh, MeshFactory, _fetch_all, mesh_for

__all__ = ["mesh_for"]  # the fixture, shared with the JSON tests

pytestmark = pytest.mark.integration

BINARY = {"content-type": "application/vnd.danube.records"}


def _messages(*sequences: int | None) -> list[dict[str, Any]]:
    return [
        {"payload": f"m{i}"} if s is None else {"payload": f"m{i}", "sequence": s}
        for i, s in enumerate(sequences)
    ]


def _frames(*records: tuple[str, int | None, int]) -> bytes:
    return b"".join(
        encode_produce_frame(
            b"payload", producer=name.encode(), publish_time_ms=1, sequence=seq, producer_epoch=ep
        )
        for name, seq, ep in records
    )


async def _json(mesh: Mesh, topic: str, body: dict[str, Any]) -> httpx.Response:
    return await mesh.http.post(f"/v1/topics/default/{topic}/messages", json=body)


async def _binary(mesh: Mesh, topic: str, body: bytes) -> httpx.Response:
    return await mesh.http.post(
        f"/v1/topics/default/{topic}/messages", content=body, headers=BINARY
    )


def _error(response: httpx.Response) -> tuple[int, str]:
    return response.status_code, response.json()["error"]["code"]


# Each refusal: (topic, body: JSON object or binary bytes, status, code).
REFUSED: dict[str, tuple[str, dict[str, Any] | bytes, int, str]] = {
    "json-some-sequenced": ("plain", {"messages": _messages(1, None)}, 400, "invalid_sequence"),
    "json-first-unsequenced": ("plain", {"messages": _messages(None, 1)}, 400, "invalid_sequence"),
    "json-gap": ("plain", {"messages": _messages(1, 3)}, 400, "invalid_sequence"),
    "json-backwards": ("plain", {"messages": _messages(2, 1)}, 400, "invalid_sequence"),
    "json-epoch-unsequenced": (
        "plain",
        {"messages": _messages(None), "producer_epoch": 2},
        400,
        "invalid_sequence",
    ),
    "json-epoch-text": (
        "plain",
        {"messages": _messages(1), "producer_epoch": "2"},
        400,
        "invalid_request",
    ),
    "json-epoch-negative": (
        "plain",
        {"messages": _messages(1), "producer_epoch": -1},
        400,
        "invalid_request",
    ),
    "json-epoch-over-u32": (
        "plain",
        {"messages": _messages(1), "producer_epoch": 2**32},
        400,
        "invalid_request",
    ),
    "json-sequence-negative": ("plain", {"messages": _messages(-1)}, 400, "invalid_request"),
    "json-sequence-text": (
        "plain",
        {"messages": [{"payload": "x", "sequence": "1"}]},
        400,
        "invalid_request",
    ),
    "json-partitioned-parent": (
        "parts",
        {"messages": _messages(0, 1)},
        400,
        "partition_required",
    ),
    "binary-some-sequenced": (
        "plain",
        _frames(("p", 1, 0), ("p", None, 0)),
        400,
        "invalid_sequence",
    ),
    "binary-two-producers": ("plain", _frames(("p", 1, 0), ("q", 2, 0)), 400, "invalid_sequence"),
    "binary-two-epochs": ("plain", _frames(("p", 1, 1), ("p", 2, 2)), 400, "invalid_sequence"),
    "binary-gap": ("plain", _frames(("p", 1, 0), ("p", 3, 0)), 400, "invalid_sequence"),
    "binary-partitioned-parent": ("parts", _frames(("p", 0, 0)), 400, "partition_required"),
    "no-such-partition": ("parts-part-7", {"messages": _messages(0)}, 404, "topic_not_found"),
}


async def test_sequence_rules_refuse_the_whole_request_and_store_nothing(
    mesh_for: MeshFactory,
) -> None:
    async with mesh_for() as mesh:
        assert (await mesh.http.put("/v1/topics/default/parts", json={"partitions": 2})).is_success
        assert (await _json(mesh, "plain", {"messages": _messages(None)})).status_code == 200
        for case, (topic, body, status, code) in REFUSED.items():
            if isinstance(body, bytes):
                answer = await _binary(mesh, topic, body)
            else:
                answer = await _json(mesh, topic, body)
            assert _error(answer) == (status, code), (case, answer.text)
        assert len(await _fetch_all(mesh, "/default/plain")) == 1  # the first, unsequenced
        for partition in ("/default/parts-part-0", "/default/parts-part-1"):
            assert await _fetch_all(mesh, partition) == []

        # What goes through: sequenced to one partition, to an unpartitioned topic, and
        # unsequenced to a partitioned topic's own name (routed as ever).
        to_one = await _json(mesh, "parts-part-1", {"messages": _messages(0, 1)})
        assert to_one.json() == {
            "results": [
                {"partition": "/default/parts-part-1", "offset": 0},
                {"partition": "/default/parts-part-1", "offset": 1},
            ]
        }
        binary = await _binary(mesh, "parts-part-0", _frames(("b", 5, 1), ("b", 6, 1)))
        assert binary.json() == {
            "runs": [{"partition": "/default/parts-part-0", "offset": 0, "count": 2}],
            "partitions": 2,  # the topic's count: a producer that routes itself sees a growth
        }
        plain = await _json(mesh, "plain", {"messages": _messages(0), "producer_epoch": 1})
        assert plain.json() == {"results": [{"partition": "/default/plain", "offset": 1}]}
        routed = await _json(mesh, "parts", {"messages": _messages(None, None)})
        assert routed.status_code == 200
        stored = await _fetch_all(mesh, "/default/parts-part-1")
        assert [(r.sequence, r.producer_epoch) for _, r in stored][:2] == [(0, 0), (1, 0)]


async def test_a_resend_is_answered_with_the_first_offsets_and_stored_once(
    mesh_for: MeshFactory,
) -> None:
    async with mesh_for() as mesh:
        body = {"producer": "orders-1", "producer_epoch": 1, "messages": _messages(0, 1, 2)}
        first = await _json(mesh, "idem", body)
        again = await _json(mesh, "idem", body)
        assert first.status_code == again.status_code == 200, again.text
        offsets = [(r["partition"], r["offset"]) for r in first.json()["results"]]
        assert offsets == [("/default/idem", 0), ("/default/idem", 1), ("/default/idem", 2)]
        assert "duplicate" not in first.text
        assert again.json() == {
            "results": [{"partition": p, "offset": o, "duplicate": True} for p, o in offsets]
        }
        assert len(await _fetch_all(mesh, "/default/idem")) == 3

        # The next request goes on; a gap after it is refused.
        following = await _json(mesh, "idem", {**body, "messages": _messages(3)})
        assert following.json() == {"results": [{"partition": "/default/idem", "offset": 3}]}
        gap = await _json(mesh, "idem", {**body, "messages": _messages(5, 6)})
        assert _error(gap) == (409, "out_of_order_sequence")

        # A newer epoch starts afresh at any sequence and fences the older one.
        newer = await _json(mesh, "idem", {**body, "producer_epoch": 2, "messages": _messages(0)})
        assert newer.json() == {"results": [{"partition": "/default/idem", "offset": 4}]}
        older = await _json(mesh, "idem", {**body, "messages": _messages(4)})
        assert _error(older) == (409, "producer_fenced")

        # A binary resend: its run says duplicate.
        frames = _frames(("bin", 0, 1), ("bin", 1, 1))
        stored = await _binary(mesh, "idem", frames)
        resent = await _binary(mesh, "idem", frames)
        run = {"partition": "/default/idem", "offset": 5, "count": 2}
        assert stored.json() == {"runs": [run], "partitions": 0}
        assert resent.json() == {"runs": [{**run, "duplicate": True}], "partitions": 0}
        assert len(await _fetch_all(mesh, "/default/idem")) == 7


async def test_epochs_count_up_per_topic_and_name_and_go_with_the_topic(
    mesh_for: MeshFactory,
) -> None:
    async with mesh_for(with_ingest=False) as mesh:
        http: httpx.AsyncClient = mesh.http

        async def epoch(topic: str, name: str, ns: str = "default") -> httpx.Response:
            return await http.post(f"/v1/topics/{ns}/{topic}/producers/{name}/epoch")

        assert (await epoch("ep", "p")).json() == {"producer": "p", "epoch": 1}
        assert (await epoch("ep", "p")).json() == {"producer": "p", "epoch": 2}
        assert (await epoch("ep", "other")).json()["epoch"] == 1
        assert (await epoch("ep2", "p")).json()["epoch"] == 1
        # A partition shares its topic's epochs; any name a record may carry is fine.
        assert (await epoch("ep-part-3", "p")).json()["epoch"] == 3
        assert (await epoch("ep", "caf%C3%A9 1")).json() == {"producer": "café 1", "epoch": 1}
        assert _error(await epoch("ep", "p", ns="nowhere")) == (404, "namespace_not_found")
        assert _error(await epoch("bad.name", "p")) == (400, "invalid_name")
        assert _error(await epoch("ep", "é" * 129)) == (400, "invalid_request")

        # Callers racing for one name each get their own epoch (compare-and-swap in etcd).
        raced = await asyncio.gather(*(epoch("race", "p") for _ in range(8)))
        assert sorted(r.json()["epoch"] for r in raced) == list(range(1, 9))

        assert (await http.put("/v1/topics/default/ep")).status_code == 201
        assert (await http.delete("/v1/topics/default/ep")).status_code == 204
        assert (await epoch("ep", "p")).json()["epoch"] == 1


async def test_a_repeated_message_id_is_answered_duplicate_message_by_message(
    mesh_for: MeshFactory,
) -> None:
    async with mesh_for() as mesh:
        window = {"policies": {"message_id_window_s": 60}}
        assert (await mesh.http.put("/v1/topics/default/ids", json=window)).is_success

        def ided(*ids: str) -> dict[str, Any]:
            return {
                "messages": [
                    {"payload": msg_id, "attributes": {"danube.message_id": msg_id}}
                    for msg_id in ids
                ]
            }

        first = await _json(mesh, "ids", ided("m1", "m2"))
        assert [r["offset"] for r in first.json()["results"]] == [0, 1]
        mixed = await _json(mesh, "ids", ided("m3", "m1"))
        assert mixed.json() == {
            "results": [
                {"partition": "/default/ids", "offset": 2},
                {"partition": "/default/ids", "offset": 0, "duplicate": True},
            ]
        }
        assert len(await _fetch_all(mesh, "/default/ids")) == 3

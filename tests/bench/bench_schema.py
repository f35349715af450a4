"""What checking payloads against a schema costs on produce: the same produce run (the SDK,
1 KiB JSON messages, batches of up to 1000, reliable + fsync) against a topic bound to a JSON
Schema with policy ``enforce`` and payload validation on, and against a topic without a
schema, alternating, in one mesh of real processes (nats-server, etcd, ingest, discovery).

Run: .venv/bin/python tests/bench/bench_schema.py
Prints one JSON line per run and the medians with their ratio.
"""

from __future__ import annotations

import asyncio
import json
import statistics
import tempfile
import uuid
from pathlib import Path

import orjson

from danube.bench.run import BenchSpec, Meter, bench_produce
from danube.client import AsyncDanubeClient

from mesh import bench_mesh

DURATION_S = 5.0
ROUNDS = 3
SCHEMA = {
    "type": "object",
    "properties": {
        "id": {"type": "integer"},
        "customer": {"type": "string", "maxLength": 64},
        "items": {"type": "array", "items": {"type": "string"}},
        "note": {"type": "string"},
    },
    "required": ["id", "customer", "items"],
}


def _payload() -> bytes:
    """A 1 KiB document valid under SCHEMA."""
    doc = {"id": 42, "customer": "c-7", "items": ["book", "pen"], "note": ""}
    doc["note"] = "x" * (1024 - len(orjson.dumps(doc)))
    payload = orjson.dumps(doc)
    assert len(payload) == 1024
    return payload


async def main(tmp: Path) -> None:
    async with bench_mesh(tmp, ["ingest", "discovery"]) as http:
        url = str(http.base_url).rstrip("/")
        registered = await http.post(
            "/v1/schemas/bench-value/versions",
            json={"schema_type": "json_schema", "schema": json.dumps(SCHEMA)},
        )
        registered.raise_for_status()
        rates: dict[str, list[float]] = {"enforce": [], "none": []}
        async with AsyncDanubeClient(url) as client:
            for _ in range(ROUNDS):
                for kind in ("enforce", "none"):
                    topic = f"bench-{kind}-{uuid.uuid4().hex[:6]}"
                    await client.admin.create_topic(f"/default/{topic}")
                    if kind == "enforce":
                        bound = await http.put(
                            f"/v1/topics/default/{topic}/schema",
                            json={
                                "subject": "bench-value",
                                "validation_policy": "enforce",
                                "payload_validation": True,
                            },
                        )
                        bound.raise_for_status()
                    spec = BenchSpec(
                        "produce", f"/default/{topic}", duration_s=DURATION_S, payload=_payload()
                    )
                    result = await bench_produce(
                        client, spec, Meter(total=None, duration_s=DURATION_S)
                    )
                    result["schema"] = kind
                    print(json.dumps(result), flush=True)
                    assert result["errors"] == 0, result
                    rates[kind].append(result["msgs_per_s"])
        enforce, none = (statistics.median(rates[k]) for k in ("enforce", "none"))
        print(
            json.dumps(
                {
                    "median_msgs_per_s_enforce": enforce,
                    "median_msgs_per_s_no_schema": none,
                    "ratio": round(enforce / none, 3),
                }
            )
        )


if __name__ == "__main__":
    with tempfile.TemporaryDirectory() as tmp:
        asyncio.run(main(Path(tmp)))

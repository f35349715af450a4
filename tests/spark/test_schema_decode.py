"""decode=schema on Spark local[2] with real etcd and objects: a topic bound through the
registry to an Avro subject with two versions, records stamped with each; the value column
holds what was produced (version-1 records resolved to version 2, the reader), a bad payload
gives a null value and a decode_error, schema_id/schema_version are read with or without
decode; decode on a topic with no binding is refused naming the option."""

from __future__ import annotations

import asyncio
import io
from pathlib import Path
from typing import Any

import fastavro
import orjson
import pytest
from pyspark.sql import SparkSession

from danube.config import CloudConfig
from danube.discovery.schemas.registry import SchemaRegistry
from danube.meta import MetaStore
from danube.names import TopicName
from danube.storage import ObjectStore

from tiers import FIRST_TIME_MS, Message, upload

pytestmark = [pytest.mark.integration, pytest.mark.spark, pytest.mark.timeout(120)]

TOPIC = TopicName("default", "orders")
SUBJECT = "orders-value"
V1 = {
    "type": "record",
    "name": "Order",
    "fields": [
        {"name": "id", "type": "long"},
        {"name": "item", "type": "string"},
        {"name": "note", "type": ["null", "string"], "default": None},
    ],
}
V2 = {"type": "record", "name": "Order", "fields": [*V1["fields"],
      {"name": "qty", "type": "int", "default": 1}]}  # fmt: skip


def _avro(schema: Any, datum: dict[str, Any]) -> bytes:
    out = io.BytesIO()
    fastavro.schemaless_writer(out, fastavro.parse_schema(schema), datum)
    return out.getvalue()


@pytest.mark.parametrize("cloud_config", ["fs"], indirect=True)
async def test_decode_reads_avro_payloads_with_the_registered_schema(
    spark: SparkSession, config_file: Path, store: MetaStore, cloud_config: CloudConfig
) -> None:
    registry = SchemaRegistry(store)
    first = await registry.register(SUBJECT, "avro", orjson.dumps(V1))
    second = await registry.register(SUBJECT, "avro", orjson.dumps(V2))
    assert (first.schema_id, first.version, second.version) == (second.schema_id, 1, 2)
    await registry.bind_topic(TOPIC, SUBJECT, validation_policy="enforce", payload_validation=True)
    schema_id = first.schema_id
    produced: list[tuple[bytes, int, dict[str, Any] | None]] = []
    for n in range(6):
        version = 1 + n % 2
        datum = {"id": n, "item": f"i{n}", "note": None if n % 3 else f"n{n}"}
        if version == 2:
            datum["qty"] = 10 + n
        produced.append((_avro(V1 if version == 1 else V2, datum), version, datum))
    produced.append((b"\x02", 2, None))  # a truncated datum
    messages = [
        Message(0, offset, FIRST_TIME_MS + offset, "t", None, {}, payload, schema_id, version)
        for offset, (payload, version, _) in enumerate(produced)
    ]
    await upload(store, ObjectStore.from_config(cloud_config), TOPIC, messages)

    def read(**options: str) -> list[dict[str, Any]]:
        reader = spark.read.format("danube").option("config", str(config_file))
        df = reader.options(**{"topic": str(TOPIC), **options}).load()
        rows: list[dict[str, Any]] = df.toArrow().to_pylist()
        return sorted(rows, key=lambda row: row["offset"])

    decoded = await asyncio.to_thread(read, decode="schema")
    assert [(row["schema_id"], row["schema_version"]) for row in decoded] == [
        (schema_id, version) for _, version, _ in produced
    ]
    assert [row["value"] for row in decoded] == [
        None if datum is None else {"qty": 1, **datum} for _, _, datum in produced
    ]
    assert [row["decode_error"] for row in decoded[:-1]] == [None] * 6
    assert decoded[-1]["decode_error"].startswith("not Avro of version 2")
    assert [row["payload"] for row in decoded] == [payload for payload, _, _ in produced]
    plain = await asyncio.to_thread(read)
    assert "value" not in plain[0]
    assert [(r["schema_id"], r["schema_version"]) for r in plain] == [
        (schema_id, version) for _, version, _ in produced
    ]
    with pytest.raises(Exception, match="option 'decode': topic /default/unbound is not bound"):
        await asyncio.to_thread(lambda: read(topic="/default/unbound", decode="schema"))

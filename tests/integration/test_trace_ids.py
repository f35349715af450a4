"""Trace ids through an in-process mesh: a produce's x-request-id (or traceparent) is echoed in
the response and lands in the log lines of discovery and of the ingest node it reached over
the bus; without either header a fresh id is made; concurrent requests keep their own ids."""

from __future__ import annotations

import asyncio
import logging
import re

import pytest

from danube.trace import TraceIdFilter
from tests.integration.conftest import ConsumeMesh

pytestmark = pytest.mark.integration


def _ids_of(caplog: pytest.LogCaptureFixture, logger_prefix: str, pattern: str) -> list[str | None]:
    """The trace ids of the captured lines of ``logger_prefix``'s loggers matching ``pattern``."""
    return [
        record.__dict__.get("trace_id")
        for record in caplog.records
        if record.name.startswith(logger_prefix) and re.search(pattern, record.getMessage())
    ]


async def test_request_id_reaches_discovery_and_ingest_logs(
    consume_mesh: ConsumeMesh, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.handler.addFilter(TraceIdFilter())  # what configure_logging puts on its handler
    async with consume_mesh() as http:
        topic = "/v1/topics/default/traced/messages"
        body = {"messages": [{"payload": "hello"}]}
        # The first produce creates the topic and elects its owner: not the one under test.
        assert (await http.post(topic, json=body)).status_code == 200
        caplog.clear()
        with caplog.at_level(logging.DEBUG, logger="danube"):
            answer = await http.post(topic, json=body, headers={"x-request-id": "req-42.a"})
            assert answer.status_code == 200, answer.text
            offset = answer.json()["results"][0]["offset"]
            await asyncio.sleep(0.2)  # lines logged after the reply was sent
        assert answer.headers["x-request-id"] == "req-42.a"
        assert _ids_of(
            caplog, "danube.discovery", "produce: 1 messages to /default/traced stored"
        ) == ["req-42.a"]
        assert _ids_of(caplog, "danube.ingest", rf"from offset {offset}$") == ["req-42.a"]
        # Every line logged while the request was served carries it: none carries another.
        assert {r.__dict__.get("trace_id") for r in caplog.records} <= {"req-42.a", None}


async def test_traceparent_generated_and_concurrent_ids(
    consume_mesh: ConsumeMesh, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.handler.addFilter(TraceIdFilter())
    async with consume_mesh() as http:
        topic = "/v1/topics/default/traced2/messages"
        body = {"messages": [{"payload": "x"}]}
        assert (await http.post(topic, json=body)).status_code == 200
        trace_hex = "4bf92f3577b34da6a3ce929d0e0e4736"
        parent = f"00-{trace_hex}-00f067aa0ba902b7-01"
        answer = await http.post(topic, json=body, headers={"traceparent": parent})
        assert answer.headers["x-request-id"] == trace_hex
        # No header (or one not fit for a log line): a fresh W3C-shaped id, one per request.
        plain = await http.post(topic, json=body)
        bad = await http.post(topic, json=body, headers={"x-request-id": "has space"})
        made = {plain.headers["x-request-id"], bad.headers["x-request-id"]}
        assert len(made) == 2
        assert all(re.fullmatch(r"[0-9a-f]{32}", i) for i in made)
        caplog.clear()
        with caplog.at_level(logging.DEBUG, logger="danube"):
            answers = await asyncio.gather(
                *(
                    http.post(topic, json=body, headers={"x-request-id": f"conc-{n}"})
                    for n in range(8)
                )
            )
            await asyncio.sleep(0.2)
        by_offset = {a.json()["results"][0]["offset"]: a.headers["x-request-id"] for a in answers}
        assert sorted(by_offset.values()) == sorted(f"conc-{n}" for n in range(8))
        for offset, request_id in by_offset.items():
            # Each ingest append is logged under the id of the request that made it.
            assert _ids_of(caplog, "danube.ingest", rf"from offset {offset}$") == [request_id]


async def test_unknown_route_still_echoes(consume_mesh: ConsumeMesh) -> None:
    async with consume_mesh() as http:
        answer = await http.get("/v1/nowhere", headers={"x-request-id": "lost-1"})
        assert answer.status_code == 404
        assert answer.headers["x-request-id"] == "lost-1"
        health = await http.get("/healthz")
        assert re.fullmatch(r"[0-9a-f]{32}", health.headers["x-request-id"])

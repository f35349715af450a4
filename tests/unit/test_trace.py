"""Trace ids: which incoming header wins, what is refused, the context binding, and the log
filter that puts the id on every JSON line logged within a request."""

from __future__ import annotations

import asyncio
import io
import logging
import re

import orjson
import pytest

from danube import trace
from danube.runtime.logs import JsonFormatter

pytestmark = pytest.mark.unit

PARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


@pytest.mark.parametrize(
    ("headers", "expected"),
    [
        ({"traceparent": PARENT, "x-request-id": "r1"}, "4bf92f3577b34da6a3ce929d0e0e4736"),
        ({"traceparent": "garbage", "x-request-id": "r1"}, "r1"),
        ({"traceparent": PARENT.replace("4bf92f3577b34da6a3ce929d0e0e4736", "0" * 32)}, None),
        ({"traceparent": "ff" + PARENT[2:]}, None),  # version ff is invalid
        ({"x-request-id": "abc-DEF_1.2:3@x/y+z="}, "abc-DEF_1.2:3@x/y+z="),
        ({"x-request-id": "with space"}, None),
        ({"x-request-id": "line\nbreak"}, None),
        ({"x-request-id": "x" * (trace.MAX_ID_CHARS + 1)}, None),
        ({"x-request-id": ""}, None),
        ({}, None),
    ],
)
def test_incoming_id(headers: dict[str, str], expected: str | None) -> None:
    got = trace.incoming(headers)
    if expected is None:
        assert re.fullmatch(r"[0-9a-f]{32}", got)  # a fresh one
        assert got not in headers.values()
    else:
        assert got == expected


def test_bus_headers_follow_the_context_and_tasks_inherit_it() -> None:
    assert trace.current() is None
    assert trace.bus_headers() == {}

    async def current_later() -> str | None:
        await asyncio.sleep(0)
        return trace.current()

    async def inside() -> tuple[str | None, ...]:
        with trace.bound("t-1"):
            child = asyncio.create_task(current_later())  # copies the context
            with trace.bound("t-2"):
                nested = trace.current()
            return await child, nested, trace.current()

    assert asyncio.run(inside()) == ("t-1", "t-2", "t-1")
    assert trace.current() is None
    with trace.bound("t-3"):
        assert trace.bus_headers() == {"Danube-Trace-Id": "t-3"}
        # Another client may canonicalize the header name: read ignoring case.
        assert trace.from_bus_headers({"danube-trace-id": "t-3"}) == "t-3"
    assert trace.from_bus_headers({"Danube-Trace-Id": "bad id"}) is None


def test_filter_puts_the_id_on_json_lines_within_a_request_only() -> None:
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(JsonFormatter("discovery"))
    handler.addFilter(trace.TraceIdFilter())
    logger = logging.getLogger("danube.test.trace")
    logger.addHandler(handler)
    logger.propagate = False
    try:
        logger.warning("outside")
        with trace.bound("req-7"):
            logger.warning("inside")
            logger.warning("explicit", extra={"trace_id": "kept"})
    finally:
        logger.removeHandler(handler)
        logger.propagate = True
    lines = [orjson.loads(line) for line in stream.getvalue().splitlines()]
    assert [line.get("trace_id") for line in lines] == [None, "req-7", "kept"]
    assert [line["msg"] for line in lines] == ["outside", "inside", "explicit"]

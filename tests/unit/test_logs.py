"""JSON log lines: fields, extras and exceptions."""

from __future__ import annotations

import logging

import orjson
import pytest

from danube.runtime.logs import JsonFormatter

pytestmark = pytest.mark.unit


def test_a_record_becomes_one_json_line_with_extras_and_exception() -> None:
    logger = logging.getLogger("danube.test")
    try:
        raise ValueError("boom")
    except ValueError:
        record = logger.makeRecord(
            "danube.test",
            logging.WARNING,
            __file__,
            1,
            "moved %s",
            ("p-1",),
            None,
            extra={"partition": "/default/t-part-0"},
        )
        import sys

        record.exc_info = sys.exc_info()
    line = JsonFormatter("ingest").format(record)
    assert "\n" not in line.split('"exc"')[0]
    doc = orjson.loads(line)
    assert doc["msg"] == "moved p-1"
    assert doc["level"] == "warning"
    assert doc["service"] == "ingest"
    assert doc["logger"] == "danube.test"
    assert doc["partition"] == "/default/t-part-0"
    assert "ValueError: boom" in doc["exc"]
    assert doc["ts"].endswith("Z")

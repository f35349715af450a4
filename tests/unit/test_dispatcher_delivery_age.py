"""The dispatcher's delivery age histogram: one observation per batch, the first first
delivery's age since its publish time; redeliveries and unreadable records are not timed."""

from __future__ import annotations

import time

import pytest
from prometheus_client import REGISTRY

from danube.dispatcher.metrics import observe_delivery_age
from danube.frame import Record, encode_frame, encode_record

pytestmark = pytest.mark.unit


def _frame(offset: int, age_s: float) -> bytes:
    published_ms = int((time.time() - age_s) * 1000)
    record = encode_record(Record(payload=b"x", publish_time_ms=published_ms, producer="p"))
    return encode_frame(offset, record)


def _age() -> tuple[float, float]:
    count = REGISTRY.get_sample_value("danube_dispatcher_delivery_age_seconds_count") or 0.0
    total = REGISTRY.get_sample_value("danube_dispatcher_delivery_age_seconds_sum") or 0.0
    return count, total


def test_the_first_first_delivery_of_a_batch_is_aged_once() -> None:
    count, total = _age()
    # A redelivery an hour old comes first: its age is its redelivery delay, not a hop.
    observe_delivery_age([1, 0, 0], [_frame(0, 3600.0), _frame(1, 2.0), _frame(2, 1.0)])
    count_after, total_after = _age()
    assert count_after == count + 1
    assert total_after - total == pytest.approx(2.0, abs=0.5)


def test_redeliveries_and_unreadable_records_are_not_timed() -> None:
    count, _ = _age()
    observe_delivery_age([2], [_frame(0, 5.0)])
    observe_delivery_age([0], [b""])  # no frame, no record header
    observe_delivery_age([], [])
    assert _age()[0] == count

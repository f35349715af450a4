"""danube_gc_pause_seconds: every collection is timed, by generation, once tracked."""

from __future__ import annotations

import gc

import pytest
from prometheus_client import REGISTRY

from danube.runtime.gcpause import track_gc_pauses

pytestmark = pytest.mark.unit


def _count(generation: int) -> float:
    value = REGISTRY.get_sample_value(
        "danube_gc_pause_seconds_count", {"generation": str(generation)}
    )
    return value or 0.0


def test_each_collection_is_timed_under_its_generation_and_tracking_is_idempotent() -> None:
    track_gc_pauses()
    track_gc_pauses()
    hooks = len(gc.callbacks)
    before = [_count(g) for g in range(3)]
    gc.collect(0)
    gc.collect(2)
    gc.collect(2)
    after = [_count(g) for g in range(3)]
    assert after[0] - before[0] >= 1
    assert after[2] - before[2] >= 2
    track_gc_pauses()
    assert len(gc.callbacks) == hooks  # never hooked twice: each collection counted once
    summed = REGISTRY.get_sample_value("danube_gc_pause_seconds_sum", {"generation": "2"})
    assert summed is not None
    assert summed > 0

"""danube_gc_pause_seconds: every collection is timed, by generation, once tracked."""

from __future__ import annotations

import gc
import json
import subprocess
import sys

import pytest
from prometheus_client import REGISTRY

from danube.runtime.gcpause import FULL_COLLECTION_AFTER, track_gc_pauses

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


_CHURN = """
import collections, gc, json, sys
from danube.runtime.gcpause import collect_fully_less_often
gc.freeze()  # as a service does once it has started
if sys.argv[1] == "less":
    collect_fully_less_often()
stats = gc.get_stats
full, middle = stats()[2]["collections"], stats()[1]["collections"]
ring = collections.deque()
for _ in range(3000):  # batches of objects that live a while, as messages in flight do
    ring.append([[n] for n in range(1000)])
    if len(ring) > 20:
        ring.popleft()
print(json.dumps([stats()[2]["collections"] - full, stats()[1]["collections"] - middle]))
"""


def _churn(mode: str) -> tuple[int, int]:
    out = subprocess.run(
        [sys.executable, "-c", _CHURN, mode], capture_output=True, text=True, check=True
    )
    full, middle = json.loads(out.stdout)
    return full, middle


def test_full_collections_come_after_a_hundred_middle_ones_not_ten() -> None:
    default_full, default_middle = _churn("default")
    full, middle = _churn("less")
    assert middle >= 200  # enough middle collections to tell
    assert default_middle >= 200
    # CPython's default: one per 10, fewer while a quarter as many objects as survived the
    # last full one have not reached the old generation yet.
    assert default_full >= default_middle // 20
    assert full <= middle // FULL_COLLECTION_AFTER + 1
    assert full * 5 < default_full

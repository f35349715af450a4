"""How long the cyclic garbage collector holds this process, per generation: while it runs
nothing else does (the event loop, the writer thread's hand-over), so a long collection is
latency on everything in flight. prometheus_client's own collector counts collections; this
times them. One histogram per process, fed by a ``gc.callbacks`` hook.

And how often the longest of them run (:func:`collect_fully_less_often`)."""

from __future__ import annotations

import gc
import time
from typing import Any

from prometheus_client import Histogram

GC_PAUSE_SECONDS = Histogram(
    "danube_gc_pause_seconds",
    "How long one cyclic garbage collection held this process, by generation",
    ["generation"],
    buckets=(0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25),
)
_BY_GENERATION = tuple(GC_PAUSE_SECONDS.labels(str(generation)) for generation in range(3))
_started_s = 0.0

# A full collection after this many collections of the middle generation (CPython's default:
# 10). A service makes objects that live for a few hundred milliseconds at a steady rate (a
# message in flight until acked, its frame, its entry), so the old generation takes in some
# at every middle collection and the default rule runs a full one every second or two, each
# walking everything the process made since it started (what it built to start is frozen:
# danube.runtime.service) — 20-30 ms on this project's 2-core machine in a dispatcher
# delivering 8 000 delayed messages a second: 66-69 of them in two minutes, 46-59 over
# 10 ms. With 100: 6-7, 4-6 over 10 ms, and the lateness p99 of its delayed messages 35
# and 39 ms against 49 and 181 in runs alternated with the default (docs/performance.md,
# "Delayed delivery"). Cyclic garbage that reached the old generation waits ten times longer
# to be freed; CPython's other rule (no full collection until a quarter as many objects as
# survived the last one are new to the old generation) still holds.
FULL_COLLECTION_AFTER = 100


def _timed(phase: str, info: dict[str, Any]) -> None:
    global _started_s
    if phase == "start":
        _started_s = time.perf_counter()
    else:
        _BY_GENERATION[info["generation"]].observe(time.perf_counter() - _started_s)


def track_gc_pauses() -> None:
    """Time every collection of this process from now on (idempotent)."""
    if _timed not in gc.callbacks:
        gc.callbacks.append(_timed)


def collect_fully_less_often() -> None:
    """A full collection after :data:`FULL_COLLECTION_AFTER` middle ones, not CPython's 10
    (the young and middle thresholds are left as they are)."""
    young, middle, _ = gc.get_threshold()
    gc.set_threshold(young, middle, FULL_COLLECTION_AFTER)

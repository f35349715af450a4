"""How long the cyclic garbage collector holds this process, per generation: while it runs
nothing else does (the event loop, the writer thread's hand-over), so a long collection is
latency on everything in flight. prometheus_client's own collector counts collections; this
times them. One histogram per process, fed by a ``gc.callbacks`` hook."""

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

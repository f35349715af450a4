"""What a bench run measures: latency samples (exact count and max, percentiles over a
reservoir) and the rates and CPU a result reports."""

from __future__ import annotations

import random

SAMPLES_MAX = 1_000_000


class Latencies:
    """Latency samples in seconds: exact count and max, percentiles over a reservoir."""

    def __init__(self, rng: random.Random | None = None) -> None:
        self.count = 0
        self.max_s = 0.0
        self._samples: list[float] = []
        self._rng = rng or random.Random(7)

    def add(self, seconds: float) -> None:
        """Record one latency."""
        self.count += 1
        self.max_s = max(self.max_s, seconds)
        if len(self._samples) < SAMPLES_MAX:
            self._samples.append(seconds)
            return
        slot = self._rng.randrange(self.count)
        if slot < SAMPLES_MAX:
            self._samples[slot] = seconds

    def summary_ms(self) -> dict[str, float | int] | None:
        """p50, p99, p99.9 and max in milliseconds (None without samples)."""
        if not self._samples:
            return None
        ordered = sorted(self._samples)

        def pick(q: float) -> float:
            return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000, 3)

        return {
            "p50": pick(0.50),
            "p99": pick(0.99),
            "p999": pick(0.999),
            "max": round(self.max_s * 1000, 3),
            "samples": self.count,
        }


def rates(messages: int, size: int, elapsed_s: float) -> dict[str, float]:
    elapsed = max(elapsed_s, 1e-9)
    return {
        "duration_s": round(elapsed_s, 3),
        "msgs_per_s": round(messages / elapsed, 1),
        "mb_per_s": round(messages * size / 1e6 / elapsed, 3),
    }


def cpu_summary(messages: int, cpu_s: float, elapsed_s: float) -> dict[str, float]:
    """This process's CPU over a timed part of a run (see the module docstring)."""
    return {
        "client_cpu_s": round(cpu_s, 3),
        "client_cpu_per_wall": round(cpu_s / max(elapsed_s, 1e-9), 3),
        "client_cpu_us_per_msg": round(cpu_s * 1e6 / max(messages, 1), 2),
    }

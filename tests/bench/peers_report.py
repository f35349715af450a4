"""The pure half of bench_peers.py: /proc CPU times, medians, per-run ratios and the table.

A run is a flat ``{measure: value}`` map (e.g. ``"batched.mesh.msgs_per_s": 18724.0``); a
comparison names a mesh measure and a peer measure of the same run. The ratio is taken
inside each run (mesh ÷ peer, both measured minutes apart on the same machine) and the
median of those ratios is reported, so a noisy neighbour that slows one run slows both
sides of its ratio."""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

Run = Mapping[str, float]

# /proc/<pid>/stat after the ")" that closes the command name: field 14 (utime) and 15
# (stime) of proc(5) are the 12th and 13th of what follows it (state is the 1st).
_UTIME_AFTER_COMM = 11
_STIME_AFTER_COMM = 12


def cpu_seconds_of_stat(stat: str, ticks_per_s: int) -> float:
    """User + system CPU seconds from the text of ``/proc/<pid>/stat``. The command name
    may hold spaces and parentheses, so fields are counted from the last ``)``."""
    if ticks_per_s <= 0:
        raise ValueError(f"ticks_per_s must be positive, not {ticks_per_s}")
    _, paren, rest = stat.rpartition(")")
    fields = rest.split()
    if not paren or len(fields) <= _STIME_AFTER_COMM:
        raise ValueError(f"not a /proc/<pid>/stat line: {stat[:80]!r}")
    return (int(fields[_UTIME_AFTER_COMM]) + int(fields[_STIME_AFTER_COMM])) / ticks_per_s


def cpu_us_per_message(before_s: float, after_s: float, messages: int) -> float:
    """CPU microseconds one process spent per message between two readings."""
    if messages <= 0:
        raise ValueError(f"messages must be positive, not {messages}")
    if after_s < before_s:
        raise ValueError(f"CPU time went backwards: {before_s} -> {after_s}")
    return (after_s - before_s) * 1e6 / messages


def quantile_ms(samples_s: Sequence[float], q: float) -> float:
    """The ``q`` quantile (nearest rank) of latencies in seconds, in milliseconds."""
    if not samples_s:
        raise ValueError("no samples")
    if not 0.0 <= q <= 1.0:
        raise ValueError(f"q must be within [0, 1], not {q}")
    ordered = sorted(samples_s)
    rank = max(1, math.ceil(q * len(ordered)))
    return ordered[rank - 1] * 1000.0


@dataclass(frozen=True)
class Comparison:
    """One line of the table: a mesh measure against a peer measure (``peer_key`` None:
    no peer row, e.g. produce→deliver, where ``goal`` says what the mesh must reach)."""

    row: str
    measure: str  # unit, e.g. "msg/s", "p50 ms"
    mesh_key: str
    peer: str = ""
    peer_key: str | None = None
    goal: str = ""


@dataclass(frozen=True)
class Line:
    """A comparison's medians over the runs that measured it (None: no run did)."""

    comparison: Comparison
    mesh: float | None
    peer: float | None
    ratio: float | None
    runs: int


def median_or_none(values: Sequence[float]) -> float | None:
    """The median, or None for no values."""
    return statistics.median(values) if values else None


def summarize(runs: Sequence[Run], comparisons: Sequence[Comparison]) -> list[Line]:
    """Medians of each side and of the per-run ratio (a run missing either side of a
    comparison gives no ratio for it)."""
    lines = []
    for comparison in comparisons:
        mesh = [run[comparison.mesh_key] for run in runs if comparison.mesh_key in run]
        peer_key = comparison.peer_key
        peer = [] if peer_key is None else [run[peer_key] for run in runs if peer_key in run]
        ratios = [
            run[comparison.mesh_key] / run[peer_key]
            for run in runs
            if peer_key is not None and comparison.mesh_key in run and run.get(peer_key, 0.0) > 0.0
        ]
        lines.append(
            Line(
                comparison,
                median_or_none(mesh),
                median_or_none(peer),
                median_or_none(ratios),
                len(mesh),
            )
        )
    return lines


def _number(value: float | None) -> str:
    if value is None:
        return "—"
    if value >= 100:
        return f"{value:,.0f}"
    return f"{value:.2f}"


HEADER = ("row", "measure", "the mesh", "peer", "peer value", "ratio mesh÷peer")


def table_rows(lines: Sequence[Line]) -> list[tuple[str, str, str, str, str, str]]:
    """The table as strings, a row's name shown once above its continuation lines."""
    rows = []
    previous = ""
    for line in lines:
        c = line.comparison
        name = c.row if c.row != previous else ""
        previous = c.row
        ratio = "—" if line.ratio is None else f"{line.ratio:.2f}x"
        peer = c.peer or c.goal
        rows.append((name, c.measure, _number(line.mesh), peer, _number(line.peer), ratio))
    return rows


def cpu_rows(runs: Sequence[Run], prefix: str = "cpu_us_per_msg.") -> list[tuple[str, str]]:
    """(process, median CPU µs per message) for every ``cpu_us_per_msg.<process>`` measure,
    in the order first seen."""
    names: list[str] = []
    for run in runs:
        names += [key for key in run if key.startswith(prefix) and key not in names]
    out = []
    for key in names:
        value = median_or_none([run[key] for run in runs if key in run])
        out.append((key.removeprefix(prefix), _number(value)))
    return out

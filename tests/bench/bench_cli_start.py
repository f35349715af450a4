"""How long the `danube` command takes to start (docs/cli.md, "Start time"): the whole
`danube --help`, and `danube produce` from the start of its process to the first byte of its
first request (a listener of this script's own takes the connection, reads that byte and
closes it: no mesh needed). Each is run ``--runs`` times after one warm-up; prints the
median, the minimum and the maximum in seconds and whether each median is within the
budget (0.3 s, issue 35), with the median CPU time (what the wall time would be on a quiet
machine, nearly: the process waits for no I/O), one JSON line with ``--json``.

Run: .venv/bin/python tests/bench/bench_cli_start.py [--runs 10] [--json] [--danube PATH]
(``--danube``: another build of the command, e.g. a checkout of an older commit, to compare)
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

DANUBE = Path(sys.executable).with_name("danube")
BUDGET_S = 0.3
# A run that takes longer than this is a hung command, not a slow one.
RUN_TIMEOUT_S = 30.0


def _help_s(danube: Path) -> tuple[float, float]:
    """Wall and CPU seconds of a whole `danube --help`."""
    cpu_before = _children_cpu_s()
    started = time.perf_counter()
    subprocess.run(
        [str(danube), "--help"], check=True, stdout=subprocess.DEVNULL, timeout=RUN_TIMEOUT_S
    )
    return time.perf_counter() - started, _children_cpu_s() - cpu_before


def _children_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _cpu_so_far_s(pid: int) -> float:
    """The CPU seconds process ``pid`` has used until now (/proc: clock ticks, 10 ms)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _first_byte_s(danube: Path) -> tuple[float, float]:
    """Wall and CPU seconds from starting `danube produce` to the first byte it sends."""
    with socket.create_server(("127.0.0.1", 0)) as listener:
        port = listener.getsockname()[1]
        listener.settimeout(RUN_TIMEOUT_S)
        command = [str(danube), "produce", "-s", f"http://127.0.0.1:{port}"]
        command += ["-t", "/default/start", "-m", "hello", "--timeout", "0.1"]
        started = time.perf_counter()
        process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            connection, _ = listener.accept()
            with connection:
                connection.settimeout(RUN_TIMEOUT_S)
                if not connection.recv(1):
                    raise RuntimeError("danube produce closed without sending")
                elapsed = time.perf_counter() - started
                cpu_s = _cpu_so_far_s(process.pid)
        finally:
            process.kill()
            process.wait(RUN_TIMEOUT_S)
    return elapsed, cpu_s


def _measure(
    sample: Callable[[Path], tuple[float, float]], danube: Path, runs: int
) -> dict[str, float]:
    sample(danube)  # warm-up: the page cache, the .pyc files
    walls, cpus = zip(*(sample(danube) for _ in range(runs)), strict=True)
    return {
        "median_s": round(statistics.median(walls), 4),
        "min_s": round(min(walls), 4),
        "max_s": round(max(walls), 4),
        # On a busy machine the wall time waits for a CPU; the CPU time does not.
        "cpu_median_s": round(statistics.median(cpus), 4),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--danube", type=Path, default=DANUBE)
    args = parser.parse_args()
    results = {
        "danube --help": _measure(_help_s, args.danube, args.runs),
        "danube produce, first byte": _measure(_first_byte_s, args.danube, args.runs),
    }
    if args.json:
        print(json.dumps({"runs": args.runs, "budget_s": BUDGET_S, **results}))
        return
    for name, figures in results.items():
        verdict = "within" if figures["median_s"] <= BUDGET_S else "OVER"
        print(
            f"{name:<28} median {figures['median_s']:.3f} s (min {figures['min_s']:.3f}, "
            f"max {figures['max_s']:.3f}; {args.runs} runs; CPU median "
            f"{figures['cpu_median_s']:.3f} s) {verdict} the {BUDGET_S} s budget"
        )


if __name__ == "__main__":
    main()

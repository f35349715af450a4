"""How long the `danube` command takes to start (docs/cli.md, "Start time"): the whole
`danube --help`, and `danube produce` from the start of its process to the first byte of its
first request (a listener of this script's own takes the connection, reads that byte and
closes it: no mesh needed). Each is run ``--runs`` times after one warm-up; prints the
median, the minimum and the maximum in seconds and whether each median is within the
budget (0.3 s, issue 35), one JSON line with ``--json``.

Run: .venv/bin/python tests/bench/bench_cli_start.py [--runs 10] [--json] [--danube PATH]
(``--danube``: another build of the command, e.g. a checkout of an older commit, to compare)
"""

from __future__ import annotations

import argparse
import json
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


def _help_s(danube: Path) -> float:
    started = time.perf_counter()
    subprocess.run(
        [str(danube), "--help"], check=True, stdout=subprocess.DEVNULL, timeout=RUN_TIMEOUT_S
    )
    return time.perf_counter() - started


def _first_byte_s(danube: Path) -> float:
    """Seconds from starting `danube produce` to the first byte it sends."""
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
        finally:
            process.kill()
            process.wait(RUN_TIMEOUT_S)
    return elapsed


def _measure(sample: Callable[[Path], float], danube: Path, runs: int) -> dict[str, float]:
    sample(danube)  # warm-up: the page cache, the .pyc files
    times = [sample(danube) for _ in range(runs)]
    return {
        "median_s": round(statistics.median(times), 4),
        "min_s": round(min(times), 4),
        "max_s": round(max(times), 4),
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
            f"max {figures['max_s']:.3f}; {args.runs} runs) {verdict} the {BUDGET_S} s budget"
        )


if __name__ == "__main__":
    main()

"""Two checkouts measured at the same moment: a mesh of each (its ``libs`` and ``services``
first on PYTHONPATH, for the services and for the ``danube bench`` client that drives it),
side by side, and each row run on both at once, so both see the same load from whatever
else the machine runs. On a shared machine whose load swings between runs, paired runs
compare where runs taken one after the other do not (docs/performance.md, "One message at a
time: the waits").

    .venv/bin/python tests/bench/bench_paired.py --base /tmp/base --this /tmp/this \
        [--rows paced,e2e1000,e2e5000,batched] [--rounds 10] [--sequential]

``/tmp/base`` and ``/tmp/this``: ``git archive <commit> libs services | tar -x -C <dir>``.
With ``--sequential`` a round's two runs go one after the other (A B, then B A, ...)
instead of at once, for rows that load the machine themselves (two e2e runs at once
saturate two cores). One warm-up round, then ``--rounds`` counted; each round prints both
runs as JSON, and at the end the medians (p50, p99 and msg/s) and how many pairs ``this``
had the lower p50 and p99.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import tempfile
from contextlib import AsyncExitStack
from pathlib import Path

from mesh import DANUBE, bench_mesh

ROWS = {
    "paced": [
        *("produce", "--batch-size", "1", "--linger-ms", "0", "--inflight", "1"),
        *("--rate", "50", "-n", "250"),
    ],
    "e2e1000": ["e2e", "--rate", "1000", "-d", "5"],
    "e2e5000": ["e2e", "--rate", "5000", "-d", "5"],
    "batched": ["produce", "--batch-size", "1000", "--inflight", "4", "-n", "100000"],
}


def _pythonpath(tree: Path) -> str:
    return f"{tree / 'libs'}:{tree / 'services'}"


async def _run(url: str, tree: Path, row: str) -> dict[str, object]:
    kind, *args = ROWS[row]
    command = [DANUBE, "bench", kind, "-s", url, "--size", "1024", "--json", *args]
    env = {**os.environ, "PYTHONPATH": _pythonpath(tree)}
    out = await asyncio.to_thread(
        subprocess.run, command, capture_output=True, text=True, check=True, env=env
    )
    result: dict[str, object] = json.loads(out.stdout)
    return result


def _latency(result: dict[str, object]) -> tuple[float, float]:
    latency = result["latency_ms"]
    assert isinstance(latency, dict)
    return float(latency["p50"]), float(latency["p99"])


async def _round(
    urls: dict[str, str], trees: dict[str, Path], row: str, counted: int, sequential: bool
) -> list[dict[str, object]]:
    """Both trees' runs of one round: at once, or one after the other (the order turned
    round by round: A B, B A, ...)."""
    if not sequential:
        return list(
            await asyncio.gather(*(_run(urls[name], tree, row) for name, tree in trees.items()))
        )
    names = list(trees) if counted % 2 == 0 else list(reversed(trees))
    results = {name: await _run(urls[name], trees[name], row) for name in names}
    return [results[name] for name in trees]


async def main(
    trees: dict[str, Path], rows: list[str], rounds: int, *, sequential: bool = False
) -> None:
    async with AsyncExitStack() as stack:
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="bench-paired-")))
        urls: dict[str, str] = {}
        for name, tree in trees.items():
            http = await stack.enter_async_context(
                bench_mesh(
                    tmp / name,
                    ["ingest", "dispatcher", "discovery"],
                    env={"PYTHONPATH": _pythonpath(tree)},
                )
            )
            urls[name] = str(http.base_url).rstrip("/")
        for row in rows:
            pairs: list[dict[str, tuple[float, float]]] = []
            rates: list[dict[str, float]] = []
            for counted in range(rounds + 1):  # the first round warms up
                results = await _round(urls, trees, row, counted, sequential)
                named = dict(zip(trees, results, strict=True))
                pair = {name: _latency(result) for name, result in named.items()}
                print(json.dumps({"row": row, "round": counted, **named}))
                if counted:
                    pairs.append(pair)
                    rates.append({n: float(str(r.get("msgs_per_s", 0))) for n, r in named.items()})
            summary: dict[str, object] = {"row": row, "pairs": len(pairs)}
            for name in trees:
                summary[f"{name}_p50_ms"] = statistics.median(p[name][0] for p in pairs)
                summary[f"{name}_p99_ms"] = statistics.median(p[name][1] for p in pairs)
            for name in trees:
                summary[f"{name}_msgs_per_s"] = statistics.median(r[name] for r in rates)
            summary["this_lower_p50"] = sum(p["this"][0] < p["base"][0] for p in pairs)
            summary["this_lower_p99"] = sum(p["this"][1] < p["base"][1] for p in pairs)
            print(json.dumps(summary), flush=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base", type=Path, required=True)
    parser.add_argument("--this", type=Path, required=True)
    parser.add_argument("--rows", default="paced,e2e1000,e2e5000")
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument(
        "--sequential",
        action="store_true",
        help="run a round's two runs one after the other, alternating which goes first",
    )
    options = parser.parse_args()
    asyncio.run(
        main(
            {"base": options.base, "this": options.this},
            options.rows.split(","),
            options.rounds,
            sequential=options.sequential,
        )
    )

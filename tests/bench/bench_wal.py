"""WAL append throughput: one partition, 1 KiB records, fsync durability, on a temp directory.

Run: ``.venv/bin/python tests/bench/bench_wal.py [--seconds 3] [--runs 3]``. Each scenario
runs ``--runs`` times for ``--seconds``; the median run is reported. Not collected by pytest.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from danube.config.wal_cloud import WalConfig
from danube.ingest.wal import Durability, Wal, WalOptions

RECORD_BYTES = 1024
SCENARIOS: list[tuple[str, int, int]] = [  # name, producers, messages per append
    ("1 producer, single messages", 1, 1),
    ("1 producer, batches of 100", 1, 100),
    ("100 producers, single messages", 100, 1),
    ("100 producers, batches of 10", 100, 10),
]


@dataclass(frozen=True)
class Run:
    """One run's rates."""

    msgs_per_s: float
    mb_per_s: float
    fsyncs_per_s: float
    median_batch: float


async def run_once(directory: Path, producers: int, per_append: int, seconds: float) -> Run:
    """Append for ``seconds`` from ``producers`` tasks; measure rates from the WAL's stats."""
    options = WalOptions.from_config(WalConfig(), Durability.FSYNC)
    wal = await Wal.open(directory, options)
    batch_sizes: list[int] = []
    wal.add_durable_listener(lambda run: batch_sizes.append(len(run.payloads)))
    records = [os.urandom(RECORD_BYTES) for _ in range(per_append)]
    loop = asyncio.get_running_loop()
    deadline = loop.time() + seconds

    async def producer() -> None:
        while loop.time() < deadline:
            await wal.append(records)

    started = time.perf_counter()
    await asyncio.gather(*(producer() for _ in range(producers)))
    elapsed = time.perf_counter() - started
    stats = wal.stats()
    await wal.close()
    return Run(
        msgs_per_s=stats.messages / elapsed,
        mb_per_s=stats.messages * RECORD_BYTES / elapsed / 1e6,
        fsyncs_per_s=stats.fsyncs / elapsed,
        median_batch=statistics.median(batch_sizes) if batch_sizes else 0.0,
    )


def main(argv: Sequence[str] | None = None) -> int:
    """Run every scenario and print one line each."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=3.0, help="length of one run")
    parser.add_argument("--runs", type=int, default=3, help="runs per scenario (median kept)")
    args = parser.parse_args(argv)
    out = sys.stdout
    out.write(
        f"WAL append, {RECORD_BYTES} B records, fsync, median of {args.runs} x {args.seconds} s\n"
    )
    out.write(f"{'scenario':34} {'msgs/s':>10} {'MB/s':>8} {'fsyncs/s':>9} {'batch':>7}\n")
    for name, producers, per_append in SCENARIOS:
        runs = []
        for _ in range(args.runs):
            with tempfile.TemporaryDirectory(prefix="bench-wal-") as tmp:
                runs.append(
                    asyncio.run(run_once(Path(tmp) / "p", producers, per_append, args.seconds))
                )
        best = sorted(runs, key=lambda run: run.msgs_per_s)[len(runs) // 2]
        out.write(
            f"{name:34} {best.msgs_per_s:10,.0f} {best.mb_per_s:8.1f} "
            f"{best.fsyncs_per_s:9,.0f} {best.median_batch:7.0f}\n"
        )
        out.flush()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

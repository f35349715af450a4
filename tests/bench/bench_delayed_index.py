"""The delay index alone (danube.dispatcher.delayed), in this process: N messages (default
2 000 000) filed with random due times over 120 s, as a dispatcher reading them files them,
with the default memory bound and spill files in a temporary directory; then every one taken
as it falls due (the clock advanced 50 ms a step). Prints the filing and taking rates, the
process's resident memory and Python object count before, after filing and at the end, and
the bytes spilled: memory held does not grow with N, objects do not grow per message.

Run: .venv/bin/python tests/bench/bench_delayed_index.py [messages]
"""

from __future__ import annotations

import gc
import random
import sys
import tempfile
import time
from pathlib import Path

from danube.dispatcher.delayed import DelayedMessages
from danube.dispatcher.spill import FileSpill
from danube.frame import RawFrame, Record, encode_frame, encode_record
from danube.wire.delay import DELIVER_AT_ATTRIBUTE

T0 = 1_700_000_000_000


def _rss_mib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def main(count: int) -> None:
    rng = random.Random(34)
    record = encode_record(
        Record(
            payload=b"x" * 64,
            publish_time_ms=T0,
            producer="bench",
            attributes={DELIVER_AT_ATTRIBUTE: str(T0)},
        )
    )
    with tempfile.TemporaryDirectory(prefix="bench-delay-index-") as tmp:
        spill = FileSpill(Path(tmp) / "spill")
        index = DelayedMessages(spill)
        gc.collect()
        objects_before, rss_before = len(gc.get_objects()), _rss_mib()
        started = time.perf_counter()
        for offset in range(count):
            frame = RawFrame(offset, memoryview(encode_frame(offset, record)))
            index.file(f"p{offset % 4}", offset, T0 + rng.randrange(1_000, 120_000), frame)
        filed_s = time.perf_counter() - started
        spill.drain()
        gc.collect()
        objects_filed, rss_filed = len(gc.get_objects()), _rss_mib()
        print(
            f"filed {count} in {filed_s:.1f} s ({count / filed_s:,.0f}/s); frames "
            f"{len(record) + 16} B; spilled {index.spilled_bytes / 2**20:,.0f} MiB; "
            f"in memory {index.memory_bytes / 2**20:.1f} MiB"
        )
        print(
            f"RSS {rss_before:.0f} -> {rss_filed:.0f} MiB; Python objects "
            f"{objects_before:,} -> {objects_filed:,} (+{objects_filed - objects_before:,})"
        )
        started = time.perf_counter()
        now, taken, rss_peak = T0, 0, rss_filed
        while index.filed:
            now += 50
            got = index.take_due(now, 100_000)
            taken += len(got)
            for due in got:
                index.done(due.partition, due.offset)
            rss_peak = max(rss_peak, _rss_mib())
        taken_s = time.perf_counter() - started
        print(
            f"took {taken} in {taken_s:.1f} s ({taken / taken_s:,.0f}/s), RSS peak while "
            f"taking {rss_peak:.0f} MiB; held at the end {index.held}"
        )
        spill.clear()
        spill.drain()


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 2_000_000)

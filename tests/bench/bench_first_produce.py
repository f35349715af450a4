"""The first produce to a new topic against the next ones: the claim a new partition needs
(placement, leadership, its WAL opened, its handlers subscribed) is paid by one message, and
in a short paced run that one message is the p99 (docs/performance.md, "The tail at a light
load"). Creates ``--topics`` fresh topics one after the other on a mesh of its own and times,
through the SDK, each topic's first message and the ``--next`` after it (one at a time, no
linger). Prints the medians and the worst; ``--json``: every sample too."""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
import time
from pathlib import Path

from danube.client import AsyncDanubeClient

from mesh import bench_mesh


async def _topic(client: AsyncDanubeClient, name: str, following: int) -> tuple[float, list[float]]:
    """Milliseconds of the topic's first message, and of the ``following`` after it."""
    await client.admin.create_topic(name, partitions=0)
    producer = client.producer(name, name="first", linger_ms=0.0, batch_max_messages=1)
    times: list[float] = []
    async with producer:
        for i in range(1 + following):
            started = time.perf_counter()
            await (await producer.send(b"m%d" % i))
            times.append((time.perf_counter() - started) * 1000)
    await client.admin.delete_topic(name)
    return times[0], times[1:]


async def main(topics: int, following: int, json_out: Path | None) -> None:
    with tempfile.TemporaryDirectory(prefix="danube-first-") as tmp:
        async with bench_mesh(Path(tmp), ["ingest", "discovery"]) as http:
            firsts: list[float] = []
            nexts: list[float] = []
            async with AsyncDanubeClient(str(http.base_url)) as client:
                for i in range(topics):
                    first, after = await _topic(client, f"/default/first-{i}", following)
                    firsts.append(first)
                    nexts.extend(after)
    first_ms = {"median": statistics.median(firsts), "max": max(firsts)}
    next_ms = {"median": statistics.median(nexts), "max": max(nexts)}
    print(
        f"first produce to a new topic: median {first_ms['median']:.1f} ms, "
        f"worst {first_ms['max']:.1f} ms ({topics} topics)\n"
        f"the {following} after it, each: median {next_ms['median']:.1f} ms, "
        f"worst {next_ms['max']:.1f} ms"
    )
    result = {"topics": topics, "first_ms": first_ms, "next_ms": next_ms}
    if json_out is not None:
        text = json.dumps({**result, "first": firsts, "next": nexts}, indent=2)
        await asyncio.to_thread(json_out.write_text, text)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--topics", type=int, default=10)
    parser.add_argument("--next", type=int, default=10, dest="following")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    asyncio.run(main(args.topics, args.following, args.json))

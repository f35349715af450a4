"""Where one message at a time spends its time on the direct path, part by part, on one mesh
(one ingest, one discovery), each part alternated over three rounds, medians:

- ``hop``: the SDK's HTTP/1.1 client to the ingest node's data door and back, no work (a
  ``GET`` the door answers 404 at once);
- ``door``: a framed 1 KiB record posted to the door by that client, nothing else (ingest's
  whole produce: admission, the WAL, fdatasync, the answer);
- ``sdk``: ``AsyncProducer.send`` of a 1 KiB message and its result (linger 0, one in flight:
  what ``danube bench produce --sync`` does), the SDK's own work on top of ``door``;

and, in this process with no mesh, the WAL's own share of ``door``:

- ``wal``: ``Wal.append`` of one 1 KiB record in ``fsync`` mode (its writer thread);
- ``thread``: the least a writer thread costs: ``queue.Queue`` to a thread that writes and
  fdatasyncs, ``call_soon_threadsafe`` back;
- ``fdatasync``: write + fdatasync inline, no thread.

Each line: p50 and p99 in ms and this process's CPU per message in µs.
Run: ``.venv/bin/python tests/bench/bench_direct_parts.py [--count 1500]``. Not collected by
pytest.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import queue
import statistics
import tempfile
import threading
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import uvloop

from danube.client import AsyncDanubeClient
from danube.frame import Record, encode_record
from danube.frame.produce import frame_for_produce
from danube.ingest.wal import Durability, Wal, WalOptions
from danube.wire.http1 import Http1Pool

from mesh import bench_mesh

ROUNDS = 3
PAYLOAD = os.urandom(1024)
RECORDS_TYPE = "application/vnd.danube.records"

Part = Callable[[], Awaitable[object]]


async def timed(part: Part, count: int) -> tuple[float, float, float]:
    """``count`` calls one at a time: p50 and p99 (ms), CPU per call (µs)."""
    latencies = []
    cpu = time.process_time()
    for _ in range(count):
        started = time.perf_counter()
        await part()
        latencies.append(time.perf_counter() - started)
    cpu = (time.process_time() - cpu) / count
    latencies.sort()
    return latencies[count // 2] * 1e3, latencies[int(count * 0.99)] * 1e3, cpu * 1e6


async def rounds(parts: dict[str, Part], count: int) -> dict[str, list[tuple[float, ...]]]:
    """Every part warmed, then ``ROUNDS`` rounds of all of them in turn."""
    for part in parts.values():
        for _ in range(50):
            await part()
    out: dict[str, list[tuple[float, ...]]] = {name: [] for name in parts}
    for _ in range(ROUNDS):
        for name, part in parts.items():
            out[name].append(await timed(part, count))
    return out


async def mesh_parts(count: int) -> dict[str, list[tuple[float, ...]]]:
    with tempfile.TemporaryDirectory() as tmp:
        async with bench_mesh(Path(tmp), ["ingest", "discovery"]) as http:
            url = str(http.base_url)
            (await http.put("/v1/topics/default/parts", json={})).raise_for_status()
            lookup = (await http.get("/v1/lookup/default/parts")).json()
            door = Http1Pool(lookup["partitions"][0]["url"], ssl_context=None, headers={})
            record = encode_record(
                Record(payload=PAYLOAD, publish_time_ms=int(time.time() * 1000), producer="parts")
            )
            body = frame_for_produce(record)
            client = AsyncDanubeClient(url)
            producer = client.producer("/default/parts", linger_ms=0, max_inflight_batches=1)

            async def hop() -> None:
                answer = await door.request("GET", "/", content_type="text/plain", body=b"")
                assert answer.status == 404, answer.status

            async def post() -> None:
                path = "/v1/topics/default/parts/messages"
                answer = await door.request("POST", path, content_type=RECORDS_TYPE, body=body)
                assert answer.status == 200, (answer.status, answer.body)

            async def sdk() -> None:
                await (await producer.send(PAYLOAD))

            try:
                return await rounds({"hop": hop, "door": post, "sdk": sdk}, count)
            finally:
                await producer.close()
                await client.close()
                await door.aclose()


async def local_parts(count: int) -> dict[str, list[tuple[float, ...]]]:
    loop = asyncio.get_running_loop()
    with tempfile.TemporaryDirectory() as tmp:
        options = WalOptions(
            durability=Durability.FSYNC,
            max_batch_bytes=8 << 20,
            sync_interval_ms=5,
            rotation_max_bytes=64 << 20,
            rotation_max_age_s=None,
            cache_capacity=1024,
        )
        wal = await Wal.open(Path(tmp) / "wal", options)
        record = PAYLOAD + b"r" * 76  # a record's size with its header
        fd = os.open(Path(tmp) / "plain", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        jobs: queue.Queue[asyncio.Future[None] | None] = queue.Queue()

        def writer() -> None:
            while (done := jobs.get()) is not None:
                os.write(fd, record)
                os.fdatasync(fd)
                loop.call_soon_threadsafe(done.set_result, None)

        thread = threading.Thread(target=writer, daemon=True)
        thread.start()

        async def append() -> None:
            await wal.append([record])

        async def handed_over() -> None:
            done: asyncio.Future[None] = loop.create_future()
            jobs.put(done)
            await done

        async def inline() -> None:
            os.write(fd, record)
            os.fdatasync(fd)

        try:
            parts: dict[str, Part] = {"wal": append, "thread": handed_over, "fdatasync": inline}
            return await rounds(parts, count)
        finally:
            jobs.put(None)
            thread.join()
            os.close(fd)
            await wal.close()


def report(results: dict[str, list[tuple[float, ...]]]) -> None:
    for name, runs in results.items():
        p50, p99, cpu = (statistics.median(run[i] for run in runs) for i in range(3))
        each = " / ".join(f"{run[0]:.3f}" for run in runs)
        print(f"{name:10} p50 {p50:.3f} ms ({each})  p99 {p99:.3f} ms  CPU {cpu:.0f} µs")


async def main(count: int) -> None:
    report(await mesh_parts(count))
    report(await local_parts(count))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--count", type=int, default=1500, help="calls per part and round")
    uvloop.run(main(parser.parse_args().count))

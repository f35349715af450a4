"""What payload compression gives and costs, on realistic 1 KiB JSON log lines.

Run: .venv/bin/python tests/bench/bench_compression.py [--messages 20000] [--rounds 3]

Part 1, no servers: the compression ratio of the same lines per message (what the mesh
stores: zstd level 3, lz4), per message with a trained zstd dictionary, and per batch (Kafka's
and Pulsar's way: 100 and 1000 lines in one frame), with the CPU per message to compress and
decompress; the numbers behind the per-record choice (docs/client.md, "Compression").

Part 2, one mesh of processes (nats, etcd, ingest, dispatcher, discovery; fsync; factor 1),
the same run: the SDK producing the lines to a topic per codec (none, zstd, lz4; batches of
1000, 4 in flight) and an SDK consumer reading them all back (stream mode, acks), in
alternating rounds so that each codec sees the same machine. Prints produce and consume
msg/s and MB/s of payload, the WAL bytes each topic takes and the stored ratio, then the
medians.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import tempfile
import time
from pathlib import Path

import lz4.block
import orjson
import zstandard

from danube.client import AsyncDanubeClient
from danube.frame.compression import CODEC_LZ4, CODEC_ZSTD, compress, decompress

from mesh import bench_mesh

CODECS: dict[str, str | None] = {"none": None, "zstd": "zstd", "lz4": "lz4"}
SERVICES = ["checkout", "payments-api", "inventory", "search", "auth", "gateway"]
_VOCABULARY = (
    "request handled user order cart item payment card token session cache miss hit retry "
    "timeout upstream downstream latency queue worker job scheduled completed failed "
    "warehouse shipment address validated declined approved refund coupon price tax"
)
WORDS = _VOCABULARY.split()  # the free text's 36 words


def log_lines(count: int, seed: int = 7) -> list[bytes]:
    """``count`` JSON log lines of about 1 KiB: a structured logger's output, with the
    random parts real lines have (trace and span ids, user ids, durations, free text)."""
    rng = random.Random(seed)
    lines = []
    for index in range(count):
        service = rng.choice(SERVICES)
        status = rng.choice([200] * 12 + [201, 204, 400, 404, 409, 500, 503])
        fields = {f"ctx_{rng.choice(WORDS)}_{k}": rng.randrange(10**6) for k in range(8)}
        line = {
            "ts": f"2026-11-29T05:{index // 6000 % 60:02d}:{index // 100 % 60:02d}."
            f"{rng.randrange(10**6):06d}Z",
            "level": "INFO" if status < 400 else ("WARN" if status < 500 else "ERROR"),
            "service": service,
            "host": f"ip-10-0-{rng.randrange(8)}-{rng.randrange(256)}",
            "pod": f"{service}-{rng.getrandbits(32):08x}-{rng.getrandbits(20):05x}",
            "trace_id": f"{rng.getrandbits(128):032x}",
            "span_id": f"{rng.getrandbits(64):016x}",
            "user_id": rng.randrange(10**8),
            "http": {
                "method": rng.choice(["GET", "GET", "POST", "PUT", "DELETE"]),
                "path": f"/v1/{rng.choice(WORDS)}s/{rng.randrange(10**7)}",
                "status": status,
                "duration_ms": round(rng.lognormvariate(2.5, 1.0), 3),
                "bytes": rng.randrange(100, 100_000),
                "user_agent": rng.choice(["okhttp/4.12.0", "Mozilla/5.0 (X11; Linux x86_64)"]),
            },
            "context": fields,
            "message": " ".join(rng.choice(WORDS) for _ in range(rng.randrange(45, 75))),
        }
        lines.append(orjson.dumps(line))
    return lines


def _timed_us(work: object, count: int) -> float:
    started = time.perf_counter()
    work()  # type: ignore[operator]
    return (time.perf_counter() - started) / count * 1e6


def offline(lines: list[bytes]) -> None:
    """Part 1: ratios and CPU per message, no servers."""
    plain = sum(map(len, lines))
    print(f"{len(lines)} lines, {plain / len(lines):.0f} bytes on average\n")
    print(f"{'way':44} {'ratio':>6} {'comp us/msg':>12} {'decomp us/msg':>14}")
    for name, codec in (
        ("per message zstd-3 (stored)", CODEC_ZSTD),
        ("per message lz4", CODEC_LZ4),
    ):
        packed: list[bytes] = []
        comp = _timed_us(
            lambda c=codec, out=packed: out.extend(compress(c, x) for x in lines), len(lines)
        )
        assert [decompress(codec, p, size_bytes_max=4096) for p in packed[:10]] == lines[:10]
        decomp = _timed_us(
            lambda c=codec, got=packed: [decompress(c, p, size_bytes_max=4096) for p in got],
            len(lines),
        )
        ratio = plain / sum(map(len, packed))
        print(f"{name:44} {ratio:6.2f} {comp:12.2f} {decomp:14.2f}")
    # A dictionary trained on the first 2000 lines, used on the rest (what a per-topic
    # dictionary would give; not implemented: docs/client.md says why).
    train, rest = lines[:2000], lines[2000:]
    dictionary = zstandard.train_dictionary(64 * 1024, list[bytes | bytearray | memoryview](train))
    compressor = zstandard.ZstdCompressor(level=3, dict_data=dictionary)
    packed = [compressor.compress(x) for x in rest]
    ratio = sum(map(len, rest)) / sum(map(len, packed))
    print(f"{'per message zstd-3 + 64 KiB trained dict':44} {ratio:6.2f}")
    for batch in (100, 1000):
        groups = [b"\n".join(lines[i : i + batch]) for i in range(0, len(lines), batch)]
        zstd_bytes = sum(len(zstandard.ZstdCompressor(level=3).compress(g)) for g in groups)
        lz4_bytes = sum(len(lz4.block.compress(g, store_size=True)) for g in groups)
        print(f"{f'batch of {batch} zstd-3 (Kafka/Pulsar way)':44} {plain / zstd_bytes:6.2f}")
        print(f"{f'batch of {batch} lz4':44} {plain / lz4_bytes:6.2f}")
    print()


def wal_bytes(wal_dir: Path, topic: str) -> int:
    return sum(p.stat().st_size for p in wal_dir.rglob("*") if p.is_file() and topic in str(p))


async def one_run(
    url: str, wal_dir: Path, lines: list[bytes], codec: str, round_index: int
) -> tuple[float, float, int]:
    """Produce ``lines`` to a fresh topic with ``codec``, then consume them all: produce
    msg/s, consume msg/s, WAL bytes."""
    topic = f"/default/bench-{codec}-{round_index}"
    async with AsyncDanubeClient(url) as client:
        async with client.producer(
            topic,
            compression=CODECS[codec],
            batch_max_messages=1000,
            max_inflight_batches=4,
            linger_ms=5,
        ) as producer:
            started = time.perf_counter()
            futures = [await producer.send(line) for line in lines]
            await producer.flush()
            await asyncio.gather(*futures)
            produce_s = time.perf_counter() - started
        async with client.consumer(topic, "bench", start="earliest") as consumer:
            started = time.perf_counter()
            got = 0
            async with asyncio.timeout(300):
                while got < len(lines):
                    message = await consumer.receive(30)
                    if got % 997 == 0:
                        assert message.payload == lines[message.offset], (codec, message.offset)
                    message.ack()
                    got += 1
            consume_s = time.perf_counter() - started
    return (
        len(lines) / produce_s,
        len(lines) / consume_s,
        wal_bytes(wal_dir, topic.rsplit("/", 1)[1]),
    )


async def on_mesh(tmp: Path, lines: list[bytes], rounds: int) -> None:
    """Part 2: produce and consume through the mesh, each codec in every round."""
    plain = sum(map(len, lines))
    mb = plain / 1e6
    results: dict[str, list[tuple[float, float, int]]] = {c: [] for c in CODECS}
    async with bench_mesh(tmp, ["ingest", "dispatcher", "discovery"]) as http:
        url = str(http.base_url).rstrip("/")
        await one_run(url, tmp / "wal", lines[:2000], "none", -1)  # warm-up, uncounted
        for index in range(rounds):
            order = list(CODECS) if index % 2 == 0 else list(reversed(CODECS))
            for codec in order:
                produced, consumed, stored = await one_run(url, tmp / "wal", lines, codec, index)
                results[codec].append((produced, consumed, stored))
                print(
                    f"round {index} {codec:5}: produce {produced:9,.0f} msg/s "
                    f"({produced * mb / len(lines):6.1f} MB/s), consume {consumed:9,.0f} msg/s "
                    f"({consumed * mb / len(lines):6.1f} MB/s), WAL {stored / 1e6:6.2f} MB",
                    flush=True,
                )
    print(f"\nmedians over {rounds} rounds, {len(lines)} messages of {plain / len(lines):.0f} B:")
    print(
        f"{'codec':6} {'produce msg/s':>14} {'consume msg/s':>14} {'WAL MB':>8} "
        f"{'stored ratio':>13}"
    )
    base = statistics.median(r[2] for r in results["none"])
    for codec, runs in results.items():
        produced = statistics.median(r[0] for r in runs)
        consumed = statistics.median(r[1] for r in runs)
        stored_bytes = statistics.median(r[2] for r in runs)
        print(
            f"{codec:6} {produced:14,.0f} {consumed:14,.0f} {stored_bytes / 1e6:8.2f} "
            f"{base / stored_bytes:13.2f}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--offline-only", action="store_true")
    args = parser.parse_args()
    lines = log_lines(max(args.messages, 4000))
    offline(lines)
    if not args.offline_only:
        with tempfile.TemporaryDirectory(prefix="bench-compression-") as tmp:
            asyncio.run(on_mesh(Path(tmp), lines[: args.messages], args.rounds))


if __name__ == "__main__":
    main()

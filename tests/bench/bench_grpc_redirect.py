"""Danube's official client (``danube-client``, tests/interop/danube_client_driver.py) sending
one message at a time to a factor-1 topic, redirected by discovery's TopicLookup to the
leader's gRPC door (``discovery.grpc_redirect: true``, the default) against the proxy path
(``false``: every message through discovery and the bus). Meshes of their own (ingest and
discovery), the two settings alternated ``--runs`` times each; prints the
medians of the runs' p50 and p99 (docs/grpc-api.md, "Measured")."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import tempfile
from pathlib import Path
from typing import Any

from danube.client import AsyncDanubeClient
from danube.up import free_port

from mesh import bench_mesh

ROOT = Path(__file__).resolve().parents[2]
CLIENT_PYTHON = ROOT / ".venv-danube-client" / "bin" / "python"
DRIVER = ROOT / "tests" / "interop" / "danube_client_driver.py"
TOPIC = "/default/latency"


async def _run(redirect: bool, count: int, size: int, warmup: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="danube-redirect-") as tmp:
        grpc_port = free_port()
        env = {
            "DANUBE_DISCOVERY__GRPC_PORT": str(grpc_port),
            "DANUBE_DISCOVERY__GRPC_REDIRECT": "true" if redirect else "false",
        }
        services = ["ingest", "discovery"]
        async with bench_mesh(Path(tmp), services, env) as http:
            async with AsyncDanubeClient(str(http.base_url)) as sdk:
                await sdk.admin.create_topic(TOPIC, partitions=0)
                warm = sdk.producer(TOPIC, linger_ms=0)
                await warm.send_and_wait(b"leader elected")
                await warm.close()
            process = await asyncio.create_subprocess_exec(
                str(CLIENT_PYTHON),
                str(DRIVER),
                "latency",
                f"http://127.0.0.1:{grpc_port}",
                TOPIC,
                str(count),
                str(size),
                str(warmup),
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                env={k: v for k, v in os.environ.items() if not k.startswith("PYTHON")},
            )
            out, err = await process.communicate()
            if process.returncode != 0:
                raise RuntimeError(f"the client failed:\n{err.decode()[-3000:]}")
    result: dict[str, Any] = json.loads(out.decode().splitlines()[-1])
    (door,) = result["doors"]
    assert door["proxy"] is not redirect, door  # it went where the setting says
    return result


async def main(runs: int, count: int, size: int, warmup: int, json_out: Path | None) -> None:
    samples: dict[str, list[dict[str, Any]]] = {"redirect": [], "proxy": []}
    for _ in range(runs):
        for path in ("redirect", "proxy"):
            samples[path].append(await _run(path == "redirect", count, size, warmup))
    print(f"official danube-client, one at a time, {size} B, {count} messages x {runs} runs")
    print("| path | p50 ms (median of runs) | p99 ms (median of runs) |")
    print("|---|---|---|")
    rows = {}
    for path, found in samples.items():
        p50 = statistics.median(s["p50_ms"] for s in found)
        p99 = statistics.median(s["p99_ms"] for s in found)
        rows[path] = {"p50_ms": p50, "p99_ms": p99}
        print(f"| {path} | {p50:.2f} | {p99:.2f} |")
    if json_out is not None:
        text = json.dumps({"rows": rows, "samples": samples}, indent=2)
        await asyncio.to_thread(json_out.write_text, text)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--count", type=int, default=2000)
    parser.add_argument("--size", type=int, default=1024)
    parser.add_argument("--warmup", type=int, default=100)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    asyncio.run(main(args.runs, args.count, args.size, args.warmup, args.json))

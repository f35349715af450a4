"""How many CRC32C computations the read path spends per delivered message: ingest, dispatcher
and discovery in this process (on a nats-server and etcd of their own), ``danube.frame``'s
crc32c wrapped by a counter, N messages produced, then consumed from the WAL's disk (the
in-memory cache is off) through the SDK with ack each. Run::

    .venv/bin/python tests/bench/bench_read_path_crc.py [-n 2000] [--transport json|binary]

It prints the calls that covered a payload (one per frame computed or checked) per consumed
message. Copies are counted by reading the code (docs/performance.md lists them hop by hop).
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import danube.frame.codec as codec
from danube.client import AsyncDanubeClient
from danube.config import (
    BusConfig,
    DanubeSettings,
    DiscoveryConfig,
    DispatcherConfig,
    IngestConfig,
    MetadataConfig,
    WalCloudConfig,
    WalConfig,
)
from danube.discovery import app as discovery_app
from danube.dispatcher import app as dispatcher_app
from danube.ingest import app as ingest_app
from danube.runtime.service import run_in_process
from danube.up import ServerProcess, etcd_spec, free_port, nats_spec

PAYLOAD_BYTES = 1024


class CrcCounter:
    """Wraps codec.crc32c: counts the calls over at least a payload's bytes."""

    def __init__(self, real: Callable[..., int]) -> None:
        self.real = real
        self.calls = 0

    def __call__(self, data: Any, value: int = 0) -> int:
        if len(data) >= PAYLOAD_BYTES:
            self.calls += 1
        return self.real(data, value)


def _settings(nats: str, etcd: str, wal: Path) -> DanubeSettings:
    return DanubeSettings(
        bus=BusConfig(servers=[nats]),
        wal_cloud=WalCloudConfig(
            wal=WalConfig(dir=wal, cache_capacity=0),
            metadata=MetadataConfig(etcd_endpoint=etcd, prefix="/crc"),
        ),
        ingest=IngestConfig(metrics_port=free_port()),
        dispatcher=DispatcherConfig(metrics_port=free_port()),
        discovery=DiscoveryConfig(port=free_port(), grpc_port=0),
    )


async def count(n: int, transport: str) -> dict[str, float]:
    """Produce ``n`` messages, consume them; CRC calls per consumed message."""
    with tempfile.TemporaryDirectory() as tmp_dir:
        tmp = Path(tmp_dir)
        nats = ServerProcess(nats_spec(port=free_port(), monitor_port=free_port()), tmp / "n.log")
        etcd = ServerProcess(
            etcd_spec(data_dir=tmp / "etcd", client_port=free_port(), peer_port=free_port()),
            tmp / "e.log",
        )
        with nats, etcd:
            settings = _settings(
                f"nats://127.0.0.1:{nats.spec.port}", f"127.0.0.1:{etcd.spec.port}", tmp / "wal"
            )
            url = f"http://127.0.0.1:{settings.discovery.port}"
            async with (
                run_in_process(ingest_app.serve, settings, "i1"),
                run_in_process(dispatcher_app.serve, settings, "d1"),
                run_in_process(discovery_app.serve, settings, "s1"),
            ):
                return await _run(url, n, transport)


async def _run(url: str, n: int, transport: str) -> dict[str, float]:
    async with AsyncDanubeClient(url) as client:
        for _ in range(600):  # discovery ready
            try:
                await client.admin.cluster()
                break
            except Exception:
                await asyncio.sleep(0.05)
        async with client.producer("/default/crc") as producer:
            futures = [await producer.send(b"x" * PAYLOAD_BYTES) for _ in range(n)]
            await asyncio.gather(*futures)
        counter = CrcCounter(getattr(codec, "crc32c"))  # noqa: B009 (not exported)
        setattr(codec, "crc32c", counter)  # noqa: B010
        got = 0
        kwargs: dict[str, Any] = {} if transport == "default" else {"transport": transport}
        async with client.consumer(
            "/default/crc", "s", start="earliest", mode="stream", **kwargs
        ) as consumer:
            while got < n:
                message = await consumer.receive(timeout_s=10)
                message.ack()
                got += 1
        setattr(codec, "crc32c", counter.real)  # noqa: B010
    return {"messages": got, "crc_calls_per_message": counter.calls / got}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("-n", type=int, default=2000)
    parser.add_argument("--transport", default="default")
    args = parser.parse_args()
    print(asyncio.run(count(args.n, args.transport)))


if __name__ == "__main__":
    main()

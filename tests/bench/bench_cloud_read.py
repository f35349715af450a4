"""Catch-up read rate from the cloud tier: one cloud_reader over fs and over the moto S3
server (real nats-server, etcd; ingest, uploader and cloud_reader in this process).

Run: .venv/bin/python tests/bench/bench_cloud_read.py [messages] [payload bytes]
Defaults: 200 000 messages of 100 B, objects of at most 4 MiB. The reader follows
next_offset from 0 with CloudClient.fetch (max 1 MiB / 10 000 messages per request, one
request at a time) until the cloud says NOT_IN_CLOUD, and checks each frame as the
dispatcher's decoder would (verify_frame); prints msgs/s and MB/s of frame bytes, and the
CRC32C computations per message (``danube.frame``'s crc32c wrapped by a counter during the
read: the cloud reader's check of the object, any framing again, the decoder's check).
"""

from __future__ import annotations

import asyncio
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import boto3

import danube.frame.codec as codec
from danube.bus import Bus, TopicName
from danube.cloud_reader import app as cloud_reader_app
from danube.config import (
    BusConfig,
    CloudConfig,
    DanubeSettings,
    MetadataConfig,
    UploaderConfig,
    WalCloudConfig,
    WalConfig,
)
from danube.config.wal_cloud import FsCloud
from danube.frame import Record, encode_record, verify_frame
from danube.ingest import app as ingest_app
from danube.meta import MetaStore
from danube.meta import keys as meta_keys
from danube.meta.records import TopicConfig, UploaderCheckpoint
from danube.runtime.service import run_in_process
from danube.up import ServerProcess, etcd_spec, free_port, moto_cloud, nats_spec, s3_spec
from danube.up.servers import MOTO_ACCESS_KEY, MOTO_REGION
from danube.uploader import app as uploader_app
from danube.wire.cloud.client import CloudClient
from danube.wire.ingest.client import IngestClient

TOPIC = TopicName("default", "catchup")


class CrcCounter:
    """Wraps codec.crc32c: counts the calls over at least ``min_bytes`` (a record's bytes,
    not the 12-byte header prefix every frame CRC starts with)."""

    def __init__(self, real: Callable[..., int], min_bytes: int) -> None:
        self.real = real
        self.min_bytes = min_bytes
        self.calls = 0

    def __call__(self, data: Any, value: int = 0) -> int:
        if len(data) >= self.min_bytes:
            self.calls += 1
        return self.real(data, value)


async def _run(tmp: Path, nats: str, etcd: str, cloud: CloudConfig, count: int, size: int) -> None:
    prefix = f"/bench-{time.time_ns()}"
    settings = DanubeSettings(
        bus=BusConfig(servers=[nats]),
        wal_cloud=WalCloudConfig(
            wal=WalConfig(dir=tmp / f"wal-{prefix[1:]}"),
            metadata=MetadataConfig(etcd_endpoint=etcd, prefix=prefix),
            uploader=UploaderConfig(interval_seconds=1, max_object_mb=4),
            cloud=cloud,
        ),
    )
    bus = await Bus.connect(settings.bus, name="bench")
    store = await MetaStore.connect(settings.wal_cloud.metadata)
    await store.put_model(meta_keys.topic_key(TOPIC), TopicConfig(created_ms=1))
    async with (
        run_in_process(ingest_app.serve, settings, "ingest-b"),
        run_in_process(uploader_app.serve, settings, "uploader-b"),
        run_in_process(cloud_reader_app.serve, settings, "cloud-b"),
    ):
        client = IngestClient(bus)
        for first in range(0, count, 1000):
            records = [
                encode_record(Record(payload=b"x" * size, publish_time_ms=1, producer="b"))
                for _ in range(min(1000, count - first))
            ]
            await client.produce(TOPIC, records, timeout_s=30)
        key = meta_keys.uploader_checkpoint_key(TOPIC)
        while True:
            checkpoint = await store.get_model(key, UploaderCheckpoint)
            if checkpoint is not None and checkpoint.uploaded_through >= count - 1:
                break
            await asyncio.sleep(0.2)
        cloud_client = CloudClient(bus)
        offset, messages, frame_bytes = 0, 0, 0
        counter = CrcCounter(getattr(codec, "crc32c"), size)  # noqa: B009 (not exported)
        setattr(codec, "crc32c", counter)  # noqa: B010
        started = time.perf_counter()
        try:
            while True:
                reply = await cloud_client.fetch(TOPIC, offset)
                if not reply.in_cloud:
                    break
                for frame in reply.frames:
                    verify_frame(frame.data)
                messages += len(reply.frames)
                frame_bytes += sum(f.size_bytes for f in reply.frames)
                offset = reply.next_offset
            elapsed = time.perf_counter() - started
        finally:
            setattr(codec, "crc32c", counter.real)  # noqa: B010
    await store.close()
    await bus.close()
    print(
        f"{cloud.backend:>3}: {messages} messages in {elapsed:.2f} s: "
        f"{messages / elapsed:,.0f} msg/s, {frame_bytes / elapsed / 1e6:,.1f} MB/s, "
        f"{counter.calls / max(messages, 1):.2f} CRC32C per message"
    )


async def main(tmp: Path, count: int, size: int) -> None:
    nats = ServerProcess(nats_spec(port=free_port(), monitor_port=free_port()), tmp / "nats.log")
    etcd = ServerProcess(
        etcd_spec(data_dir=tmp / "etcd", client_port=free_port(), peer_port=free_port()),
        tmp / "etcd.log",
    )
    s3 = ServerProcess(s3_spec(port=free_port()), tmp / "s3.log")
    with nats, etcd, s3:
        nats_url = f"nats://127.0.0.1:{nats.spec.port}"
        etcd_url = f"127.0.0.1:{etcd.spec.port}"
        endpoint = f"http://127.0.0.1:{s3.spec.port}"
        boto3.client(
            "s3",
            endpoint_url=endpoint,
            region_name=MOTO_REGION,
            aws_access_key_id=MOTO_ACCESS_KEY,
            aws_secret_access_key=MOTO_ACCESS_KEY,
        ).create_bucket(Bucket="bench")
        print(f"cloud catch-up read, {count} messages of {size} B, objects <= 4 MiB")
        fs = FsCloud(backend="fs", root=str(tmp / "objects"))
        await _run(tmp, nats_url, etcd_url, fs, count, size)
        await _run(tmp, nats_url, etcd_url, moto_cloud(endpoint, "bench"), count, size)


if __name__ == "__main__":
    count = int(sys.argv[1]) if len(sys.argv) > 1 else 200_000
    size = int(sys.argv[2]) if len(sys.argv) > 2 else 100
    with tempfile.TemporaryDirectory() as tmp:
        asyncio.run(main(Path(tmp), count, size))

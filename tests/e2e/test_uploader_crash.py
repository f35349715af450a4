"""The uploader under SIGKILL: rounds of kill -9 (3 in `make test`, 10 in `make bench`) while a
producer keeps writing and uploads keep happening. Afterwards the cloud tier holds every offset
exactly once, contiguous from the first to the uploaded-through offset, and objects, descriptors
and checkpoint agree."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable
from pathlib import Path

import pytest

from danube.bus import Bus, TopicName
from danube.config import BusConfig, MetadataConfig
from danube.config.wal_cloud import FsCloud
from danube.frame import Record, encode_record
from danube.meta import MetaStore
from danube.meta import keys as meta_keys
from danube.meta.records import TopicConfig, UploaderCheckpoint
from danube.storage import ObjectStore
from danube.up import ProcessSpec, ServerProcess
from danube.uploader.verify import verify_partition
from danube.wire.ingest.client import IngestClient

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

TOPIC = TopicName("default", "upcrash")


async def _producer(client: IngestClient, stop: asyncio.Event, durable: list[int]) -> None:
    number = 0
    while not stop.is_set():
        records = [
            encode_record(
                Record(payload=b"%d:" % (number + i) + b"y" * 200, publish_time_ms=1, producer="t")
            )
            for i in range(200)
        ]
        first = await client.produce(TOPIC, records, timeout_s=10)
        durable.append(first + len(records) - 1)
        number += len(records)
        await asyncio.sleep(0.01)


async def _checkpoint(store: MetaStore) -> UploaderCheckpoint | None:
    return await store.get_model(meta_keys.uploader_checkpoint_key(TOPIC), UploaderCheckpoint)


@pytest.mark.parametrize("rounds", [pytest.param(10, marks=pytest.mark.soak), 3])
async def test_uploader_sigkill_rounds_leave_every_offset_exactly_once(
    rounds: int,
    tmp_path: Path,
    nats_url: str,
    etcd_endpoint: str,
    meta_prefix: str,
    spec_for: Callable[..., ProcessSpec],
    services: Callable[..., ServerProcess],
) -> None:
    cloud = {
        "DANUBE_WAL_CLOUD__CLOUD__BACKEND": "fs",
        "DANUBE_WAL_CLOUD__CLOUD__ROOT": str(tmp_path / "objects"),
        "DANUBE_WAL_CLOUD__UPLOADER__INTERVAL_SECONDS": "1",
        "DANUBE_WAL_CLOUD__UPLOADER__MAX_OBJECT_MB": "1",
    }
    services("ingest", "ingest-0", **cloud)
    store = await MetaStore.connect(MetadataConfig(etcd_endpoint=etcd_endpoint, prefix=meta_prefix))
    bus = await Bus.connect(BusConfig(servers=[nats_url]), name="upcrash-test")
    stop = asyncio.Event()
    durable: list[int] = []
    uploaders: list[ServerProcess] = []
    try:
        await store.put_model(meta_keys.topic_key(TOPIC), TopicConfig(created_ms=1))
        producer = asyncio.create_task(_producer(IngestClient(bus), stop, durable))
        kills_mid_upload = 0
        for round_ in range(rounds + 1):
            # The same node on a fresh port each time: the killed one's may be taken by now.
            uploader_spec = spec_for("uploader", "uploader-0", **cloud)
            uploader = ServerProcess(uploader_spec, tmp_path / f"uploader-{round_}.log")
            uploaders.append(uploader)
            await asyncio.to_thread(uploader.start)
            if round_ == rounds:
                break  # the last one stays up and catches up
            before = await _checkpoint(store)
            async with asyncio.timeout(60):  # every incarnation makes progress
                while (now := await _checkpoint(store)) == before or now is None:
                    await asyncio.sleep(0.05)
                    assert not producer.done(), producer
            # Most rounds kill while an upload is recorded as pending (object being written).
            deadline = asyncio.get_running_loop().time() + random.uniform(0.2, 2.0)
            while asyncio.get_running_loop().time() < deadline:
                now = await _checkpoint(store)
                if now is not None and now.pending_end is not None:
                    kills_mid_upload += 1
                    break
            uploader.kill()  # SIGKILL
        stop.set()
        await producer
        last = durable[-1]
        async with asyncio.timeout(120):
            while True:
                checkpoint = await _checkpoint(store)
                if checkpoint is not None and checkpoint.uploaded_through >= last:
                    break
                await asyncio.sleep(0.2)
        report = await verify_partition(
            store,
            ObjectStore.from_config(FsCloud(backend="fs", root=str(tmp_path / "objects"))),
            TOPIC,
        )
    finally:
        stop.set()
        for process in uploaders:
            process.stop()
        await bus.close()
        await store.close()
    assert report.ok, report.problems
    assert report.offsets == list(range(last + 1))  # every offset once, in order, no gap
    assert report.uploaded_through == last
    print(f"{len(report.descriptors)} objects, {kills_mid_upload} kills with an upload pending")

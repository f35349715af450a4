"""Per-topic and per-subscription metrics of a running mesh (ingest, dispatcher, discovery,
uploader and retention in-process on real NATS and etcd, objects on the local file
system), read from a /metrics scrape: messages and bytes in, messages and bytes out, the
exact backlog (the messages left unacked), unacked, consumers, redeliveries, the upload
lag per partition and the cloud-tier size, each with the values this test produced."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from danube.config import (
    DanubeSettings,
    FsCloud,
    MetricsConfig,
    RetentionServiceConfig,
    UploaderConfig,
    UploaderServiceConfig,
)
from danube.discovery import app as discovery_app
from danube.dispatcher import app as dispatcher_app
from danube.ingest import app as ingest_app
from danube.meta import MetaStore, TopicName
from danube.meta import keys as meta_keys
from danube.retention import app as retention_app
from danube.runtime.service import run_in_process
from danube.storage import ObjectDescriptor
from danube.up import free_port
from danube.uploader import app as uploader_app
from tests.readiness import until_ready

pytestmark = pytest.mark.integration

TOPIC = "/default/metered"
SUB = "audit"
PARTITIONS = 2
MESSAGES = 40
POLLED = 30
ACKED = 25
NACKED = 2
WAIT_S = 30.0

Series = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def scrape(url: str) -> Series:
    """Every sample of a /metrics page, by name and sorted labels."""
    text = httpx.get(url, timeout=5).text
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def value(series: Series, name: str, **labels: str) -> float | None:
    return series.get((name, tuple(sorted(labels.items()))))


async def until(url: str, check: Callable[[Series], bool], what: str) -> Series:
    """The scrape once ``check`` holds (gauges are sampled, uploads are periodic)."""
    deadline = time.monotonic() + WAIT_S
    while True:
        series = await asyncio.to_thread(scrape, url)
        if check(series):
            return series
        if time.monotonic() > deadline:
            shown = {k: v for k, v in series.items() if TOPIC in repr(k)}
            raise AssertionError(f"{what}: not in {shown}")
        await asyncio.sleep(0.2)


@pytest.fixture
def settings(mesh_settings: Callable[..., DanubeSettings], tmp_path: Path) -> DanubeSettings:
    base = mesh_settings(ack_timeout_s=600.0)
    wal_cloud = base.wal_cloud.model_copy(
        update={
            "cloud": FsCloud(backend="fs", root=str(tmp_path / "objects")),
            "uploader": UploaderConfig(interval_seconds=1),
        }
    )
    return base.model_copy(
        update={
            "wal_cloud": wal_cloud,
            "uploader": UploaderServiceConfig(lease_ttl_s=3, metrics_port=free_port()),
            "retention": RetentionServiceConfig(
                lease_ttl_s=3, metrics_port=free_port(), check_interval_s=0.5
            ),
            # Room for every topic other tests of this process labelled before.
            "metrics": MetricsConfig(topics_max=100_000, sample_interval_s=0.2),
        }
    )


async def _cloud_bytes(settings: DanubeSettings) -> int:
    """The topic's object bytes, summed from the descriptors in etcd."""
    store = await MetaStore.connect(settings.wal_cloud.metadata)
    try:
        total = 0
        for partition in TopicName.parse(TOPIC).partitions(PARTITIONS):
            prefix = meta_keys.object_descriptors_prefix(partition)
            for kv in await store.range(prefix):
                total += ObjectDescriptor.from_bytes(kv.value).size_bytes
        return total
    finally:
        await store.close()


async def test_a_scrape_shows_the_topic_and_subscription_as_the_test_left_them(
    settings: DanubeSettings,
) -> None:
    base_url = f"http://127.0.0.1:{settings.discovery.port}"
    metrics_url = f"http://127.0.0.1:{settings.dispatcher.metrics_port}/metrics"
    async with (
        run_in_process(ingest_app.serve, settings, "ingest-1", must_stop_cleanly=True),
        run_in_process(dispatcher_app.serve, settings, "disp-1", must_stop_cleanly=True),
        run_in_process(uploader_app.serve, settings, "upl-1", must_stop_cleanly=True),
        run_in_process(retention_app.serve, settings, "ret-1", must_stop_cleanly=True),
        run_in_process(discovery_app.serve, settings, "disc-1", must_stop_cleanly=True) as task,
        httpx.AsyncClient(base_url=base_url, timeout=30) as http,
    ):
        await until_ready(http, task)
        path = TOPIC.strip("/")
        created = await http.put(f"/v1/topics/{path}", json={"partitions": PARTITIONS})
        assert created.status_code == 201, created.text
        attached = await http.post(
            f"/v1/topics/{path}/subscriptions/{SUB}/consumers",
            json={"name": "c", "type": "shared", "start": "earliest"},
        )
        assert attached.status_code == 201, attached.text
        cid = attached.json()["consumer_id"]
        payloads = [f"message-{i:04d}" for i in range(MESSAGES)]
        produced = await http.post(
            f"/v1/topics/{path}/messages",
            json={"messages": [{"payload": p, "key": f"k{i}"} for i, p in enumerate(payloads)]},
        )
        assert produced.status_code == 200, produced.text
        assert len({r["partition"] for r in produced.json()["results"]}) == PARTITIONS

        got: list[dict[str, Any]] = []
        async with asyncio.timeout(WAIT_S):
            while len(got) < POLLED:
                polled = await http.get(
                    f"/v1/consumers/{cid}/messages",
                    params={"max": POLLED - len(got), "wait_ms": 500},
                )
                got += polled.json()["messages"]
        refs = [{"partition": m["partition"], "offset": m["offset"]} for m in got]
        acked = await http.post(f"/v1/consumers/{cid}/ack", json={"messages": refs[:ACKED]})
        assert acked.status_code == 204, acked.text
        nacked = await http.post(
            f"/v1/consumers/{cid}/nack",
            json={"messages": refs[ACKED : ACKED + NACKED], "delay_ms": 0},
        )
        assert nacked.status_code == 204, nacked.text
        # The nacked two come again (redeliveries); poll exactly those.
        again: list[dict[str, Any]] = []
        async with asyncio.timeout(WAIT_S):
            while len(again) < NACKED:
                polled = await http.get(
                    f"/v1/consumers/{cid}/messages", params={"max": NACKED, "wait_ms": 500}
                )
                again += polled.json()["messages"]
        assert all(m["redelivery_count"] == 1 for m in again)

        sub = {"topic": TOPIC, "subscription": SUB}
        left_unacked = MESSAGES - ACKED
        series = await until(
            metrics_url,
            lambda s: (
                value(s, "danube_subscription_backlog_messages", **sub) == left_unacked
                and value(s, "danube_subscription_unacked_messages", **sub) == POLLED - ACKED
            ),
            "backlog and unacked",
        )
        # Backlog: exactly the messages not acked (also what the admin API says).
        listed = await http.get(f"/v1/topics/{path}/subscriptions")
        (row,) = [r for r in listed.json()["subscriptions"] if r["name"] == SUB]
        assert row["backlog"] == left_unacked
        assert value(series, "danube_subscription_consumers", **sub) == 1
        assert value(series, "danube_topic_messages_in_total", topic=TOPIC) == MESSAGES
        produced_here = value(series, "danube_discovery_topic_messages_produced_total", topic=TOPIC)
        assert produced_here == MESSAGES  # through this discovery instance
        bytes_in = value(series, "danube_topic_bytes_in_total", topic=TOPIC)
        assert bytes_in is not None
        assert bytes_in >= sum(map(len, payloads))
        delivered = POLLED + NACKED
        assert value(series, "danube_subscription_messages_out_total", **sub) == delivered
        bytes_out = value(series, "danube_subscription_bytes_out_total", **sub)
        assert bytes_out is not None
        assert bytes_out >= sum(len(m["payload"]) for m in got + again)
        assert value(series, "danube_subscription_redelivered_messages_total", **sub) == NACKED
        assert value(series, "danube_subscription_dead_lettered_messages_total", **sub) is None

        # Uploads: every partition's lag goes to 0; the cloud tier holds what etcd lists.
        partitions = [str(p) for p in TopicName.parse(TOPIC).partitions(PARTITIONS)]

        def uploaded(s: Series) -> bool:
            lags = [
                value(s, "danube_partition_upload_lag_messages", topic=TOPIC, partition=p)
                for p in partitions
            ]
            return lags == [0.0] * PARTITIONS and bool(
                value(s, "danube_topic_cloud_bytes", topic=TOPIC)
            )

        series = await until(metrics_url, uploaded, "upload lag 0 and the cloud tier")
        cloud_bytes = await _cloud_bytes(settings)
        series = await until(
            metrics_url,
            lambda s: value(s, "danube_topic_cloud_bytes", topic=TOPIC) == cloud_bytes,
            f"cloud bytes {cloud_bytes}",
        )
        objects = value(series, "danube_topic_cloud_objects", topic=TOPIC)
        assert objects is not None
        assert objects >= PARTITIONS

        # Detached: the consumer count drops; the backlog stays (nothing more was acked).
        assert (await http.delete(f"/v1/consumers/{cid}")).status_code == 204
        series = await until(
            metrics_url,
            lambda s: value(s, "danube_subscription_consumers", **sub) == 0,
            "no consumer",
        )
        assert value(series, "danube_subscription_backlog_messages", **sub) == left_unacked

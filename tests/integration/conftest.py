"""A discovery instance with one ingest and one dispatcher, in-process on the session's
nats-server and etcd: the consume API tests (long-poll and WebSocket) share it."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

from danube.config import (
    BusConfig,
    DanubeSettings,
    DiscoveryConfig,
    DispatcherConfig,
    IngestConfig,
    MetadataConfig,
    MetricsConfig,
    WalCloudConfig,
    WalConfig,
)
from danube.discovery import app as discovery_app
from danube.dispatcher import app as dispatcher_app
from danube.ingest import app as ingest_app
from danube.runtime.service import run_in_process
from danube.up import free_port
from tests.readiness import until_ready


def _consume_settings(
    nats_url: str,
    etcd: str,
    prefix: str,
    wal_dir: Path,
    *,
    consumer_session_timeout_s: float = 60.0,
    produce_timeout_s: float = 10.0,
    ack_timeout_s: float = 30.0,
    max_unacked_per_consumer: int = 1000,
) -> DanubeSettings:
    return DanubeSettings(
        bus=BusConfig(servers=[nats_url]),
        wal_cloud=WalCloudConfig(
            wal=WalConfig(dir=wal_dir),
            metadata=MetadataConfig(etcd_endpoint=etcd, prefix=prefix),
        ),
        ingest=IngestConfig(lease_ttl_s=3, metrics_port=free_port()),
        dispatcher=DispatcherConfig(
            lease_ttl_s=3,
            metrics_port=free_port(),
            redelivery_base_s=0.1,
            redelivery_max_s=0.2,
            cursor_flush_interval_s=0.1,
            consumer_session_timeout_s=consumer_session_timeout_s,
            ack_timeout_s=ack_timeout_s,
            max_unacked_per_consumer=max_unacked_per_consumer,
        ),
        discovery=DiscoveryConfig(
            port=free_port(),
            grpc_port=0,  # a free port (the server tells which)
            lease_ttl_s=3,
            topic_cache_ttl_s=0.0,
            produce_timeout_s=produce_timeout_s,
        ),
        # Room under the per-topic and per-subscription label caps for every name the tests
        # of this process labelled before (a test reading such a series finds it).
        metrics=MetricsConfig(topics_max=100_000, subscriptions_max=100_000),
    )


MeshSettings = Callable[..., DanubeSettings]


@pytest.fixture
def mesh_settings(
    nats_url: str, etcd_endpoint: str, meta_prefix: str, tmp_path: Path
) -> MeshSettings:
    """``mesh_settings(**kw)``: the settings :func:`consume_mesh` runs with, for tests that
    start and stop the services themselves. Keywords: ``consumer_session_timeout_s``,
    ``ack_timeout_s``, ``max_unacked_per_consumer`` (the dispatcher's), ``produce_timeout_s``
    (discovery's)."""

    def settings(**kw: Any) -> DanubeSettings:
        return _consume_settings(nats_url, etcd_endpoint, meta_prefix, tmp_path / "wal", **kw)

    return settings


ConsumeMesh = Callable[..., AbstractAsyncContextManager[httpx.AsyncClient]]


@pytest.fixture
def consume_mesh(mesh_settings: MeshSettings) -> ConsumeMesh:
    """Starts a discovery instance with one ingest and one dispatcher; yields an HTTP client
    on it (its ``base_url`` with ``ws://`` reaches the consumer streams). Keywords: those of
    :func:`mesh_settings` (``consumer_session_timeout_s`` is 60 s by default)."""

    @asynccontextmanager
    async def start(**kw: Any) -> AsyncIterator[httpx.AsyncClient]:
        settings = mesh_settings(**kw)
        base_url = f"http://127.0.0.1:{settings.discovery.port}"
        async with (
            run_in_process(ingest_app.serve, settings, "ingest-1", must_stop_cleanly=True),
            run_in_process(dispatcher_app.serve, settings, "disp-1", must_stop_cleanly=True),
            run_in_process(discovery_app.serve, settings, "disc-1", must_stop_cleanly=True) as task,
            httpx.AsyncClient(base_url=base_url, timeout=30) as client,
        ):
            await until_ready(client, task)
            yield client

    return start


@pytest.fixture
async def consume_http(consume_mesh: ConsumeMesh) -> AsyncIterator[httpx.AsyncClient]:
    """:func:`consume_mesh` with its defaults."""
    async with consume_mesh() as client:
        yield client

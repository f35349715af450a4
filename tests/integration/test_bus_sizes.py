"""The largest message a cluster accepts must travel in one bus message: a service that
connects to a bus too small for it refuses to start, naming the setting and both sizes."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from danube.config import (
    BusConfig,
    DanubeSettings,
    IngestConfig,
    MetadataConfig,
    WalCloudConfig,
    WalConfig,
)
from danube.config.errors import ConfigError
from danube.runtime.service import node_session
from danube.up import free_port
from danube.wire.sizes import largest_message_bytes

pytestmark = pytest.mark.integration

MiB = 1024 * 1024


def _settings(nats_url: str, etcd: str, prefix: str, tmp: Path, size: int) -> DanubeSettings:
    return DanubeSettings(
        bus=BusConfig(servers=[nats_url]),
        wal_cloud=WalCloudConfig(
            wal=WalConfig(dir=tmp / "wal"),
            metadata=MetadataConfig(etcd_endpoint=etcd, prefix=prefix),
        ),
        ingest=IngestConfig(metrics_port=free_port(), max_message_bytes=size),
    )


async def test_a_bus_too_small_for_the_largest_message_refuses_to_start(
    nats_url: str, etcd_endpoint: str, meta_prefix: str, tmp_path: Path
) -> None:
    settings = _settings(nats_url, etcd_endpoint, meta_prefix, tmp_path, 2 * MiB)
    with pytest.raises(ConfigError) as info:
        async with node_session(settings, "ingest", "ingest-big", settings.ingest, asyncio.Event()):
            pytest.fail("a session started on a bus that cannot carry its largest message")
    assert info.value.code == "bad_config"
    text = str(info.value)
    assert "ingest.max_message_bytes of 2097152 does not fit the bus" in text
    assert f"takes {largest_message_bytes(2 * MiB)} bytes" in text
    assert "max_payload of 1048576" in text  # nats-server's default


async def test_the_default_largest_message_fits_and_the_session_starts(
    nats_url: str, etcd_endpoint: str, meta_prefix: str, tmp_path: Path
) -> None:
    settings = _settings(nats_url, etcd_endpoint, meta_prefix, tmp_path, 512 * 1024)
    stop = asyncio.Event()
    async with node_session(settings, "ingest", "ingest-fits", settings.ingest, stop) as session:
        assert session.bus.max_payload_bytes >= largest_message_bytes(512 * 1024)
        stop.set()  # a session that ends without stop set has lost its lease

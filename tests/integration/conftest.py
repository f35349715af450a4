"""A discovery instance with one ingest and one dispatcher, in-process on the session's
nats-server and etcd: the consume API tests (long-poll and WebSocket) share it, one per module
(``consume_http``), or start one of their own (``consume_mesh``)."""

from __future__ import annotations

import asyncio
import threading
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

from danube.bus import Bus
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
from danube.up import ServerProcess, free_port, nats_spec
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


@asynccontextmanager
async def _serving(settings: DanubeSettings) -> AsyncIterator[httpx.AsyncClient]:
    """The three services on ``settings``, ready; an HTTP client on discovery."""
    base_url = f"http://127.0.0.1:{settings.discovery.port}"
    async with (
        run_in_process(ingest_app.serve, settings, "ingest-1", must_stop_cleanly=True),
        run_in_process(dispatcher_app.serve, settings, "disp-1", must_stop_cleanly=True),
        run_in_process(discovery_app.serve, settings, "disc-1", must_stop_cleanly=True) as task,
        httpx.AsyncClient(base_url=base_url, timeout=30) as client,
    ):
        await until_ready(client, task)
        yield client


@pytest.fixture
def consume_mesh(mesh_settings: MeshSettings) -> ConsumeMesh:
    """Starts a discovery instance with one ingest and one dispatcher; yields an HTTP client
    on it (its ``base_url`` with ``ws://`` reaches the consumer streams). Keywords: those of
    :func:`mesh_settings` (``consumer_session_timeout_s`` is 60 s by default)."""

    @asynccontextmanager
    async def start(**kw: Any) -> AsyncIterator[httpx.AsyncClient]:
        async with _serving(mesh_settings(**kw)) as client:
            yield client

    return start


MESH_STOP_TIMEOUT_S = 30.0


class _MeshThread:
    """:func:`_serving` on an event loop of its own, in a thread: it outlives the loop of
    each test (pytest-asyncio gives every test a new one), and tests reach it over HTTP and
    WebSocket only. Started, it is ready or has raised; stopped, it re-raises what a service
    failed with."""

    def __init__(self, settings: DanubeSettings) -> None:
        self.url = f"http://127.0.0.1:{settings.discovery.port}"
        self.nats_url = settings.bus.servers[0]
        self._settings = settings
        self._ready = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="consume-mesh", daemon=True)

    def start(self) -> None:
        self._thread.start()
        self._ready.wait()
        self.check()

    def check(self) -> None:
        """Raise what stopped the mesh, if it stopped."""
        if self._error is not None:
            raise self._error
        assert self._thread.is_alive(), "the shared consume mesh stopped"

    def stop(self) -> None:
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(MESH_STOP_TIMEOUT_S)
        assert not self._thread.is_alive(), f"not stopped in {MESH_STOP_TIMEOUT_S} s"
        if self._error is not None:
            raise self._error

    def _run(self) -> None:
        try:
            asyncio.run(self._serve())
        except BaseException as exc:  # handed to the test thread (check, stop)
            self._error = exc
        finally:
            self._ready.set()

    async def _serve(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        async with _serving(self._settings):
            self._ready.set()
            await self._stop.wait()


@pytest.fixture(scope="module")
def shared_consume_mesh(
    etcd_endpoint: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[_MeshThread]:
    """One :func:`consume_mesh` (its defaults) for the tests of a module: starting and
    stopping one per test cost about 1.5 s each. On a nats-server and an etcd prefix of its
    own, so that a mesh a test starts meanwhile on the session's server (``consume_mesh``)
    never hears it. Tests that share it keep to topics (and subscriptions, schema subjects)
    of their own names; a test that needs a mesh to itself (other settings, etcd keys read
    under its prefix, services stopped) starts one with ``consume_mesh``."""
    tmp = tmp_path_factory.mktemp("consume-mesh")
    nats = ServerProcess(nats_spec(port=free_port(), monitor_port=free_port()), tmp / "nats.log")
    with nats:
        nats_url = f"nats://127.0.0.1:{nats.spec.port}"
        prefix = f"/t-{uuid.uuid4().hex[:12]}"
        mesh = _MeshThread(_consume_settings(nats_url, etcd_endpoint, prefix, tmp / "wal"))
        mesh.start()
        try:
            yield mesh
        finally:
            mesh.stop()


@pytest.fixture
async def consume_http(shared_consume_mesh: _MeshThread) -> AsyncIterator[httpx.AsyncClient]:
    """An HTTP client on the module's shared mesh (:func:`shared_consume_mesh`)."""
    shared_consume_mesh.check()
    async with httpx.AsyncClient(base_url=shared_consume_mesh.url, timeout=30) as client:
        yield client
    shared_consume_mesh.check()


@pytest.fixture
async def consume_bus(shared_consume_mesh: _MeshThread) -> AsyncIterator[Bus]:
    """A bus connection to the shared mesh's nats-server (its ingest's WAL, say)."""
    bus = await Bus.connect(BusConfig(servers=[shared_consume_mesh.nats_url]), name="test")
    try:
        yield bus
    finally:
        await bus.close()

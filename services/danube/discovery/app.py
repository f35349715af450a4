"""Wires one discovery instance: bus, etcd, node lease and registration, the HTTP API
(uvicorn inside this event loop) and the controller, in one TaskGroup."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import Generator
from dataclasses import dataclass

import uvicorn

from danube.admission import AdmissionParts
from danube.admission import build as build_admission
from danube.admission.refresh import Refresher
from danube.aio import cancel_all_and_wait, wait_any
from danube.bus import Bus
from danube.config import DanubeSettings
from danube.discovery import metrics
from danube.discovery.catalog.catalog import Catalog
from danube.discovery.catalog.topic_lists import TopicLists
from danube.discovery.controller.controller import Controller
from danube.discovery.doors.grpc.server import GrpcServer
from danube.discovery.doors.http import Services, build_app
from danube.discovery.produce.producer import Limits, Producer
from danube.discovery.produce.sessions import DiscoverySessions
from danube.discovery.schemas.registry import SchemaRegistry
from danube.errors import DanubeError
from danube.meta import MetaStore
from danube.runtime.healthcheck import probe_url, write_health_file
from danube.runtime.held import Slots
from danube.runtime.http import bound_port, wait_started
from danube.runtime.listener import uvicorn_limits, uvicorn_tls
from danube.runtime.liveness import subscription_owner_gone
from danube.runtime.service import HEALTH_START_TIMEOUT_S, NodeSession, node_session
from danube.storage import ObjectStore
from danube.wire.consume.stream_protocol import FRAME_BYTES_MAX
from danube.wire.dispatcher.client import DispatcherClient

log = logging.getLogger(__name__)

# A stream's client must answer a ping within this long of the last one, else it is closed
# (a client that vanished without a close frame).
STREAM_PING_INTERVAL_S = 20.0


class HttpStopped(DanubeError):
    """The HTTP server could not start (port taken) or stopped without being asked."""

    code = "http_stopped"


class _Server(uvicorn.Server):
    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        # The service owns SIGTERM/SIGINT (danube.runtime.service) and stops us itself.
        yield


@dataclass(frozen=True)
class Built:
    """What one instance serves with (the core every door reads), and what it runs beside
    them: the controller, admission's views, the refresher of cached entries."""

    services: Services
    controller: Controller
    admission: AdmissionParts
    refresher: Refresher


async def build_services(
    settings: DanubeSettings, node_id: str, bus: Bus, store: MetaStore
) -> Built:
    """The core of one instance over its bus and etcd: catalog, registry, producer
    sessions, the produce path, admission (its views loaded: exclusive holders, roles and
    bindings are known before the first request is decided)."""
    config = settings.discovery
    # Entries of topics in use are read again in the background, before they expire:
    # a produce never waits on etcd for them (danube.admission.refresh).
    refresher = Refresher()
    catalog = Catalog(store, cache_ttl_s=config.topic_cache_ttl_s, refresher=refresher)
    await catalog.ensure_default_namespace()
    schemas = SchemaRegistry(store, default_mode=config.schema_compatibility)
    producers = DiscoverySessions(
        store, catalog, ttl_s=config.producer_session_ttl_s, auto_create=config.auto_create_topics
    )
    # Every door's admission (danube.admission), over this instance's own catalog,
    # registry and producer sessions, so that what it writes is decided on at once;
    # bindings and versions cached as topic configs are: etcd off the produce path.
    parts = build_admission(
        settings,
        store,
        refresher=refresher,
        cache_ttl_s=config.topic_cache_ttl_s,
        counters=metrics.ADMISSION,
        policies=catalog,
        schemas=schemas,
        holders=producers.holders,
    )
    await parts.load()
    controller = Controller(settings, node_id=node_id, store=store)
    services = Services(
        node_id=node_id,
        bus=bus,
        store=store,
        catalog=catalog,
        producer=Producer(
            bus, catalog, Limits.from_settings(settings), max_inflight=config.max_inflight_produce
        ),
        controller=controller,
        # One deadline for the data path: a consume call gets what a produce gets,
        # claims and retries included (a poll: its own wait plus a 2 s margin).
        # A request to a dispatcher killed under it gives up at once (danube.runtime.liveness).
        dispatcher=DispatcherClient(
            bus,
            timeout_s=config.produce_timeout_s,
            owner_gone=functools.partial(subscription_owner_gone, store),
        ),
        producers=producers,
        schemas=schemas,
        admission=parts.admission,
        objects=ObjectStore.from_config(settings.wal_cloud.cloud),
        objects_root=settings.wal_cloud.uploader.root_prefix,
        streams=Slots(config.max_streams),
        # Three chances to be heard before the dispatcher expires an idle consumer.
        stream_keepalive_s=settings.dispatcher.consumer_session_timeout_s / 3,
        stream_topics_max=config.stream_topics_max,
        stream_topics_refresh_s=config.stream_topics_refresh_s,
        # Half the refresh: a topic created is seen within 1.5 refreshes at worst.
        topic_lists=TopicLists(catalog.list_topics, config.stream_topics_refresh_s / 2),
        security=parts.security,
    )
    return Built(services, controller, parts, refresher)


def http_server(settings: DanubeSettings, services: Services) -> uvicorn.Server:
    """The HTTP door (the API, the console, the consumer streams) on its listener."""
    config = settings.discovery
    app = build_app(
        services, max_body_bytes=config.max_body_bytes, allowed_hosts=config.hosts_allowed()
    )
    return _Server(
        uvicorn.Config(
            app,
            host=config.host,
            port=config.port,
            log_level="warning",
            access_log=False,
            lifespan="off",
            # Nothing reads a proxy's X-Forwarded-*: one ASGI layer less per request.
            proxy_headers=False,
            # Consumer streams: client frames past the limit close with 1009. (The
            # protocol, uvicorn's "websockets-sansio" with the TLS principal in its
            # scopes and its connections counted per client, is uvicorn_limits' ``ws``:
            # a missing WebSocket package fails the start, not the first upgrade.)
            ws_max_size=FRAME_BYTES_MAX,
            ws_ping_interval=STREAM_PING_INTERVAL_S,
            ws_ping_timeout=STREAM_PING_INTERVAL_S,
            # Slow request heads, idle and surplus connections (all, and per client
            # address): docs/configuration.md.
            **uvicorn_limits(config, listener="http"),
            # HTTPS (and the WebSocket streams as wss) when discovery.tls sets a cert.
            **uvicorn_tls(config.tls),
        )
    )


async def serve(settings: DanubeSettings, node_id: str, stop: asyncio.Event) -> None:
    """Serve the API and run the controller until ``stop`` (through etcd outages: the node
    session renews a lost lease)."""
    config = settings.discovery
    # The API answers /readyz itself; the node lease guards only the registration (the
    # controller campaigns with a lease of its own), so losing it — an etcd stall longer
    # than its TTL — does not stop the instance: the API goes on answering (503 where it
    # needs etcd) and the registration comes back under a new lease once etcd answers.
    async with node_session(
        settings, "discovery", node_id, config, stop, health_server=False, renew_lease=True
    ) as session:
        built = await build_services(settings, node_id, session.bus, session.store)
        try:
            await _run(settings, built, session, stop)
        finally:
            await built.refresher.close()
    # Leaving the session closed the store, which revoked the lease: our registration went.
    if not stop.is_set():
        raise HttpStopped(f"discovery {node_id}: the HTTP server stopped on its own")


async def _run(
    settings: DanubeSettings, built: Built, session: NodeSession, stop: asyncio.Event
) -> None:
    """Run the doors, the controller and admission's views until ``stop`` or until the
    HTTP server ends on its own."""
    config, services = settings.discovery, built.services
    server = http_server(settings, services)
    grpc_server = None
    if config.grpc_enabled:  # Danube's client API (docs/grpc-api.md)
        grpc_server = GrpcServer(
            services, services.producers, config, max_message_bytes=config.max_body_bytes
        )
        await grpc_server.start()
        session.grpc_url = grpc_server.url  # ingest doors send clients of a new topic here
    await session.register(f"{config.host}:{config.port}")
    leaving = asyncio.Event()  # tells the controller to resign, however we leave
    grpc_reaper: asyncio.Task[None] | None = None
    async with asyncio.TaskGroup() as tg:
        http = tg.create_task(_serve_http(server), name="http")
        if grpc_server is not None:
            grpc_reaper = tg.create_task(grpc_server.run(), name="grpc-clients")
        tg.create_task(
            _announce_health(server, http, services.node_id, config.host, tls=config.tls.enabled),
            name="health",
        )
        tg.create_task(built.controller.run(leaving), name="controller")
        # Roles, bindings, keys and exclusive holders kept current while serving.
        admission_views = tg.create_task(built.admission.follow(), name="admission-views")
        log.info(
            "discovery %s serving on %s://%s:%d",
            services.node_id,
            "https" if config.tls.enabled else "http",
            config.host,
            config.port,
        )
        http_ended = asyncio.Event()
        http.add_done_callback(lambda _: http_ended.set())
        await wait_any(stop, http_ended)
        leaving.set()
        await cancel_all_and_wait([admission_views, grpc_reaper])
        if grpc_server is not None:
            await grpc_server.stop()
        server.should_exit = True


async def _announce_health(
    server: uvicorn.Server,
    http: asyncio.Task[None],
    node_id: str,
    host: str,
    *,
    tls: bool = False,
) -> None:
    """Once the API listens, write the health file (if one is named) with its /readyz URL."""
    try:
        await wait_started(server, http, HEALTH_START_TIMEOUT_S)
    except RuntimeError as exc:
        # A server that never listened ends the service through the http task (HttpStopped).
        log.warning("no health file written: %s", exc)
        return
    await asyncio.to_thread(
        write_health_file, node_id, probe_url(host, bound_port(server), tls=tls)
    )


async def _serve_http(server: uvicorn.Server) -> None:
    try:
        await server.serve()
    except SystemExit as exc:  # uvicorn exits the process when it cannot bind
        raise HttpStopped(f"HTTP server failed to start (exit {exc.code})") from None

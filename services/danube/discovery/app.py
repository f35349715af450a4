"""Wires one discovery instance: bus, etcd, node lease and registration, the HTTP API
(uvicorn inside this event loop) and the controller, in one TaskGroup."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Generator
from typing import Any

import uvicorn

from danube.admission import build as build_admission
from danube.admission.refresh import Refresher
from danube.config import DanubeSettings
from danube.discovery import metrics
from danube.discovery.api import Services, build_app
from danube.discovery.catalog import Catalog
from danube.discovery.controller import Controller
from danube.discovery.grpc_api.server import GrpcServer
from danube.discovery.produce import Limits, Producer
from danube.discovery.producers import DiscoverySessions
from danube.discovery.schemas import SchemaRegistry
from danube.discovery.stream_protocol import FRAME_BYTES_MAX, StreamSlots
from danube.discovery.topic_lists import TopicLists
from danube.errors import DanubeError
from danube.runtime.healthcheck import probe_url, write_health_file
from danube.runtime.http import bound_port, wait_started
from danube.runtime.listener import uvicorn_limits, uvicorn_tls
from danube.runtime.service import HEALTH_START_TIMEOUT_S, node_session
from danube.storage import ObjectStore
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
        bus, store = session.bus, session.store
        # Entries of topics in use are read again in the background, before they expire:
        # a produce never waits on etcd for them (danube.admission.refresh).
        refresher = Refresher()
        catalog = Catalog(store, cache_ttl_s=config.topic_cache_ttl_s, refresher=refresher)
        await catalog.ensure_default_namespace()
        controller = Controller(settings, node_id=node_id, store=store)
        schemas = SchemaRegistry(store, default_mode=config.schema_compatibility)
        producer = Producer(
            bus, catalog, Limits.from_settings(settings), max_inflight=config.max_inflight_produce
        )
        producers = DiscoverySessions(
            store,
            catalog,
            ttl_s=config.producer_session_ttl_s,
            auto_create=config.auto_create_topics,
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
        # Exclusive holders, roles and bindings are known before the first request is
        # decided (docs/producers.md, docs/security.md).
        await parts.load()
        services = Services(
            node_id=node_id,
            bus=bus,
            store=store,
            catalog=catalog,
            producer=producer,
            controller=controller,
            # One deadline for the data path: a consume call gets what a produce gets,
            # claims and retries included (a poll: its own wait plus a 2 s margin).
            dispatcher=DispatcherClient(bus, timeout_s=config.produce_timeout_s),
            producers=producers,
            schemas=schemas,
            admission=parts.admission,
            objects=ObjectStore.from_config(settings.wal_cloud.cloud),
            objects_root=settings.wal_cloud.uploader.root_prefix,
            streams=StreamSlots(config.max_streams),
            # Three chances to be heard before the dispatcher expires an idle consumer.
            stream_keepalive_s=settings.dispatcher.consumer_session_timeout_s / 3,
            stream_topics_max=config.stream_topics_max,
            stream_topics_refresh_s=config.stream_topics_refresh_s,
            # Half the refresh: a topic created is seen within 1.5 refreshes at worst.
            topic_lists=TopicLists(catalog.list_topics, config.stream_topics_refresh_s / 2),
            security=parts.security,
        )
        app = build_app(
            services,
            max_body_bytes=config.max_body_bytes,
            allowed_hosts=config.hosts_allowed(),
        )
        server = _Server(
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
        grpc_server = None
        if config.grpc_enabled:  # Danube's client API (docs/grpc-api.md)
            grpc_server = GrpcServer(
                services, producers, config, max_message_bytes=config.max_body_bytes
            )
            await grpc_server.start()
        address = f"{config.host}:{config.port}"
        if grpc_server is not None:  # ingest doors send clients of a new topic here
            session.grpc_url = grpc_server.url
        await session.register(address)
        leaving = asyncio.Event()  # tells the controller to resign, however we leave
        async with asyncio.TaskGroup() as tg:
            http = tg.create_task(_serve_http(server), name="http")
            if grpc_server is not None:
                grpc_reaper = tg.create_task(grpc_server.run(), name="grpc-clients")
            tg.create_task(
                _announce_health(server, http, node_id, config.host, tls=config.tls.enabled),
                name="health",
            )
            tg.create_task(controller.run(leaving), name="controller")
            # Roles, bindings, keys and exclusive holders kept current while serving.
            admission_views = tg.create_task(parts.follow(), name="admission-views")
            log.info(
                "discovery %s serving on %s://%s:%d",
                node_id,
                "https" if config.tls.enabled else "http",
                config.host,
                config.port,
            )
            waits: list[asyncio.Future[Any]] = [asyncio.ensure_future(stop.wait())]
            waits.append(asyncio.shield(http))
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
            for wait in waits:
                wait.cancel()
            leaving.set()
            admission_views.cancel()
            if grpc_server is not None:
                grpc_reaper.cancel()
                await grpc_server.stop()
            server.should_exit = True
        await refresher.close()
    # Leaving the session closed the store, which revoked the lease: our registration went.
    if not stop.is_set():
        raise HttpStopped(f"discovery {node_id}: the HTTP server stopped on its own")


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

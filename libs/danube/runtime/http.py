"""The health and metrics endpoint every internal service serves.

``GET /healthz`` answers 200 while the process runs; ``GET /readyz`` answers 200
``{"ready": true}`` only while the service's readiness check passes (its bus and etcd
connections are up, and whatever the service adds: an ingest node's WAL disk above its
reserve), else 503 ``{"ready": false, "reasons": [{"code": ..., "message": ..., ...}]}``;
``GET /metrics`` is the Prometheus text exposition. The supervisor and container
healthchecks probe these. Over HTTPS when the service's ``tls`` section sets a
certificate (danube.security.tls). Served by uvicorn inside the service's own event loop; the
service, not uvicorn, owns the process's signals.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import time
from collections.abc import Callable, Generator, Mapping, Sequence
from dataclasses import dataclass, field

import uvicorn
from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, CollectorRegistry, generate_latest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp

from danube.config.model import ServiceConfig
from danube.runtime.healthcheck import probe_url
from danube.runtime.listener import uvicorn_limits, uvicorn_tls

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class NotReady:
    """One reason a service is not ready: a ``code`` (``starting``, ``bus_disconnected``,
    ``lease_lost``, ``disk_full``, ...), a sentence, and the numbers behind it."""

    code: str
    message: str
    details: Mapping[str, int | str] = field(default_factory=dict)

    def body(self) -> dict[str, int | str]:
        """The reason as ``/readyz`` shows it: ``code``, ``message``, then the details."""
        return {"code": self.code, "message": self.message, **self.details}


ReadyCheck = Callable[[], bool | Sequence[NotReady]]
"""Ready: ``True`` or no reason; not ready: ``False`` or the reasons."""


def readiness(ready: ReadyCheck) -> tuple[int, dict[str, object]]:
    """The status and body ``/readyz`` answers for what ``ready`` says now."""
    result = ready()
    if result is True or (not isinstance(result, bool) and not result):
        return 200, {"ready": True}
    reasons = [] if isinstance(result, bool) else [reason.body() for reason in result]
    return 503, {"ready": False, "reasons": reasons}


def health_app(ready: ReadyCheck, registry: CollectorRegistry = REGISTRY) -> Starlette:
    """The Starlette app with /healthz, /readyz and /metrics."""

    async def healthz(_: Request) -> Response:
        return JSONResponse({"status": "ok"})

    async def readyz(_: Request) -> Response:
        status, body = readiness(ready)
        return JSONResponse(body, status_code=status)

    async def metrics(_: Request) -> Response:
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    return Starlette(
        routes=[
            Route("/healthz", healthz),
            Route("/readyz", readyz),
            Route("/metrics", metrics),
        ]
    )


class _Server(uvicorn.Server):
    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        # The service installs its own SIGTERM/SIGINT handling and stops us through stop().
        yield


class AsgiServer:
    """uvicorn serving an ASGI ``app`` on ``host:port`` until :meth:`stop`, with the
    service's listener limits and TLS (danube.runtime.listener); ``listener`` names it in
    the refusal metric."""

    def __init__(
        self,
        app: ASGIApp,
        host: str,
        port: int,
        limits: ServiceConfig | None = None,
        *,
        listener: str,
    ) -> None:
        """``limits``: the service's section, whose listener limits and ``tls`` apply."""
        limits = limits or ServiceConfig()
        config = uvicorn.Config(
            app,
            host=host,
            port=port,
            log_level="warning",
            access_log=False,
            lifespan="off",
            # Nothing stands in front of these listeners: no X-Forwarded-* to read (and no
            # middleware on every request's way).
            proxy_headers=False,
            **uvicorn_limits(limits, listener=listener),
            **uvicorn_tls(limits.tls),  # HTTPS when the service's tls section says so
        )
        self._server = _Server(config)

    async def serve(self) -> None:
        """Serve until :meth:`stop` is called."""
        await self._server.serve()

    @property
    def started(self) -> bool:
        return bool(self._server.started)

    @property
    def port(self) -> int:
        """The port it listens on (the one the OS chose when configured with 0)."""
        return bound_port(self._server)

    async def wait_started(self, serving: asyncio.Task[None], timeout_s: float) -> None:
        """Return once listening; raise if ``serving`` (the task of :meth:`serve`) ended
        first or ``timeout_s`` passed."""
        await wait_started(self._server, serving, timeout_s)

    def stop(self) -> None:
        """Ask the server to finish (it closes its socket and returns from serve())."""
        self._server.should_exit = True


class HealthServer(AsgiServer):
    """:func:`health_app` on ``host:port`` (the ``health`` listener)."""

    def __init__(
        self, host: str, port: int, ready: ReadyCheck, limits: ServiceConfig | None = None
    ) -> None:
        super().__init__(health_app(ready), host, port, limits, listener="health")


async def wait_started(
    server: uvicorn.Server, serving: asyncio.Task[None], timeout_s: float
) -> None:
    """Return once ``server`` listens; raise ``RuntimeError`` if its task ``serving`` ended
    first (it could not bind) or ``timeout_s`` passed. uvicorn exposes only a flag."""
    deadline = time.monotonic() + timeout_s
    while not server.started:
        if serving.done():
            cause = None if serving.cancelled() else serving.exception()
            raise RuntimeError("the HTTP server stopped before it listened") from cause
        if time.monotonic() > deadline:
            raise RuntimeError(f"the HTTP server did not listen within {timeout_s} s")
        await asyncio.sleep(0.01)


def bound_port(server: uvicorn.Server) -> int:
    """The port a started uvicorn server listens on."""
    for listener in server.servers:
        for sock in listener.sockets:
            port: int = sock.getsockname()[1]
            return port
    raise RuntimeError("the HTTP server is not listening")


def advertised_url(config: ServiceConfig, port: int) -> str:
    """Where clients reach a data door listening on ``port`` when its section names no
    ``data_advertised_url``: its host, or this machine's name when it listens on every
    address (compose and Kubernetes set the setting: docs/operations.md)."""
    host = config.host
    if host in ("0.0.0.0", "::", ""):
        host = socket.gethostname()
    return probe_url(host, port, "", tls=config.tls.enabled)

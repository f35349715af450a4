"""The public HTTP API of discovery (DESIGN §5, docs/http-api.md) as a FastAPI app.

:func:`build_app` puts the routes, the health endpoints, the Host check, the body limit,
request metrics and the one error mapping (:mod:`danube.discovery.errors`, answered by
:mod:`danube.discovery.doors.http.failures`) around a :class:`Services`.
"""

from __future__ import annotations

import asyncio
from typing import Any

from fastapi import Depends, FastAPI, Request
from fastapi.openapi.utils import get_openapi
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, generate_latest
from starlette.types import Receive, Scope, Send

from danube.discovery.doors import console as console_files
from danube.discovery.doors.bodies.api import ErrorBody, ReadyOut
from danube.discovery.doors.http import (
    admin,
    console,
    consume,
    elastic,
    failure_policy,
    failures,
    multi_stream,
    partitions,
    produce,
    producers,
    schemas,
    security,
    stream,
    subscriptions,
)
from danube.discovery.doors.http.auth import guard
from danube.discovery.doors.http.middleware import ApiFront
from danube.discovery.doors.http.state import ControllerView, Services, services_of
from danube.meta import MetaError

__all__ = ["Api", "ControllerView", "Services", "build_app"]

# Every operation may answer these, each with the one error body; 405 (with ``Allow``) is
# the answer to a method a path does not serve, 415 to a body not sent as JSON.
_ERRORS: dict[int | str, dict[str, Any]] = {
    status: {"model": ErrorBody}
    for status in (400, 401, 403, 404, 405, 409, 413, 415, 429, 500, 503)
}


def _openapi(app: FastAPI) -> dict[str, Any]:
    """The app's OpenAPI without FastAPI's 422 answers: a request that does not validate is
    answered 400 with the one error body (:mod:`danube.discovery.doors.http.failures`)."""
    if app.openapi_schema is None:
        schema = get_openapi(
            title=app.title,
            version=app.version,
            summary=app.summary,
            routes=app.routes,
        )
        for path in schema.get("paths", {}).values():
            for operation in path.values():
                operation.get("responses", {}).pop("422", None)
        components = schema.get("components", {}).get("schemas", {})
        for name in ("HTTPValidationError", "ValidationError"):
            components.pop(name, None)
        app.openapi_schema = schema
    return app.openapi_schema


class Api(FastAPI):
    """The FastAPI app with :class:`ApiFront` in front of its whole stack: a produce the
    front answers itself (the hot path of one message) passes none of the app's own
    layers (FastAPI's and Starlette's middleware, error catcher, router), each a coroutine
    and a wrapper of ``send`` per request; everything else goes on through all of them."""

    front: ApiFront | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self.front is None:
            await super().__call__(scope, receive, send)
        else:
            await self.front(scope, receive, send)

    async def behind_front(self, scope: Scope, receive: Receive, send: Send) -> None:
        """The app itself, as :class:`ApiFront` calls it."""
        await super().__call__(scope, receive, send)


def build_app(
    services: Services, *, max_body_bytes: int, allowed_hosts: frozenset[str] | None = None
) -> FastAPI:
    """The FastAPI app serving ``services``; OpenAPI at ``/docs`` and ``/openapi.json``.
    ``allowed_hosts``: the names a request's ``Host`` may carry (None: any)."""
    app = Api(
        title="Danube mesh",
        version="1",
        summary="Publish/subscribe over HTTP: topics, lookup, produce, consume",
        responses=_ERRORS,
        # Every route: authenticated and authorized by its row in api/auth.py (a no-op
        # while security is off).
        dependencies=[Depends(guard)],
    )
    app.state.services = services
    app.openapi = lambda: _openapi(app)  # type: ignore[method-assign]
    failures.install(app)
    app.include_router(admin.router)
    app.include_router(produce.router)
    app.include_router(producers.router)
    app.include_router(consume.router)
    app.include_router(stream.router)
    app.include_router(multi_stream.router)
    app.include_router(subscriptions.router)
    app.include_router(failure_policy.router)
    app.include_router(partitions.router)
    app.include_router(elastic.router)
    app.include_router(schemas.router)
    app.include_router(console.router)
    app.include_router(console_files.build_router())
    app.include_router(security.router)

    @app.get("/healthz", tags=["health"])
    async def healthz() -> dict[str, str]:
        """200 while the process runs."""
        return {"status": "ok"}

    @app.get(
        "/readyz",
        tags=["health"],
        response_model=ReadyOut,
        responses={503: {"model": ReadyOut, "description": "The bus or etcd does not answer"}},
    )
    async def readyz(request: Request) -> Response:
        """200 while the bus and etcd answer, else 503."""
        current = services_of(request)
        ok = current.bus.is_connected
        if ok:
            try:
                async with asyncio.timeout(current.ready_timeout_s):
                    await current.store.ping()
            except (MetaError, TimeoutError):
                ok = False
        return JSONResponse({"ready": ok}, status_code=200 if ok else 503)

    @app.get(
        "/metrics",
        tags=["health"],
        response_class=Response,
        responses={200: {"content": {"text/plain": {"schema": {"type": "string"}}}}},
    )
    async def metrics() -> Response:
        """Prometheus text exposition."""
        return Response(generate_latest(REGISTRY), media_type=CONTENT_TYPE_LATEST)

    # Metrics see every answer, the body limit's 413 and the Host check's 400 included.
    app.front = ApiFront(
        app.behind_front, allowed=allowed_hosts, limit_bytes=max_body_bytes, services=services
    )
    return app

"""The public HTTP API of discovery (DESIGN §5, docs/http-api.md) as a FastAPI app.

:func:`build_app` puts the routes, the health endpoints, the body limit, request metrics
and the one error mapping (:mod:`danube.discovery.errors`) around a :class:`Services`.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, generate_latest
from starlette.exceptions import HTTPException

from danube.discovery.api import admin, consume, partitions, produce, stream, subscriptions
from danube.discovery.api.middleware import BodyLimitMiddleware, MetricsMiddleware
from danube.discovery.api.state import ControllerView, Services, services_of
from danube.discovery.errors import error_body, http_status
from danube.discovery.models import ErrorBody
from danube.errors import DanubeError
from danube.meta import MetaError

__all__ = ["ControllerView", "Services", "build_app"]

log = logging.getLogger(__name__)

_HTTP_CODES = {
    404: "not_found",
    405: "method_not_allowed",
    413: "body_too_large",
    415: "unsupported_media_type",
}
_ERRORS: dict[int | str, dict[str, Any]] = {
    status: {"model": ErrorBody} for status in (400, 404, 409, 413, 429, 503)
}


def _error(status: int, code: str, message: str) -> JSONResponse:
    return JSONResponse({"error": {"code": code, "message": message}}, status_code=status)


def _validation_code(exc: RequestValidationError) -> str:
    kinds = {str(error.get("type", "")) for error in exc.errors()}
    if "json_invalid" in kinds:
        return "invalid_json"
    if "extra_forbidden" in kinds:
        return "unknown_field"
    return "invalid_request"


def _validation_message(exc: RequestValidationError) -> str:
    errors = exc.errors()
    if not errors:
        return "invalid request"
    first = errors[0]
    where = ".".join(str(part) for part in first.get("loc", ())) or "request"
    more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
    return f"{where}: {first.get('msg', 'invalid')}{more}"


async def _on_danube_error(_: Request, exc: Exception) -> Response:
    status = http_status(exc)
    if status >= 500:
        log.warning("answered %d: %r", status, exc)
    return JSONResponse(error_body(exc), status_code=status)


async def _on_validation_error(_: Request, exc: Exception) -> Response:
    assert isinstance(exc, RequestValidationError)
    return _error(400, _validation_code(exc), _validation_message(exc))


async def _on_http_error(_: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    code = _HTTP_CODES.get(exc.status_code, "http_error")
    return _error(exc.status_code, code, str(exc.detail))


async def _on_timeout(_: Request, exc: Exception) -> Response:
    return JSONResponse(error_body(exc), status_code=503)


def build_app(services: Services, *, max_body_bytes: int) -> FastAPI:
    """The FastAPI app serving ``services``; OpenAPI at ``/docs`` and ``/openapi.json``."""
    app = FastAPI(
        title="Danube mesh",
        version="1",
        summary="Publish/subscribe over HTTP: topics, lookup, produce, consume",
        responses=_ERRORS,
    )
    app.state.services = services
    app.add_exception_handler(DanubeError, _on_danube_error)
    app.add_exception_handler(RequestValidationError, _on_validation_error)
    app.add_exception_handler(HTTPException, _on_http_error)
    app.add_exception_handler(TimeoutError, _on_timeout)
    app.include_router(admin.router)
    app.include_router(produce.router)
    app.include_router(consume.router)
    app.include_router(stream.router)
    app.include_router(subscriptions.router)
    app.include_router(partitions.router)

    @app.get("/healthz", tags=["health"])
    async def healthz() -> dict[str, str]:
        """200 while the process runs."""
        return {"status": "ok"}

    @app.get("/readyz", tags=["health"])
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

    @app.get("/metrics", tags=["health"])
    async def metrics() -> Response:
        """Prometheus text exposition."""
        return Response(generate_latest(REGISTRY), media_type=CONTENT_TYPE_LATEST)

    # The last added is outermost: metrics see every answer, the body limit's 413 included.
    app.add_middleware(BodyLimitMiddleware, limit_bytes=max_body_bytes)
    app.add_middleware(MetricsMiddleware)
    return app

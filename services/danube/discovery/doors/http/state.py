"""What the HTTP handlers use: the instance's :class:`~danube.discovery.core.Services`, held
by the app (``app.state.services``) and handed to each route through FastAPI's dependency
injection, so tests can build the app over any of it."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request
from starlette.requests import HTTPConnection

from danube.discovery.core import ControllerView, Services

__all__ = ["ControllerView", "Services", "ServicesDep", "get_services", "services_of"]


def services_of(connection: HTTPConnection) -> Services:
    """The instance's :class:`Services` (for a request or a WebSocket)."""
    services: Services = connection.app.state.services
    return services


async def get_services(request: Request) -> Services:
    """:func:`services_of` as a FastAPI dependency. ``async`` on purpose: FastAPI runs a plain
    ``def`` dependency in a worker thread, a thread hop on every request."""
    return services_of(request)


ServicesDep = Annotated[Services, Depends(get_services)]

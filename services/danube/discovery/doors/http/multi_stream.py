"""The many-topics stream route: ``GET /v1/namespaces/{ns}/subscriptions/{sub}/stream``
(WebSocket) with ``topics=a,b`` or ``topics_pattern=<regex>`` — one subscription over many
topics of a namespace, those created later included (docs/http-api.md, "Consume many
topics"). This module opens and closes the socket and reads the query; the stream itself is
:class:`danube.discovery.doors.http.multi_session.MultiStream`, and the selection, the lending of
credits and the routing of acks are :mod:`danube.discovery.doors.http.multi_topic`'s, without I/O.
"""

from __future__ import annotations

import logging

from fastapi import APIRouter, WebSocket
from pydantic import ValidationError

from danube.discovery.doors.http.multi_session import MultiStream, MultiStreamParams
from danube.discovery.doors.http.multi_topic import TopicSelector
from danube.discovery.doors.http.state import Services, services_of
from danube.discovery.doors.http.stream import run_stream
from danube.discovery.errors import BadRequestError
from danube.errors import DanubeError
from danube.names import InvalidNameError, validate_segment
from danube.security import SecurityError

log = logging.getLogger(__name__)

router = APIRouter(prefix="/v1", tags=["consume"])


@router.websocket("/namespaces/{ns}/subscriptions/{sub}/stream")
async def multi_stream(websocket: WebSocket, ns: str, sub: str) -> None:
    """Push the messages of subscription ``sub`` of every topic of ``ns`` that ``topics``
    names or ``topics_pattern`` matches, as the client grants credits; topics created later
    that match are joined; acks and nacks on the same socket go to each ref's topic."""
    services = services_of(websocket)
    await run_stream(
        websocket, services, lambda frames: _serve(websocket, services, ns, sub, frames)
    )


async def _serve(
    websocket: WebSocket, services: Services, ns: str, sub: str, frames: bool
) -> BaseException | None:
    session: MultiStream | None = None
    try:
        params = _params(websocket)
        _names(ns, sub)
        selector = TopicSelector(
            ns,
            topics=None if params.topics is None else params.topics.split(","),
            pattern=params.topics_pattern,
            topics_max=services.stream_topics_max,
        )
        principal = getattr(websocket.state, "principal", "anonymous")
        session = MultiStream(websocket, services, selector, sub, params, principal, frames)
        await session.open()
        return await session.run()
    except (DanubeError, SecurityError, TimeoutError) as exc:
        return exc
    except Exception as exc:
        log.exception("many-topics stream of %s/%s failed", ns[:100], sub[:100])
        return exc
    finally:
        if session is not None:
            await session.detach_all()


def _params(websocket: WebSocket) -> MultiStreamParams:
    query = websocket.query_params
    repeated = [key for key in query if len(query.getlist(key)) > 1]
    if repeated:
        raise BadRequestError(f"{repeated[0]}: given twice", code="invalid_request")
    try:
        return MultiStreamParams.model_validate(dict(query))
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(part) for part in first.get("loc", ())) or "query"
        kinds = {str(error.get("type", "")) for error in exc.errors()}
        code = "unknown_field" if "extra_forbidden" in kinds else "invalid_request"
        raise BadRequestError(f"{where}: {first.get('msg', 'invalid')}", code=code) from None


def _names(ns: str, sub: str) -> None:
    try:
        validate_segment("namespace", ns)
        validate_segment("subscription", sub)
    except InvalidNameError as exc:
        raise BadRequestError(exc.message, code="invalid_name") from exc

"""The consumer stream route: ``GET /v1/consumers/{id}/stream`` (WebSocket), push delivery
with credit-based flow control (docs/http-api.md, "Consume (WebSocket)"). The stream itself
is danube.wire.consume.stream's, shared with the dispatchers' consume doors; here it reaches
the subscription's dispatcher over the bus and holds one of this instance's stream slots."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from fastapi import APIRouter, WebSocket

from danube.discovery import metrics
from danube.discovery.doors.http.params import ConsumerId
from danube.discovery.doors.http.state import Services, services_of
from danube.wire.consume.stream import StreamDoor, serve_consumer
from danube.wire.consume.stream import run_stream as run_door_stream

router = APIRouter(prefix="/v1", tags=["consume"])


def stream_door(services: Services) -> StreamDoor:
    """This instance's streams: the dispatcher over the bus, its stream slots and metrics."""
    return StreamDoor(
        calls=services.dispatcher,
        slots=services.streams,
        keepalive_s=services.stream_keepalive_s,
        open_streams=metrics.STREAMS_OPEN,
        messages=metrics.STREAM_MESSAGES,
    )


@router.websocket("/consumers/{cid}/stream")
async def stream(websocket: WebSocket, cid: ConsumerId) -> None:
    """Push the consumer's messages as the client grants credits; it acks and nacks on the
    same socket. Ends with an error frame and a close code when something goes wrong."""
    door = stream_door(services_of(websocket))
    await run_stream(
        websocket, services_of(websocket), lambda f: serve_consumer(websocket, door, cid, f)
    )


async def run_stream(
    websocket: WebSocket,
    services: Services,
    serve: Callable[[bool], Awaitable[BaseException | None]],
) -> None:
    """Accept a consumer stream, refuse it as authentication decided (api/auth.py: 4401 /
    4403) or past the instance's stream limit, else run ``serve(frames)`` holding a stream
    slot (danube.wire.consume.stream.run_stream)."""
    refusal = getattr(websocket.state, "refusal", None)
    await run_door_stream(websocket, stream_door(services), serve, refusal)

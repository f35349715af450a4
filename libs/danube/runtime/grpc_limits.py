"""A cap on the gRPC calls one client address has in progress on a server.

grpcio offers no hook at a connection's accept: its options bound connections' age and idle
time (``grpc.max_connection_age_ms``, ``grpc.max_connection_idle_ms``) and a server's calls
in progress (``maximum_concurrent_rpcs``), none of them per peer, and a server interceptor
sees calls, never connections. So what one client address may hold of a gRPC listener is
bounded in calls: a call (unary or stream) that would take its address past ``limit`` calls
in progress is refused before its handler with ``RESOURCE_EXHAUSTED``
(``too_many_calls_from_client: ...``; the Danube clients retry it) and counted in
``danube_listener_calls_refused_total{listener, reason="per_client"}``. A client holding
many connections without calls costs descriptors only; gRPC's keepalive pings close those
whose peer vanished.

:func:`limit_calls_per_client` wraps a server's generic handlers: no interceptor chain runs
per call, and each method's handler is wrapped once.
"""

from __future__ import annotations

import inspect
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

import grpc

from danube.runtime.peers import CALLS_REFUSED, PER_CLIENT, PerClient, address_of_grpc_peer

REFUSED_CODE = "too_many_calls_from_client"


class _PerClientHandler(grpc.GenericRpcHandler):  # type: ignore[misc]
    """The wrapped handlers' methods, each call counted against its client's address."""

    def __init__(self, handlers: Sequence[Any], per_client: PerClient, listener: str) -> None:
        self._handlers = list(handlers)
        self._per_client = per_client
        self._listener = listener
        self._wrapped: dict[str, Any] = {}  # method path -> its counted handler

    def service(self, handler_call_details: grpc.HandlerCallDetails) -> Any:
        method: str = handler_call_details.method
        wrapped = self._wrapped.get(method)
        if wrapped is not None:
            return wrapped
        for handler in self._handlers:
            found = handler.service(handler_call_details)
            if found is not None:
                wrapped = self._wrap(found)
                self._wrapped[method] = wrapped
                return wrapped
        return None

    def _wrap(self, handler: Any) -> Any:
        if handler.unary_unary is not None:
            return grpc.unary_unary_rpc_method_handler(
                self._counted(handler.unary_unary),
                request_deserializer=handler.request_deserializer,
                response_serializer=handler.response_serializer,
            )
        if handler.unary_stream is not None:
            return grpc.unary_stream_rpc_method_handler(
                self._counted(handler.unary_stream),
                request_deserializer=handler.request_deserializer,
                response_serializer=handler.response_serializer,
            )
        return handler  # client streaming: none served here; left uncounted

    def _counted(self, behavior: Callable[..., Any]) -> Callable[..., Any]:
        per_client, listener = self._per_client, self._listener

        async def refuse(address: str, context: Any) -> None:
            CALLS_REFUSED.labels(listener, PER_CLIENT).inc()
            await context.abort(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"{REFUSED_CODE}: {address} has {per_client.limit} calls in progress here",
            )

        if inspect.isasyncgenfunction(behavior):

            async def counted_stream(request: Any, context: Any) -> AsyncIterator[Any]:
                address = address_of_grpc_peer(context.peer())
                if address is not None and not per_client.acquire(address):
                    await refuse(address, context)  # raises: the call ends here
                    return
                try:
                    async for item in behavior(request, context):
                        yield item
                finally:
                    if address is not None:
                        per_client.release(address)

            return counted_stream

        async def counted(request: Any, context: Any) -> Any:
            address = address_of_grpc_peer(context.peer())
            if address is not None and not per_client.acquire(address):
                await refuse(address, context)  # raises: the call ends here
                return None
            try:
                return await behavior(request, context)
            finally:
                if address is not None:
                    per_client.release(address)

        return counted


def limit_calls_per_client(
    handlers: Sequence[Any], limit: int, *, listener: str = "grpc"
) -> list[Any]:
    """``handlers`` (generic RPC handlers) as one whose calls are capped at ``limit`` in
    progress per client address; ``listener`` names the server in the refusal metric."""
    return [_PerClientHandler(handlers, PerClient(limit), listener)]

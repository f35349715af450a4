"""What every gRPC door's server does around its handlers: binds them to their method paths,
decodes every request without raising (requests.py: bytes that do not decode are refused
INVALID_ARGUMENT, never UNKNOWN), gives every call a deadline, answers every error through
one table (status.py; anything unexpected INTERNAL, logged, with nothing more said), binds
each call's trace id (danube.trace); and the listener itself (:func:`listen`): its limits,
its TLS, one cap of calls per client address."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import Any

import grpc

from danube import trace
from danube.config.model import TlsConfig
from danube.grpc_door.api import DanubeApi
from danube.grpc_door.requests import Malformed, decoder
from danube.grpc_door.status import ERROR_CODE_KEY, grpc_status
from danube.runtime.grpc_limits import limit_calls_per_client
from danube.security.tls import grpc_server_credentials
from danube.wire import DanubeApi_pb2 as pb

log = logging.getLogger(__name__)

Unary = Callable[[Any, Any], Awaitable[Any]]
Streaming = Callable[[Any, Any], AsyncIterator[Any]]
# Authentication and authorization of one call, before its handler (auth.py):
# (method "<service>/<name>", request, context); raises to refuse.
Check = Callable[[str, Any, Any], None]
# service -> method name -> (handler, request type, response type)
UnaryTable = dict[str, dict[str, tuple[Unary, Any, Any]]]

# Calls a client gives no deadline get this much past the door's own timeout (a produce:
# its claims and retries fit). Streams have none: they last as long as the client wants.
MARGIN_S = 2.0


def allow_all(method: str, request: Any, context: Any) -> None:
    """The check of a door without security: every call runs."""
    return None


async def _fail(context: Any, exc: BaseException, method: str, trace_id: str) -> None:
    """Answer the call with ``exc``'s status (status.py): details ``<code>: <message>``, the
    code also in the trailing metadata; anything unexpected is ``INTERNAL`` with nothing
    more said, and logged with its traceback."""
    code, error_code, details = grpc_status(exc)
    if code is grpc.StatusCode.INTERNAL:
        log.error("gRPC call %s failed", method, exc_info=exc)
    trailing = ((trace.HTTP_HEADER, trace_id), (ERROR_CODE_KEY, error_code))
    await context.abort(code, details, trailing_metadata=trailing)


def _trace_id(context: Any) -> str:
    """The call's trace id (its ``traceparent`` or ``x-request-id`` metadata, else a new
    one), echoed in the trailing metadata as ``x-request-id``."""
    wanted = (trace.TRACEPARENT_HEADER, trace.HTTP_HEADER)
    metadata = {
        key: value
        for key, value in (context.invocation_metadata() or ())
        if key in wanted and isinstance(value, str)
    }
    trace_id = trace.incoming(metadata)
    context.set_trailing_metadata(((trace.HTTP_HEADER, trace_id),))
    return trace_id


def _admit(check: Check, method: str, request: Any, context: Any) -> None:
    """Authenticate and authorize the call, then refuse a request that did not decode
    (after authentication: a caller without credentials learns nothing more)."""
    if isinstance(request, Malformed):
        check(method, None, context)
        raise request.error()
    check(method, request, context)


def _unary(
    fn: Unary,
    request_type: Any,
    response_type: Any,
    default_s: float,
    check: Check = allow_all,
    method: str = "",
) -> Any:
    async def handle(request: Any, context: Any) -> Any:
        remaining = context.time_remaining()
        budget_s = default_s if remaining is None else min(remaining, default_s)
        trace_id = _trace_id(context)
        with trace.bound(trace_id):
            try:
                _admit(check, method, request, context)
                async with asyncio.timeout(max(budget_s, 0.001)):
                    return await fn(request, context)
            except Exception as exc:
                await _fail(context, exc, method, trace_id)

    return grpc.unary_unary_rpc_method_handler(
        handle,
        request_deserializer=decoder(request_type),
        response_serializer=response_type.SerializeToString,
    )


def _streaming(
    fn: Streaming, request_type: Any, response_type: Any, check: Check, method: str
) -> Any:
    async def handle(request: Any, context: Any) -> None:
        trace_id = _trace_id(context)
        with trace.bound(trace_id):
            try:
                _admit(check, method, request, context)
                async for item in fn(request, context):
                    await context.write(item)  # waits for the client's flow-control window
            except Exception as exc:
                await _fail(context, exc, method, trace_id)

    return grpc.unary_stream_rpc_method_handler(
        handle,
        request_deserializer=decoder(request_type),
        response_serializer=response_type.SerializeToString,
    )


def danube_methods(api: DanubeApi) -> UnaryTable:
    """The unary methods of Discovery, ProducerService, ConsumerService and HealthCheck
    (ReceiveMessages, the stream, is added by :func:`method_handlers`)."""
    return {
        "danube.Discovery": {
            "TopicLookup": (api.topic_lookup, pb.TopicLookupRequest, pb.TopicLookupResponse),
            "TopicPartitions": (
                api.topic_partitions,
                pb.TopicLookupRequest,
                pb.TopicPartitionsResponse,
            ),
        },
        "danube.ProducerService": {
            "CreateProducer": (api.create_producer, pb.ProducerRequest, pb.ProducerResponse),
            "SendMessage": (api.send_message, pb.StreamMessage, pb.MessageResponse),
        },
        "danube.ConsumerService": {
            "Subscribe": (api.subscribe, pb.ConsumerRequest, pb.ConsumerResponse),
            "Ack": (api.ack, pb.AckRequest, pb.AckResponse),
            "Nack": (api.nack, pb.NackRequest, pb.NackResponse),
        },
        "danube.HealthCheck": {
            "HealthCheck": (api.health_check, pb.HealthCheckRequest, pb.HealthCheckResponse),
        },
    }


def method_handlers(
    api: DanubeApi,
    timeout_s: float,
    check: Check = allow_all,
    more: Mapping[str, dict[str, tuple[Unary, Any, Any]]] | None = None,
) -> list[Any]:
    """One generic handler per service, by Danube's method names (``more``: a door's other
    unary services); ``check`` runs before every handler (authentication and
    authorization)."""
    t = timeout_s + MARGIN_S
    unary = danube_methods(api)
    unary.update(more or {})
    handlers: dict[str, dict[str, Any]] = {
        service: {
            name: _unary(fn, request, response, t, check, f"{service}/{name}")
            for name, (fn, request, response) in methods.items()
        }
        for service, methods in unary.items()
    }
    handlers["danube.ConsumerService"]["ReceiveMessages"] = _streaming(
        api.receive_messages,
        pb.ReceiveRequest,
        pb.StreamMessage,
        check,
        "danube.ConsumerService/ReceiveMessages",
    )
    return [
        grpc.method_handlers_generic_handler(service, methods)
        for service, methods in handlers.items()
    ]


def listen(
    host: str, port: int, tls: TlsConfig, *, max_message_bytes: int, max_concurrent_rpcs: int
) -> tuple[Any, int]:
    """A gRPC server on ``host:port`` (0: a free port), not started yet (its handlers:
    :func:`serve`), and the port it bound; OSError when the port cannot be bound. TLS when
    ``tls`` sets a certificate (its files followed: danube.security.tls)."""
    server = grpc.aio.server(
        maximum_concurrent_rpcs=max_concurrent_rpcs,
        options=[
            # Never share the port with another process (gRPC's default on Linux): a
            # second instance on the same port must fail, not split the traffic.
            ("grpc.so_reuseport", 0),
            ("grpc.max_receive_message_length", max_message_bytes),
            ("grpc.max_send_message_length", max_message_bytes),
            ("grpc.max_concurrent_streams", 1000),
            # Clients that vanish without closing are found by pings.
            ("grpc.keepalive_time_ms", 30_000),
            ("grpc.keepalive_timeout_ms", 10_000),
            ("grpc.http2.max_pings_without_data", 0),
            ("grpc.keepalive_permit_without_calls", 1),
        ],
    )
    address = f"{_bind_host(host)}:{port}"
    try:
        if tls.enabled:
            bound = server.add_secure_port(address, grpc_server_credentials(tls))
        else:
            bound = server.add_insecure_port(address)
    except RuntimeError as exc:
        raise OSError(f"cannot serve gRPC on {host}:{port}: {exc}") from exc
    if bound == 0:
        raise OSError(f"cannot serve gRPC on {host}:{port}")
    return server, bound


async def serve(server: Any, handlers: list[Any], *, calls_per_client: int) -> None:
    """Start ``server`` (from :func:`listen`) with ``handlers``, at most
    ``calls_per_client`` calls in progress per client address (docs/grpc-api.md,
    "Limits")."""
    server.add_generic_rpc_handlers(limit_calls_per_client(handlers, calls_per_client))
    await server.start()


def _bind_host(host: str) -> str:
    return f"[{host}]" if ":" in host and not host.startswith("[") else host

"""The gRPC server of Danube's client API: binds the handlers (danube.discovery.doors.grpc
.handlers) to their method paths, decodes every request without raising (requests.py: bytes
that do not decode are refused INVALID_ARGUMENT, never UNKNOWN), gives every call a
deadline, answers every error through one table (status.py; anything unexpected INTERNAL,
logged, with nothing more said), binds each call's trace id (danube.trace), and forgets the
producers and consumers of clients that went away."""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import AsyncIterator, Awaitable, Callable
from functools import partial
from typing import Any

import grpc

from danube import trace
from danube.config import DiscoveryConfig
from danube.discovery.core import Services
from danube.discovery.doors.grpc.auth import guard
from danube.discovery.doors.grpc.clients import Clients
from danube.discovery.doors.grpc.handlers import DanubeApi
from danube.discovery.doors.grpc.requests import Malformed, decoder
from danube.discovery.doors.grpc.schema_registry import SchemaRegistryApi
from danube.discovery.doors.grpc.status import ERROR_CODE_KEY, grpc_status
from danube.discovery.produce.sessions import ProducerSessions
from danube.runtime.grpc_limits import limit_calls_per_client
from danube.security.tls import grpc_server_credentials
from danube.wire import DanubeApi_pb2 as pb
from danube.wire import SchemaRegistry_pb2 as sr

log = logging.getLogger(__name__)

Unary = Callable[[Any, Any], Awaitable[Any]]
Streaming = Callable[[Any, Any], AsyncIterator[Any]]
# Authentication and authorization of one call, before its handler (doors/grpc/auth.py):
# (method "<service>/<name>", request, context); raises to refuse.
Check = Callable[[str, Any, Any], None]


def _allow_all(method: str, request: Any, context: Any) -> None:
    return None


REAP_EVERY_S = 2.0
# Calls a client gives no deadline get this one (a produce: its claims and retries fit).
# Streams have none: they last as long as the client wants them.
_MARGIN_S = 2.0


def advertised_url(config: DiscoveryConfig, port: int) -> str:
    """What lookups answer: the configured URL, else this host and the bound port
    (``https://`` when the API serves TLS)."""
    if config.grpc_advertised_url is not None:
        return config.grpc_advertised_url
    host = config.host
    if host in ("0.0.0.0", "::", ""):
        host = socket.gethostname()
    elif ":" in host:
        host = f"[{host}]"
    return f"{'https' if config.tls.enabled else 'http'}://{host}:{port}"


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
    check: Check = _allow_all,
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


_SCHEMA_METHODS = [
    ("RegisterSchema", "register_schema", sr.RegisterSchemaRequest, sr.RegisterSchemaResponse),
    ("GetSchema", "get_schema", sr.GetSchemaRequest, sr.GetSchemaResponse),
    ("GetLatestSchema", "get_latest_schema", sr.GetLatestSchemaRequest, sr.GetSchemaResponse),
    ("ListVersions", "list_versions", sr.ListVersionsRequest, sr.ListVersionsResponse),
    (
        "CheckCompatibility",
        "check_compatibility",
        sr.CheckCompatibilityRequest,
        sr.CheckCompatibilityResponse,
    ),
    (
        "DeleteSchemaVersion",
        "delete_schema_version",
        sr.DeleteSchemaVersionRequest,
        sr.DeleteSchemaVersionResponse,
    ),
    (
        "SetCompatibilityMode",
        "set_compatibility_mode",
        sr.SetCompatibilityModeRequest,
        sr.SetCompatibilityModeResponse,
    ),
    (
        "ConfigureTopicSchema",
        "configure_topic_schema",
        sr.ConfigureTopicSchemaRequest,
        sr.ConfigureTopicSchemaResponse,
    ),
    (
        "UpdateTopicValidationPolicy",
        "update_topic_validation_policy",
        sr.UpdateTopicValidationPolicyRequest,
        sr.UpdateTopicValidationPolicyResponse,
    ),
    (
        "GetTopicSchemaConfig",
        "get_topic_schema_config",
        sr.GetTopicSchemaConfigRequest,
        sr.GetTopicSchemaConfigResponse,
    ),
]


def method_handlers(
    api: DanubeApi, registry: SchemaRegistryApi, timeout_s: float, check: Check = _allow_all
) -> list[Any]:
    """One generic handler per service, by Danube's method names; ``check`` runs before
    every handler (authentication and authorization)."""
    t = timeout_s + _MARGIN_S
    unary: dict[str, dict[str, tuple[Unary, Any, Any]]] = {
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
        "danube_schema.SchemaRegistry": {
            name: (getattr(registry, handler), request, response)
            for name, handler, request, response in _SCHEMA_METHODS
        },
        "danube.HealthCheck": {
            "HealthCheck": (api.health_check, pb.HealthCheckRequest, pb.HealthCheckResponse),
        },
    }
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


class GrpcServer:
    """Danube's client API on ``config.grpc_port``. :meth:`start`, then :meth:`run` until
    cancelled, then :meth:`stop`."""

    def __init__(
        self,
        services: Services,
        sessions: ProducerSessions,
        config: DiscoveryConfig,
        *,
        max_message_bytes: int,
    ) -> None:
        self.services = services
        self.sessions = sessions
        self.config = config
        self.max_message_bytes = max_message_bytes
        self.clients = Clients(limit=config.grpc_max_clients, idle_s=config.grpc_client_idle_s)
        self.port = 0
        self.url = ""
        self.api: DanubeApi | None = None
        self._server: Any = None

    async def start(self) -> None:
        """Bind and serve; OSError when the port cannot be bound."""
        config = self.config
        server = grpc.aio.server(
            maximum_concurrent_rpcs=config.grpc_max_concurrent_rpcs,
            options=[
                # Never share the port with another process (gRPC's default on Linux): a
                # second instance on the same port must fail, not split the traffic.
                ("grpc.so_reuseport", 0),
                ("grpc.max_receive_message_length", self.max_message_bytes),
                ("grpc.max_send_message_length", self.max_message_bytes),
                ("grpc.max_concurrent_streams", 1000),
                # Clients that vanish without closing are found by pings.
                ("grpc.keepalive_time_ms", 30_000),
                ("grpc.keepalive_timeout_ms", 10_000),
                ("grpc.http2.max_pings_without_data", 0),
                ("grpc.keepalive_permit_without_calls", 1),
            ],
        )
        address = f"{_bind_host(config.host)}:{config.grpc_port}"
        try:
            if config.tls.enabled:  # discovery.tls, its files followed (danube.security.tls)
                port = server.add_secure_port(address, grpc_server_credentials(config.tls))
            else:
                port = server.add_insecure_port(address)
        except RuntimeError as exc:
            raise OSError(f"cannot serve gRPC on {config.host}:{config.grpc_port}: {exc}") from exc
        if port == 0:
            raise OSError(f"cannot serve gRPC on {config.host}:{config.grpc_port}")
        self.port = port
        self.url = advertised_url(config, port)
        self.api = DanubeApi(self.services, self.sessions, self.clients, advertised_url=self.url)
        registry = SchemaRegistryApi(self.services.schemas)
        check = partial(guard, self.services.security, self.clients)
        handlers = method_handlers(self.api, registry, config.produce_timeout_s, check)
        # One client address cannot take every call slot (docs/grpc-api.md, "Limits").
        per_client = min(
            config.grpc_max_concurrent_rpcs_per_client, config.grpc_max_concurrent_rpcs
        )
        server.add_generic_rpc_handlers(limit_calls_per_client(handlers, per_client))
        await server.start()
        self._server = server
        log.info("gRPC API on %s:%d (advertised %s)", config.host, port, self.url)

    async def run(self) -> None:
        """Forget idle clients, every few seconds, until cancelled."""
        assert self.api is not None
        while True:
            await asyncio.sleep(REAP_EVERY_S)
            try:
                await self.api.drop_idle()
            except Exception:  # one bad round must not end the server
                log.exception("dropping idle gRPC clients failed")

    async def stop(self, grace_s: float = 5.0) -> None:
        """Stop: no new calls; calls in flight get ``grace_s`` to finish."""
        if self._server is not None:
            await self._server.stop(grace_s)
            self._server = None


def _bind_host(host: str) -> str:
    return f"[{host}]" if ":" in host and not host.startswith("[") else host

"""Discovery's gRPC server: Danube's client API (danube.grpc_door: the handlers, the call
wrappers, the listener) with this instance's schema registry, on ``discovery.grpc_port``;
forgets the producers and consumers of clients that went away."""

from __future__ import annotations

import logging
from functools import partial
from typing import Any

from danube.admission.sessions import ProducerSessions
from danube.config import DiscoveryConfig
from danube.discovery.core import Services
from danube.discovery.doors.grpc.handlers import DiscoveryApi
from danube.discovery.doors.grpc.schema_registry import SchemaRegistryApi
from danube.grpc_door import server as door
from danube.grpc_door.auth import guard
from danube.grpc_door.clients import Clients
from danube.grpc_door.leaders import LeaderDoors
from danube.grpc_door.server import Check, allow_all
from danube.runtime.http import advertised_url as door_url
from danube.wire import SchemaRegistry_pb2 as sr

log = logging.getLogger(__name__)


def advertised_url(config: DiscoveryConfig, port: int) -> str:
    """What lookups answer: the configured URL, else this host and the bound port
    (``https://`` when the API serves TLS)."""
    return config.grpc_advertised_url or door_url(config, port)


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
    api: DiscoveryApi, registry: SchemaRegistryApi, timeout_s: float, check: Check = allow_all
) -> list[Any]:
    """One generic handler per service, by Danube's method names; ``check`` runs before
    every handler (authentication and authorization)."""
    schemas = {
        "danube_schema.SchemaRegistry": {
            name: (getattr(registry, handler), request, response)
            for name, handler, request, response in _SCHEMA_METHODS
        }
    }
    return door.method_handlers(api, timeout_s, check, schemas)


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
        self.api: DiscoveryApi | None = None
        self._server: Any = None

    async def start(self) -> None:
        """Bind and serve; OSError when the port cannot be bound."""
        config = self.config
        server, port = door.listen(
            config.host,
            config.grpc_port,
            config.tls,  # discovery.tls, its files followed (danube.security.tls)
            max_message_bytes=self.max_message_bytes,
            max_concurrent_rpcs=config.grpc_max_concurrent_rpcs,
        )
        self.port = port
        self.url = advertised_url(config, port)
        leaders = LeaderDoors(self.services.store) if config.grpc_redirect else None
        self.api = DiscoveryApi(
            self.services, self.sessions, self.clients, advertised_url=self.url, leaders=leaders
        )
        registry = SchemaRegistryApi(self.services.schemas)
        check = partial(guard, self.services.security, self.clients)
        handlers = method_handlers(self.api, registry, config.produce_timeout_s, check)
        per_client = min(
            config.grpc_max_concurrent_rpcs_per_client, config.grpc_max_concurrent_rpcs
        )
        await door.serve(server, handlers, calls_per_client=per_client)
        self._server = server
        log.info("gRPC API on %s:%d (advertised %s)", config.host, port, self.url)

    async def run(self) -> None:
        """Forget idle clients, every few seconds, until cancelled."""
        assert self.api is not None
        await self.api.forget_idle()

    async def stop(self, grace_s: float = 5.0) -> None:
        """Stop: no new calls; calls in flight get ``grace_s`` to finish."""
        if self._server is not None:
            await self._server.stop(grace_s)
            self._server = None

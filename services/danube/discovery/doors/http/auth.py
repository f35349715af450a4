"""Authentication and authorization of the HTTP API: every route's permission and resource
in one table, checked by one dependency (:func:`guard`) that the app puts on every route.

A route missing from :data:`ROUTES` is refused (default deny) and
``tests/unit/test_http_permissions.py`` fails; :data:`PUBLIC` routes need no credentials.
The decision itself is :meth:`danube.security.gate.SecurityGate.authorize`, shared with
the gRPC API.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from starlette.requests import HTTPConnection
from starlette.types import Scope

from danube.discovery.doors.http.consume import parse_consumer_id
from danube.discovery.doors.http.state import services_of
from danube.discovery.errors import BadRequestError
from danube.names import InvalidNameError, TopicName
from danube.security import Permission, PermissionDeniedError, Resource, SecurityError
from danube.security.gate import ANONYMOUS, SecurityGate

P = Permission
# Where the TLS listener puts the verified client certificate's subject (branch tls).
TLS_PRINCIPAL_SCOPE_KEY = "danube.tls_principal"

Params = Mapping[str, str]


@dataclass(frozen=True, slots=True)
class Rule:
    """A route's permission and how its resource is read from the path parameters."""

    permission: Permission
    resource: Callable[[Params], Resource]


def _cluster(_: Params) -> Resource:
    return Resource.cluster()


def _namespace(params: Params) -> Resource:
    return Resource.namespace(params["ns"])


def _topic(params: Params) -> Resource:
    try:
        return Resource.topic(TopicName(params["ns"], params["topic"]))
    except InvalidNameError as exc:
        raise BadRequestError(exc.message, code="invalid_name") from exc


def _consumer(params: Params) -> Resource:
    topic, _, _ = parse_consumer_id(params["cid"])
    return Resource.topic(topic)


def _rule(permission: Permission, resource: Callable[[Params], Resource]) -> Rule:
    return Rule(permission, resource)


PUBLIC = frozenset(
    {
        ("GET", "/healthz"),
        ("GET", "/readyz"),
        ("GET", "/metrics"),
        # An API key is the credential: the route checks it.
        ("POST", "/v1/auth/token"),
        # The console's page and files hold no data: every /v1 call the page makes carries
        # the token its user gave (docs/console.md).
        ("GET", "/console"),
        ("GET", "/console/"),
        ("GET", "/console/static/{name}"),
    }
)

# (method, route template) -> rule. docs/security.md has this table for readers.
ROUTES: dict[tuple[str, str], Rule] = {
    ("GET", "/v1/cluster"): _rule(P.ManageBroker, _cluster),
    ("GET", "/v1/namespaces"): _rule(P.ManageNamespace, _cluster),
    ("GET", "/v1/namespaces/{ns}"): _rule(P.ManageNamespace, _namespace),
    ("PUT", "/v1/namespaces/{ns}"): _rule(P.ManageNamespace, _namespace),
    ("PATCH", "/v1/namespaces/{ns}"): _rule(P.ManageNamespace, _namespace),
    ("DELETE", "/v1/namespaces/{ns}"): _rule(P.ManageNamespace, _namespace),
    ("GET", "/v1/namespaces/{ns}/topics"): _rule(P.ManageTopic, _namespace),
    ("PUT", "/v1/topics/{ns}/{topic}"): _rule(P.ManageTopic, _topic),
    ("GET", "/v1/topics/{ns}/{topic}"): _rule(P.ManageTopic, _topic),
    ("PATCH", "/v1/topics/{ns}/{topic}"): _rule(P.ManageTopic, _topic),
    ("DELETE", "/v1/topics/{ns}/{topic}"): _rule(P.ManageTopic, _topic),
    # The console's read-only summaries (api/console.py): counters, placement; peek reads
    # payloads, so it is consuming (no cursor moves).
    ("GET", "/v1/topics/{ns}/{topic}/stats"): _rule(P.ManageTopic, _topic),
    ("GET", "/v1/topics/{ns}/{topic}/peek"): _rule(P.Consume, _topic),
    ("GET", "/v1/console/placement"): _rule(P.ManageBroker, _cluster),
    ("GET", "/v1/lookup/{ns}/{topic}"): _rule(P.Lookup, _topic),
    ("POST", "/v1/topics/{ns}/{topic}/messages"): _rule(P.Produce, _topic),
    ("POST", "/v1/topics/{ns}/{topic}/producers"): _rule(P.Produce, _topic),
    ("POST", "/v1/topics/{ns}/{topic}/producers/{producer_id}/keepalive"): _rule(P.Produce, _topic),
    ("POST", "/v1/topics/{ns}/{topic}/producers/{name}/epoch"): _rule(P.Produce, _topic),
    ("DELETE", "/v1/topics/{ns}/{topic}/producers/{producer_id}"): _rule(P.Produce, _topic),
    ("GET", "/v1/topics/{ns}/{topic}/producers"): _rule(P.ManageTopic, _topic),
    ("POST", "/v1/topics/{ns}/{topic}/subscriptions/{sub}/consumers"): _rule(P.Consume, _topic),
    ("GET", "/v1/consumers/{cid}/messages"): _rule(P.Consume, _consumer),
    ("POST", "/v1/consumers/{cid}/ack"): _rule(P.Consume, _consumer),
    ("POST", "/v1/consumers/{cid}/nack"): _rule(P.Consume, _consumer),
    ("DELETE", "/v1/consumers/{cid}"): _rule(P.Consume, _consumer),
    ("WEBSOCKET", "/v1/consumers/{cid}/stream"): _rule(P.Consume, _consumer),
    ("GET", "/v1/topics/{ns}/{topic}/subscriptions"): _rule(P.ManageTopic, _topic),
    ("DELETE", "/v1/topics/{ns}/{topic}/subscriptions/{sub}"): _rule(P.ManageTopic, _topic),
    ("POST", "/v1/topics/{ns}/{topic}/subscriptions/{sub}/seek"): _rule(P.Consume, _topic),
    ("POST", "/v1/topics/{ns}/{topic}/subscriptions/{sub}/skip"): _rule(P.ManageTopic, _topic),
    ("GET", "/v1/topics/{ns}/{topic}/subscriptions/{sub}/failure-policy"): _rule(
        P.ManageTopic, _topic
    ),
    ("PUT", "/v1/topics/{ns}/{topic}/subscriptions/{sub}/failure-policy"): _rule(
        P.ManageTopic, _topic
    ),
    ("POST", "/v1/partitions/{ns}/{partition}/move"): _rule(P.ManageBroker, _cluster),
    ("POST", "/v1/partitions/{ns}/{partition}/uploads/skip"): _rule(P.ManageBroker, _cluster),
    ("POST", "/v1/partitions/{ns}/{partition}/reassign"): _rule(P.ManageBroker, _cluster),
    ("DELETE", "/v1/partitions/{ns}/{partition}/reassign"): _rule(P.ManageBroker, _cluster),
    ("GET", "/v1/reassignments"): _rule(P.ManageBroker, _cluster),
    ("POST", "/v1/nodes/{node_id}/drain"): _rule(P.ManageBroker, _cluster),
    ("DELETE", "/v1/nodes/{node_id}/drain"): _rule(P.ManageBroker, _cluster),
    ("GET", "/v1/nodes/{node_id}/drain"): _rule(P.ManageBroker, _cluster),
    ("GET", "/v1/schemas"): _rule(P.ManageSchema, _cluster),
    ("GET", "/v1/schemas/ids/{schema_id}"): _rule(P.ManageSchema, _cluster),
    ("POST", "/v1/schemas/{subject}/versions"): _rule(P.ManageSchema, _cluster),
    ("GET", "/v1/schemas/{subject}/versions"): _rule(P.ManageSchema, _cluster),
    ("GET", "/v1/schemas/{subject}/versions/latest"): _rule(P.ManageSchema, _cluster),
    ("GET", "/v1/schemas/{subject}/versions/{version}"): _rule(P.ManageSchema, _cluster),
    ("DELETE", "/v1/schemas/{subject}/versions/{version}"): _rule(P.ManageSchema, _cluster),
    ("POST", "/v1/schemas/{subject}/compatibility"): _rule(P.ManageSchema, _cluster),
    ("GET", "/v1/schemas/{subject}/mode"): _rule(P.ManageSchema, _cluster),
    ("PUT", "/v1/schemas/{subject}/mode"): _rule(P.ManageSchema, _cluster),
    ("GET", "/v1/topics/{ns}/{topic}/schema"): _rule(P.ManageSchema, _topic),
    ("PUT", "/v1/topics/{ns}/{topic}/schema"): _rule(P.ManageSchema, _topic),
    ("PATCH", "/v1/topics/{ns}/{topic}/schema"): _rule(P.ManageSchema, _topic),
    ("DELETE", "/v1/topics/{ns}/{topic}/schema"): _rule(P.ManageSchema, _topic),
    ("GET", "/v1/security/roles"): _rule(P.ManageCluster, _cluster),
    ("GET", "/v1/security/roles/{name}"): _rule(P.ManageCluster, _cluster),
    ("PUT", "/v1/security/roles/{name}"): _rule(P.ManageCluster, _cluster),
    ("DELETE", "/v1/security/roles/{name}"): _rule(P.ManageCluster, _cluster),
    ("GET", "/v1/security/bindings"): _rule(P.ManageCluster, _cluster),
    ("GET", "/v1/security/bindings/{binding_id}"): _rule(P.ManageCluster, _cluster),
    ("PUT", "/v1/security/bindings/{binding_id}"): _rule(P.ManageCluster, _cluster),
    ("DELETE", "/v1/security/bindings/{binding_id}"): _rule(P.ManageCluster, _cluster),
    ("GET", "/v1/security/api-keys"): _rule(P.ManageCluster, _cluster),
    ("POST", "/v1/security/api-keys"): _rule(P.ManageCluster, _cluster),
    ("DELETE", "/v1/security/api-keys/{key_id}"): _rule(P.ManageCluster, _cluster),
}
# Any authenticated principal may ask about itself: who am I, what may I do.
AUTHENTICATED = frozenset({("GET", "/v1/security/whoami"), ("GET", "/v1/security/can")})
# Routes over many topics that authorize each topic themselves (Consume on each topic a
# many-topics stream joins: api/multi_stream.py); the guard only authenticates.
PER_TOPIC = frozenset({("WEBSOCKET", "/v1/namespaces/{ns}/subscriptions/{sub}/stream")})


def principal_from_request(connection: HTTPConnection, gate: SecurityGate) -> str:
    """The principal of a request or WebSocket: its bearer token's ``sub``, else the
    verified client-certificate subject the TLS listener left in the ASGI scope
    (``danube.tls_principal``), else UnauthenticatedError. THE one place HTTP reads who is
    asking."""
    tls_principal = connection.scope.get(TLS_PRINCIPAL_SCOPE_KEY)
    return gate.authenticate(
        connection.headers.get("authorization"),
        tls_principal if isinstance(tls_principal, str) else None,
    )


def principal_of_scope(scope: Scope, gate: SecurityGate) -> str:
    """The principal of a request answered before routing (the produce fast path,
    api/produce.py), from its ASGI scope: the guard's, with the same errors, counted and
    audited the same. Authorization is admission's (danube.admission)."""
    if not gate.enabled:
        return ANONYMOUS
    return principal_from_request(HTTPConnection(scope), gate)


def _template(connection: HTTPConnection) -> tuple[str, str]:
    route = connection.scope.get("route")
    path = getattr(route, "path", "") or ""
    method = "WEBSOCKET" if connection.scope["type"] == "websocket" else connection.scope["method"]
    return method, path


async def guard(connection: HTTPConnection) -> None:
    """The app-wide dependency: authenticate, then authorize the route's permission on its
    resource (401 / 403 with the one error body). The principal is left in
    ``connection.state.principal``; a WebSocket's refusal in ``connection.state.refusal``."""
    gate = services_of(connection).security
    if not gate.enabled:
        connection.state.principal = ANONYMOUS
        return
    method, path = _template(connection)
    if (method, path) in PUBLIC:
        return
    try:
        principal = principal_from_request(connection, gate)
        connection.state.principal = principal
        if (method, path) in AUTHENTICATED or (method, path) in PER_TOPIC:
            return
        rule = ROUTES.get((method, path))
        if rule is None:  # a route nobody gave a permission: nobody gets it
            raise PermissionDeniedError(
                f"{method} {path} has no permission rule", permission="none", resource="-"
            )
        resource = rule.resource(connection.path_params)
        gate.authorize(principal, rule.permission, resource, action=f"{method} {path}")
    except (SecurityError, BadRequestError) as exc:
        if connection.scope["type"] != "websocket":
            raise
        # A WebSocket is refused the way a stream ends (api/stream.py): accepted, told why in
        # an error frame, closed with 4401 / 4403. A WebSocket route must check this first.
        connection.state.refusal = exc

"""Authentication and authorization of the gRPC API: each method's permission and how its
resource is read from the request, in one table, checked before the handler runs by
:func:`guard` (called from the server's one wrapper). The decision is the HTTP API's:
:meth:`danube.security.gate.SecurityGate.authorize`.

Danube's clients send ``authorization: Bearer <JWT>`` metadata on every call.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from danube.grpc_door.clients import Clients
from danube.names import client_topic
from danube.security import Permission, Resource
from danube.security.gate import ANONYMOUS, SecurityGate

P = Permission
# None: the method needs an authenticated principal only.
ResourceOf = Callable[[Any, Clients], Resource | None]


@dataclass(frozen=True, slots=True)
class Rule:
    """A method's permission and resource (None: authentication is enough). ``admitted``:
    the handler authenticates the call and admission (danube.admission) decides
    the permission, as on every other produce door; the table says it for readers."""

    permission: Permission | None
    resource: ResourceOf
    admitted: bool = False


def _cluster(_: Any, __: Clients) -> Resource:
    return Resource.cluster()


def _field(name: str) -> ResourceOf:
    def of(request: Any, _: Clients) -> Resource:
        return Resource.topic(client_topic(getattr(request, name)))

    return of


def _msg_id_topic(request: Any, _: Clients) -> Resource:
    return Resource.topic(client_topic(request.msg_id.topic_name))


def _consumer(request: Any, clients: Clients) -> Resource | None:
    entry = clients.consumers.get(request.consumer_id)
    # An unknown consumer: the handler answers NOT_FOUND; its topic is not known to check.
    return None if entry is None else Resource.topic(entry.topic)


def _rule(permission: Permission | None, resource: ResourceOf, *, admitted: bool = False) -> Rule:
    return Rule(permission, resource, admitted)


# "<service>/<method>" -> rule. docs/security.md has this table for readers.
METHODS: dict[str, Rule] = {
    "danube.Discovery/TopicLookup": _rule(P.Lookup, _field("topic")),
    "danube.Discovery/TopicPartitions": _rule(P.Lookup, _field("topic")),
    "danube.ProducerService/CreateProducer": _rule(P.Produce, _field("topic_name")),
    "danube.ProducerService/SendMessage": _rule(P.Produce, _msg_id_topic, admitted=True),
    "danube.ConsumerService/Subscribe": _rule(P.Consume, _field("topic_name")),
    "danube.ConsumerService/ReceiveMessages": _rule(P.Consume, _consumer),
    "danube.ConsumerService/Ack": _rule(P.Consume, _msg_id_topic),
    "danube.ConsumerService/Nack": _rule(P.Consume, _msg_id_topic),
    "danube.HealthCheck/HealthCheck": _rule(None, _cluster),
    **{
        f"danube_schema.SchemaRegistry/{name}": _rule(P.ManageSchema, _cluster)
        for name in (
            "RegisterSchema",
            "GetSchema",
            "GetLatestSchema",
            "ListVersions",
            "CheckCompatibility",
            "DeleteSchemaVersion",
            "SetCompatibilityMode",
        )
    },
    **{
        f"danube_schema.SchemaRegistry/{name}": _rule(P.ManageSchema, _field("topic_name"))
        for name in (
            "ConfigureTopicSchema",
            "UpdateTopicValidationPolicy",
            "GetTopicSchemaConfig",
        )
    },
}


def tls_principal_of(context: Any) -> str | None:
    """The verified client certificate's common name (else its first subjectAltName) of a
    call under mTLS, from its auth context; None without one. Same keys as the TLS branch's
    ``danube.security.tls.grpc_tls_principal``, which replaces this at the merge."""
    try:
        auth = context.auth_context() or {}
    except (AttributeError, RuntimeError):
        return None
    for name in ("x509_common_name", "x509_subject_alternative_name"):
        for value in auth.get(name) or ():
            text = value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)
            if text:
                return text
    return None


def principal_from_call(context: Any, gate: SecurityGate) -> str:
    """The principal of a call: its ``authorization: Bearer`` metadata's ``sub``, else the
    verified client certificate's subject, else UnauthenticatedError. THE one place gRPC
    reads who is asking."""
    if not gate.enabled:
        return ANONYMOUS
    authorization = None
    for key, value in context.invocation_metadata() or ():
        if key == "authorization":
            authorization = value if isinstance(value, str) else value.decode("latin-1")
            break
    return gate.authenticate(authorization, tls_principal_of(context))


def guard(gate: SecurityGate, clients: Clients, method: str, request: Any, context: Any) -> None:
    """Raise UnauthenticatedError or PermissionDeniedError unless the call may run.
    ``request`` None (it did not decode; it is refused next): authentication only. A
    method its handler admits (:attr:`Rule.admitted`) is left to the handler whole."""
    rule = METHODS[method]
    if not gate.enabled or (rule.admitted and request is not None):
        return
    principal = principal_from_call(context, gate)
    if rule.permission is None or request is None:
        return
    resource = rule.resource(request, clients)
    if resource is None:
        return
    gate.authorize(principal, rule.permission, resource, action=f"grpc {method}")

"""Security routes: roles, bindings and API keys under ``/v1/security`` (ManageCluster),
who am I and what may I do (``whoami``, ``can``: any authenticated principal, about itself),
and the exchange of an API key for a token (``POST /v1/auth/token``).
docs/http-api.md and docs/security.md describe them."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Query, Request, Response
from pydantic import BaseModel, ConfigDict, Field

from danube.discovery.doors.http.state import ServicesDep, services_of
from danube.discovery.errors import BadRequestError
from danube.discovery.security.admin import SecurityAdmin
from danube.names import InvalidNameError, TopicName, validate_segment
from danube.security import Binding, Permission, Resource, Role
from danube.security.apikeys import ApiKeyRecord
from danube.security.rbac import NAME_RE, PRINCIPAL_RE, Scope
from danube.wire.api.security import (
    ApiKeyCreated,
    ApiKeyList,
    ApiKeyOut,
    BindingList,
    Can,
    Grant,
    RoleList,
    TokenOut,
    WhoAmI,
)

router = APIRouter(prefix="/v1", tags=["security"])

Name = Annotated[str, Path(pattern=NAME_RE, description="Letters, digits, '_' and '-'.")]
KeyId = Annotated[str, Path(pattern=r"^[0-9a-f]{16}$", description="An API key's id.")]


class _In(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class RoleIn(_In):
    permissions: Annotated[list[Permission], Field(min_length=1, max_length=len(Permission))]


class BindingIn(_In):
    principal: Annotated[str, Field(pattern=PRINCIPAL_RE)]
    roles: Annotated[
        list[Annotated[str, Field(pattern=NAME_RE)]], Field(min_length=1, max_length=64)
    ]
    scope: Scope
    resource: Annotated[str, Field(max_length=300)] = ""


class ApiKeyIn(_In):
    principal: Annotated[str, Field(pattern=PRINCIPAL_RE)]
    description: Annotated[str, Field(max_length=200)] = ""
    expires_s: Annotated[int, Field(ge=60, le=5 * 366 * 86_400)] | None = None


class TokenIn(_In):
    api_key: Annotated[str, Field(min_length=1, max_length=256)]
    ttl_s: Annotated[int, Field(ge=10, le=366 * 86_400)] | None = None


NamespaceQ = Annotated[
    str | None, Query(max_length=300, description="Ask about this namespace (or its topic).")
]
TopicQ = Annotated[
    str | None, Query(max_length=300, description="Ask about this topic (needs namespace).")
]


def _resource(namespace: str | None, topic: str | None) -> Resource:
    """The cluster, a namespace or a topic, from the query; 400 ``invalid_name``."""
    try:
        if topic is not None:
            if namespace is None:
                raise BadRequestError("topic needs its namespace", code="invalid_name")
            return Resource.topic(TopicName(namespace, topic))
        if namespace is not None:
            return Resource.namespace(validate_segment("namespace", namespace))
        return Resource.cluster()
    except InvalidNameError as exc:
        raise BadRequestError(exc.message, code="invalid_name") from exc


def _admin(services: ServicesDep) -> SecurityAdmin:
    return SecurityAdmin(services.store, services.security)


def _key_out(record: ApiKeyRecord) -> ApiKeyOut:
    return ApiKeyOut(**record.model_dump(exclude={"secret_sha256"}))


@router.get("/security/whoami", response_model=WhoAmI)
async def whoami(request: Request, namespace: NamespaceQ = None, topic: TopicQ = None) -> WhoAmI:
    """The principal the request was authenticated as, the permissions it holds on the
    cluster (or on ``namespace`` / its ``topic``), and its own bindings. Every permission
    with security off."""
    gate = services_of(request).security
    principal: str = getattr(request.state, "principal", "anonymous")
    resource = _resource(namespace, topic)
    return WhoAmI(
        principal=principal,
        security_enabled=gate.enabled,
        super_admin=gate.enabled and principal in gate.super_admins,
        scope=resource.scope,
        resource=resource.name,
        permissions=gate.permissions(principal, resource),
        grants=[
            Grant(binding=b.id, scope=b.scope, resource=b.resource, roles=b.roles, permissions=p)
            for b, p in gate.grants(principal)
        ],
    )


@router.get("/security/can", response_model=Can)
async def can(
    request: Request, permission: Permission, namespace: NamespaceQ = None, topic: TopicQ = None
) -> Can:
    """Whether the asking principal may ``permission`` on the cluster, ``namespace`` or its
    ``topic``: the guard's own decision, answered (200) rather than enforced."""
    gate = services_of(request).security
    principal: str = getattr(request.state, "principal", "anonymous")
    resource = _resource(namespace, topic)
    decision = gate.decision(principal, permission, resource)
    return Can(
        principal=principal,
        permission=permission,
        scope=resource.scope,
        resource=resource.name,
        allowed=decision.allowed,
        reason=decision.reason,
    )


# --- roles -----------------------------------------------------------------------------


@router.get("/security/roles", response_model=RoleList)
async def list_roles(services: ServicesDep) -> RoleList:
    """Every role."""
    return RoleList(roles=await _admin(services).roles())


@router.get("/security/roles/{name}", response_model=Role)
async def get_role(name: Name, services: ServicesDep) -> Role:
    """One role."""
    return await _admin(services).role(name)


@router.put(
    "/security/roles/{name}",
    response_model=Role,
    status_code=201,
    responses={200: {"model": Role, "description": "It existed: its permissions replaced"}},
)
async def put_role(name: Name, body: RoleIn, services: ServicesDep, response: Response) -> Role:
    """Create a role (201) or replace its permissions (200)."""
    role = Role(name=name, permissions=sorted(set(body.permissions)))
    stored, created = await _admin(services).put_role(role)
    response.status_code = 201 if created else 200
    return stored


@router.delete("/security/roles/{name}", status_code=204)
async def delete_role(name: Name, services: ServicesDep) -> Response:
    """Delete a role; 409 ``role_in_use`` while a binding names it."""
    await _admin(services).delete_role(name)
    return Response(status_code=204)


# --- bindings --------------------------------------------------------------------------


@router.get("/security/bindings", response_model=BindingList)
async def list_bindings(
    services: ServicesDep,
    principal: Annotated[str | None, Query(max_length=255)] = None,
    scope: Scope | None = None,
    resource: Annotated[str | None, Query(max_length=300)] = None,
) -> BindingList:
    """Every binding, or those of a principal, scope and/or resource."""
    found = [
        b
        for b in await _admin(services).bindings()
        if (principal is None or b.principal == principal)
        and (scope is None or b.scope == scope)
        and (resource is None or b.resource == resource)
    ]
    return BindingList(bindings=found)


@router.get("/security/bindings/{binding_id}", response_model=Binding)
async def get_binding(binding_id: Name, services: ServicesDep) -> Binding:
    """One binding."""
    return await _admin(services).binding(binding_id)


@router.put(
    "/security/bindings/{binding_id}",
    response_model=Binding,
    status_code=201,
    responses={200: {"model": Binding, "description": "It existed: replaced"}},
)
async def put_binding(
    binding_id: Name, body: BindingIn, services: ServicesDep, response: Response
) -> Binding:
    """Grant roles to a principal at a scope: created (201) or replaced (200); 400
    ``unknown_role`` when a role does not exist."""
    binding = Binding(id=binding_id, **body.model_dump())
    stored, created = await _admin(services).put_binding(binding)
    response.status_code = 201 if created else 200
    return stored


@router.delete("/security/bindings/{binding_id}", status_code=204)
async def delete_binding(binding_id: Name, services: ServicesDep) -> Response:
    """Delete a binding: its grants end at once on this instance, within a watch round
    trip on the others."""
    await _admin(services).delete_binding(binding_id)
    return Response(status_code=204)


# --- API keys and tokens ---------------------------------------------------------------


@router.get("/security/api-keys", response_model=ApiKeyList)
async def list_api_keys(services: ServicesDep) -> ApiKeyList:
    """Every API key (never the key itself)."""
    return ApiKeyList(api_keys=[_key_out(r) for r in await _admin(services).api_keys()])


@router.post("/security/api-keys", response_model=ApiKeyCreated, status_code=201)
async def create_api_key(body: ApiKeyIn, services: ServicesDep) -> ApiKeyCreated:
    """A new API key for a principal; the answer is the only place the key is shown."""
    record, api_key = await _admin(services).create_api_key(
        body.principal, description=body.description, expires_s=body.expires_s
    )
    return ApiKeyCreated(**_key_out(record).model_dump(), api_key=api_key)


@router.delete("/security/api-keys/{key_id}", status_code=204)
async def revoke_api_key(key_id: KeyId, services: ServicesDep) -> Response:
    """Revoke an API key: it can no longer be exchanged (tokens already issued live out
    their short TTL)."""
    await _admin(services).revoke_api_key(key_id)
    return Response(status_code=204)


@router.post("/auth/token", response_model=TokenOut)
async def exchange_token(body: TokenIn, services: ServicesDep) -> TokenOut:
    """An API key for a short-lived token (``security.token_ttl_s``, at most
    ``token_max_ttl_s``); 401 ``invalid_api_key`` for an unknown, revoked or expired key."""
    token, principal, expires_ms = await _admin(services).exchange(body.api_key, body.ttl_s)
    return TokenOut(token=token, principal=principal, expires_ms=expires_ms)

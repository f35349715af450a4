"""The security routes of the HTTP API (docs/http-api.md, docs/security.md): roles,
bindings and API keys (ManageCluster), who am I, and an API key exchanged for a token.

Reads and ``PUT`` are retried on 429, 503 and transport failures within the client's
timeout; ``POST`` and ``DELETE`` are tried once.
"""

from __future__ import annotations

from typing import Any, TypeVar
from urllib.parse import quote, urlencode

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from danube.client._http import Answer, HttpCore
from danube.client.errors import ProtocolError

# Re-exported: the SDK's callers import them from here.
from danube.client.permissions import PERMISSIONS as PERMISSIONS
from danube.client.permissions import Scope as Scope
from danube.security import rbac
from danube.wire.api import security as api

# The answers are danube.wire.api's (roles and bindings: the records the server keeps),
# as in danube.client.subscriptions: each model here subclasses the one the server answers
# with and states only what a client tolerates beyond it (unknown fields ignored, a newer
# server's permissions as text, names the server checks).


class Role(rbac.Role):
    """A named set of permissions."""

    model_config = ConfigDict(extra="ignore")

    name: str
    permissions: list[str]  # type: ignore[assignment]  # a newer server's permissions too


class Binding(rbac.Binding):
    """Roles granted to a principal at a scope (``resource``: "" for the cluster, the
    namespace, or ``/<ns>/<topic>``)."""

    model_config = ConfigDict(extra="ignore")

    id: str
    principal: str
    roles: list[str]
    resource: str = ""


class ApiKey(api.ApiKeyOut):
    """An API key as listed (never the key itself)."""


class NewApiKey(api.ApiKeyCreated, ApiKey):
    """A key just made: ``api_key`` is shown this once."""


class Token(api.TokenOut):
    """A bearer token and when it expires."""


class Grant(api.Grant):
    """One of the principal's own bindings and the permissions it grants."""

    permissions: list[str]  # type: ignore[assignment]  # a newer server's permissions too


class WhoAmI(api.WhoAmI):
    """Who the token stands for and what it may do on the resource asked about (the
    cluster unless a namespace or topic was given)."""

    permissions: list[str] = Field(default_factory=list)  # type: ignore[assignment]
    grants: list[Grant] = Field(default_factory=list)


class Can(api.Can):
    """Whether the principal may one permission on one resource, and why."""

    permission: str  # type: ignore[assignment]  # a newer server's permissions too


class _Roles(api.RoleList):
    roles: list[Role]


class _Bindings(api.BindingList):
    bindings: list[Binding]


class _ApiKeys(api.ApiKeyList):
    api_keys: list[ApiKey]


_M = TypeVar("_M", bound=BaseModel)


def _where(namespace: str | None, topic: str | None, *, joiner: str = "?") -> str:
    query = {k: v for k, v in (("namespace", namespace), ("topic", topic)) if v is not None}
    return joiner + urlencode(query) if query else ""


def _parse(model: type[_M], body: Any, what: str) -> _M:
    try:
        return model.model_validate(body)
    except ValidationError as exc:
        raise ProtocolError(f"{what}: unexpected answer: {exc.errors()[0]['msg']}") from exc


class AsyncSecurity:
    """Roles, bindings, API keys and tokens through one server."""

    def __init__(self, http: HttpCore) -> None:
        self._http = http

    async def _call(self, method: str, path: str, body: Any = None) -> Answer:
        if method in ("POST", "DELETE"):
            return await self._http.request(method, path, body=body)
        return await self._http.request_retrying(
            method, path, body=body, timeout_s=self._http.timeout_s
        )

    async def whoami(self, namespace: str | None = None, topic: str | None = None) -> WhoAmI:
        """The principal this client's token stands for, the permissions it holds on the
        cluster (or on ``namespace`` / its ``topic``) and its own bindings."""
        path = "/v1/security/whoami" + _where(namespace, topic)
        return _parse(WhoAmI, (await self._call("GET", path)).body, "whoami")

    async def can(
        self, permission: str, namespace: str | None = None, topic: str | None = None
    ) -> Can:
        """Whether this client's principal may ``permission`` on the cluster, ``namespace``
        or its ``topic`` (the server's decision, not enforced)."""
        path = f"/v1/security/can?permission={quote(permission)}" + _where(
            namespace, topic, joiner="&"
        )
        return _parse(Can, (await self._call("GET", path)).body, "can")

    async def roles(self) -> list[Role]:
        body = (await self._call("GET", "/v1/security/roles")).body
        return _parse(_Roles, body, "roles").roles

    async def create_role(self, name: str, permissions: list[str]) -> Role:
        """Create a role, or replace its permissions."""
        answer = await self._call(
            "PUT", f"/v1/security/roles/{name}", body={"permissions": permissions}
        )
        return _parse(Role, answer.body, "role")

    async def delete_role(self, name: str) -> None:
        await self._call("DELETE", f"/v1/security/roles/{name}")

    async def bindings(
        self, *, principal: str | None = None, scope: Scope | None = None
    ) -> list[Binding]:
        params = {k: v for k, v in (("principal", principal), ("scope", scope)) if v}
        answer = await self._http.request_retrying(
            "GET", "/v1/security/bindings", params=params, timeout_s=self._http.timeout_s
        )
        return _parse(_Bindings, answer.body, "bindings").bindings

    async def create_binding(
        self, binding_id: str, *, principal: str, roles: list[str], scope: Scope, resource: str = ""
    ) -> Binding:
        """Grant ``roles`` to ``principal`` at ``scope`` (create or replace)."""
        body = {"principal": principal, "roles": roles, "scope": scope, "resource": resource}
        answer = await self._call("PUT", f"/v1/security/bindings/{binding_id}", body=body)
        return _parse(Binding, answer.body, "binding")

    async def delete_binding(self, binding_id: str) -> None:
        await self._call("DELETE", f"/v1/security/bindings/{binding_id}")

    async def api_keys(self) -> list[ApiKey]:
        body = (await self._call("GET", "/v1/security/api-keys")).body
        return _parse(_ApiKeys, body, "api keys").api_keys

    async def create_api_key(
        self, principal: str, *, description: str = "", expires_s: int | None = None
    ) -> NewApiKey:
        """A new API key for ``principal`` (the key is in the answer only)."""
        body: dict[str, Any] = {"principal": principal, "description": description}
        if expires_s is not None:
            body["expires_s"] = expires_s
        answer = await self._call("POST", "/v1/security/api-keys", body=body)
        return _parse(NewApiKey, answer.body, "api key")

    async def revoke_api_key(self, key_id: str) -> None:
        await self._call("DELETE", f"/v1/security/api-keys/{key_id}")

    async def token(self, api_key: str, *, ttl_s: int | None = None) -> Token:
        """Exchange an API key for a short-lived token (no token needed for this call)."""
        body: dict[str, Any] = {"api_key": api_key}
        if ttl_s is not None:
            body["ttl_s"] = ttl_s
        return _parse(Token, (await self._call("POST", "/v1/auth/token", body=body)).body, "token")

"""The answers of the security routes (docs/http-api.md, docs/security.md): roles, bindings
and API keys, a token for an API key, who am I and what may I do."""

from __future__ import annotations

from collections.abc import Sequence

from pydantic import BaseModel, ConfigDict

from danube.security.rbac import Binding, Permission, Role, Scope


class _Response(BaseModel):
    model_config = ConfigDict(frozen=True, extra="ignore")


class RoleList(_Response):
    roles: Sequence[Role]


class BindingList(_Response):
    bindings: Sequence[Binding]


class ApiKeyOut(_Response):
    id: str
    principal: str
    created_ms: int
    expires_ms: int | None = None
    description: str = ""


class ApiKeyCreated(ApiKeyOut):
    api_key: str  # shown this once; only its hash is kept


class ApiKeyList(_Response):
    api_keys: Sequence[ApiKeyOut]


class TokenOut(_Response):
    token: str
    token_type: str = "Bearer"
    principal: str
    expires_ms: int


class Grant(_Response):
    """One of the principal's bindings and what it grants."""

    binding: str
    scope: Scope
    resource: str
    roles: list[str]
    permissions: list[Permission]


class WhoAmI(_Response):
    principal: str
    security_enabled: bool
    super_admin: bool = False
    # The resource asked about (the cluster unless ?namespace= / ?topic= were given) and
    # every permission the principal holds there, decided as the guard decides.
    scope: Scope = "cluster"
    resource: str = ""
    permissions: list[Permission] = []
    grants: Sequence[Grant] = []


class Can(_Response):
    principal: str
    permission: Permission
    scope: Scope
    resource: str
    allowed: bool
    reason: str

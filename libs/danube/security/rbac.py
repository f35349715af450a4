"""Role-based access control as pure data and one decision function, no I/O.

A **role** is a named set of permissions; a **binding** grants roles to a principal at one
scope: ``cluster`` (everything), ``namespace`` (its topics too) or ``topic`` (that topic and
its partitions). Permissions are Danube's names. :func:`decide` is default-deny: a principal
is allowed only when a configured super-admin, or when a binding at the resource's own scope
or an enclosing one grants a role holding the permission.

Discovery keeps a :class:`Policy` in memory (loaded from etcd and followed with a watch), so
a decision never waits on etcd.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

from danube.names import TopicName


class Permission(StrEnum):
    """What a principal may do (Danube's names, exactly)."""

    Lookup = "Lookup"
    Produce = "Produce"
    Consume = "Consume"
    ManageNamespace = "ManageNamespace"
    ManageTopic = "ManageTopic"
    ManageSchema = "ManageSchema"
    ManageBroker = "ManageBroker"
    ManageCluster = "ManageCluster"


# Management actions are audit-logged allowed or not; the data path only when denied.
MANAGEMENT = frozenset(p for p in Permission if p.value.startswith("Manage"))

Scope = Literal["cluster", "namespace", "topic"]
SCOPES: tuple[Scope, ...] = ("cluster", "namespace", "topic")

NAME_RE = r"^[A-Za-z0-9_-]{1,128}$"
# Principals are token subjects or certificate subjects ("CN=app,O=acme"): printable, bounded.
PRINCIPAL_RE = r"^[\x21-\x7e][\x20-\x7e]{0,254}$"
_PRINCIPAL = re.compile(PRINCIPAL_RE)


@dataclass(frozen=True, slots=True)
class Resource:
    """What a permission is asked on: the cluster, a namespace, or a topic ``/<ns>/<topic>``
    (a partition is its topic's resource)."""

    scope: Scope
    name: str = ""

    @classmethod
    def cluster(cls) -> Resource:
        return cls("cluster", "")

    @classmethod
    def namespace(cls, ns: str) -> Resource:
        return cls("namespace", ns)

    @classmethod
    def topic(cls, topic: TopicName) -> Resource:
        base = topic.parent
        return cls("topic", f"/{base.namespace}/{base.topic}")

    @property
    def namespace_name(self) -> str | None:
        """The namespace this resource is in (None for the cluster)."""
        if self.scope == "namespace":
            return self.name
        if self.scope == "topic":
            return self.name.split("/")[1]
        return None

    def __str__(self) -> str:
        return "cluster" if self.scope == "cluster" else f"{self.scope} {self.name}"


class _Record(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class Role(_Record):
    """A named set of permissions (etcd ``security/roles/<name>``)."""

    name: Annotated[str, Field(pattern=NAME_RE)]
    permissions: Annotated[list[Permission], Field(min_length=1, max_length=len(Permission))]
    created_ms: int = 0


class Binding(_Record):
    """Grants ``roles`` to ``principal`` at ``scope`` (``resource``: "" for the cluster, the
    namespace, or the topic ``/<ns>/<topic>``). etcd ``security/bindings/<id>``."""

    id: Annotated[str, Field(pattern=NAME_RE)]
    principal: Annotated[str, Field(pattern=PRINCIPAL_RE)]
    roles: Annotated[
        list[Annotated[str, Field(pattern=NAME_RE)]], Field(min_length=1, max_length=64)
    ]
    scope: Scope
    resource: Annotated[str, Field(max_length=300)] = ""
    created_ms: int = 0

    @property
    def target(self) -> Resource:
        return Resource(self.scope, self.resource)


def valid_principal(value: str) -> bool:
    """Whether ``value`` can name a principal."""
    return _PRINCIPAL.fullmatch(value) is not None


@dataclass(frozen=True, slots=True)
class Decision:
    """An answer of :func:`decide`, with why (for the audit log, never for the caller's
    secrets: it names bindings and roles only)."""

    allowed: bool
    reason: str


@dataclass
class Policy:
    """Every role and binding, indexed for :func:`decide`."""

    roles: dict[str, Role] = field(default_factory=dict)
    bindings: dict[str, Binding] = field(default_factory=dict)
    # (scope, resource) -> principal -> bindings there: a decision looks at three entries.
    _index: dict[tuple[str, str], dict[str, list[Binding]]] = field(default_factory=dict)

    @classmethod
    def of(cls, roles: Iterable[Role], bindings: Iterable[Binding]) -> Policy:
        policy = cls()
        for role in roles:
            policy.put_role(role)
        for binding in bindings:
            policy.put_binding(binding)
        return policy

    def put_role(self, role: Role) -> None:
        self.roles[role.name] = role

    def delete_role(self, name: str) -> None:
        self.roles.pop(name, None)

    def put_binding(self, binding: Binding) -> None:
        self.delete_binding(binding.id)
        self.bindings[binding.id] = binding
        at = self._index.setdefault((binding.scope, binding.resource), {})
        at.setdefault(binding.principal, []).append(binding)

    def delete_binding(self, binding_id: str) -> None:
        old = self.bindings.pop(binding_id, None)
        if old is None:
            return
        at = self._index.get((old.scope, old.resource), {})
        held = [b for b in at.get(old.principal, []) if b.id != binding_id]
        if held:
            at[old.principal] = held
        else:
            at.pop(old.principal, None)

    def bindings_of(self, principal: str, resource: Resource) -> list[Binding]:
        """The principal's bindings that reach ``resource``: cluster, then its namespace,
        then the topic itself."""
        places: list[tuple[str, str]] = [("cluster", "")]
        ns = resource.namespace_name
        if ns is not None:
            places.append(("namespace", ns))
        if resource.scope == "topic":
            places.append(("topic", resource.name))
        found: list[Binding] = []
        for place in places:
            found.extend(self._index.get(place, {}).get(principal, []))
        return found

    def bindings_for(self, principal: str) -> list[Binding]:
        """Every binding of ``principal``, by id (what it may ask about itself)."""
        return sorted(
            (b for b in self.bindings.values() if b.principal == principal), key=lambda b: b.id
        )

    def permissions_of(self, binding: Binding) -> list[Permission]:
        """What ``binding`` grants: its roles' permissions (roles that exist), in
        :class:`Permission` order."""
        held = {p for name in binding.roles if (r := self.roles.get(name)) for p in r.permissions}
        return [p for p in Permission if p in held]

    def roles_in_use(self, name: str) -> list[str]:
        """Ids of the bindings that name role ``name``."""
        return sorted(b.id for b in self.bindings.values() if name in b.roles)


def decide(
    policy: Policy,
    principal: str,
    permission: Permission,
    resource: Resource,
    *,
    super_admins: frozenset[str] = frozenset(),
) -> Decision:
    """Whether ``principal`` may ``permission`` on ``resource``: default deny."""
    if principal in super_admins:
        return Decision(True, "super-admin (security.super_admins)")
    for binding in policy.bindings_of(principal, resource):
        for name in binding.roles:
            role = policy.roles.get(name)
            if role is not None and permission in role.permissions:
                where = "cluster" if binding.scope == "cluster" else binding.resource
                return Decision(True, f"binding {binding.id} role {name} at {where}")
    return Decision(False, f"no binding grants {permission.value} on {resource}")

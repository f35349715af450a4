"""Security of the mesh's front doors (docs/security.md).

- :mod:`danube.security.tls`: TLS and mTLS on every listener, certificates reloaded on
  change, the transport principal of a client certificate;
- :mod:`danube.security.pki`: a local certificate authority for one machine
  (``danube up --secure``);
- :mod:`danube.security.tokens`: Ed25519 keys by id, :func:`issue_token`,
  :func:`ensure_signing_key`, :class:`TokenVerifier`;
- :mod:`danube.security.apikeys`: API keys, stored hashed, exchanged for tokens;
- :mod:`danube.security.rbac`: :class:`Permission`, :class:`Resource`, roles, bindings and
  the one pure decision, :func:`decide`;
- :mod:`danube.security.errors`: 401 and 403 as errors;
- :mod:`danube.security.gate`: :class:`~danube.security.gate.SecurityGate`, the gate every
  door asks (authentication, RBAC from etcd kept current by a watch).

Discovery and danube.admission build gates from them; the CLI signs tokens with them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from danube.lazy import LazyNames

if TYPE_CHECKING:
    from danube.security.errors import PermissionDeniedError, SecurityError, UnauthenticatedError
    from danube.security.rbac import (
        MANAGEMENT,
        Binding,
        Decision,
        Permission,
        Policy,
        Resource,
        Role,
        decide,
    )
    from danube.security.tokens import (
        Claims,
        KeySet,
        SigningKey,
        TokenVerifier,
        ensure_signing_key,
        generate_key,
        issue_token,
        load_keys,
        write_public_keys,
    )

# Each public name and the module that defines it, imported on first use: importing one
# module of the package (danube.security.rbac, whose roles and bindings the HTTP API answers
# and the SDK reads) loads that module, not the token signing and the gate.
_HOMES = {
    "PermissionDeniedError": "danube.security.errors",
    "SecurityError": "danube.security.errors",
    "UnauthenticatedError": "danube.security.errors",
    "MANAGEMENT": "danube.security.rbac",
    "Binding": "danube.security.rbac",
    "Decision": "danube.security.rbac",
    "Permission": "danube.security.rbac",
    "Policy": "danube.security.rbac",
    "Resource": "danube.security.rbac",
    "Role": "danube.security.rbac",
    "decide": "danube.security.rbac",
    "Claims": "danube.security.tokens",
    "KeySet": "danube.security.tokens",
    "SigningKey": "danube.security.tokens",
    "TokenVerifier": "danube.security.tokens",
    "ensure_signing_key": "danube.security.tokens",
    "generate_key": "danube.security.tokens",
    "issue_token": "danube.security.tokens",
    "load_keys": "danube.security.tokens",
    "write_public_keys": "danube.security.tokens",
}


_LAZY = LazyNames(__name__, globals(), _HOMES)


def __getattr__(name: str) -> Any:
    return _LAZY.load(name)


def __dir__() -> list[str]:
    return _LAZY.names()


__all__ = [
    "MANAGEMENT",
    "Binding",
    "Claims",
    "Decision",
    "KeySet",
    "Permission",
    "PermissionDeniedError",
    "Policy",
    "Resource",
    "Role",
    "SecurityError",
    "SigningKey",
    "TokenVerifier",
    "UnauthenticatedError",
    "decide",
    "ensure_signing_key",
    "generate_key",
    "issue_token",
    "load_keys",
    "write_public_keys",
]

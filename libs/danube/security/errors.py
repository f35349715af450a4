"""Errors of authentication and authorization::

    DanubeError
    └── SecurityError              "security_error"
        ├── UnauthenticatedError   "unauthenticated", "token_expired",
        │                          "invalid_token", "invalid_api_key"
        │                          (HTTP 401, gRPC UNAUTHENTICATED)
        └── PermissionDeniedError  "permission_denied"; ``permission`` names what
                                   was missing (HTTP 403, gRPC PERMISSION_DENIED)

No message ever carries a token or an API key: they name what was wrong with it.
"""

from __future__ import annotations

from danube.errors import DanubeError, ErrorKind


class SecurityError(DanubeError):
    """Root of the security errors."""

    code = "security_error"


class UnauthenticatedError(SecurityError):
    """No credentials, or credentials that do not verify (signature, issuer, audience,
    expiry, unknown key id, unknown or revoked API key)."""

    code = "unauthenticated"
    kind = ErrorKind.UNAUTHENTICATED


class PermissionDeniedError(SecurityError):
    """The principal is known but no binding grants it ``permission`` on ``resource``."""

    code = "permission_denied"
    kind = ErrorKind.FORBIDDEN

    def __init__(self, message: str, *, permission: str, resource: str) -> None:
        super().__init__(message)
        self.permission = permission
        self.resource = resource

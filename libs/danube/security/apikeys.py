"""API keys: long-lived secrets a principal exchanges for short-lived tokens
(``POST /v1/auth/token``).

A key reads ``dnbk_<id>_<secret>``: ``<id>`` finds its record (etcd
``security/api_keys/<id>``), ``<secret>`` is 32 random bytes. Only the SHA-256 of the secret
is stored — a hash that is safe for a high-entropy secret (there is nothing to guess) and
checked in constant time. The key itself is shown once, when made.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field

from danube.security.errors import UnauthenticatedError
from danube.security.rbac import PRINCIPAL_RE

PREFIX = "dnbk_"
_KEY_RE = re.compile(r"dnbk_([0-9a-f]{16})_([A-Za-z0-9_-]{43})")


class ApiKeyRecord(BaseModel):
    """What etcd holds of an API key: never the key."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    id: Annotated[str, Field(pattern=r"^[0-9a-f]{16}$")]
    principal: Annotated[str, Field(pattern=PRINCIPAL_RE)]
    secret_sha256: Annotated[str, Field(pattern=r"^[0-9a-f]{64}$")]
    created_ms: int
    expires_ms: int | None = None
    description: Annotated[str, Field(max_length=200)] = ""


def _digest(secret: str) -> str:
    return hashlib.sha256(secret.encode("ascii")).hexdigest()


def new_api_key() -> tuple[str, str, str]:
    """A fresh key: ``(key_id, api_key, secret_sha256)``."""
    key_id = secrets.token_hex(8)
    secret = secrets.token_urlsafe(32)
    return key_id, f"{PREFIX}{key_id}_{secret}", _digest(secret)


def parse_api_key(api_key: str) -> tuple[str, str]:
    """``(key_id, secret)`` of a key; UnauthenticatedError when it is not one."""
    match = _KEY_RE.fullmatch(api_key)
    if match is None:
        raise UnauthenticatedError("not an API key", code="invalid_api_key")
    return match.group(1), match.group(2)


def check_secret(record: ApiKeyRecord, secret: str, *, now_ms: int) -> None:
    """UnauthenticatedError unless ``secret`` is the record's and the key has not expired."""
    if not hmac.compare_digest(_digest(secret), record.secret_sha256):
        raise UnauthenticatedError("unknown or revoked API key", code="invalid_api_key")
    if record.expires_ms is not None and now_ms >= record.expires_ms:
        raise UnauthenticatedError("API key expired", code="invalid_api_key")

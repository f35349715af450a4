"""Bearer tokens: JWTs signed with the cluster's Ed25519 keys (PyJWT, algorithm EdDSA).

Keys live in one directory, one file per key id (``kid``)::

    <keys_dir>/<kid>.pem       a private key (PKCS#8 PEM, mode 0600): signs and verifies
    <keys_dir>/<kid>.pub.pem   a public key only: verifies (a key that signs elsewhere)

A token names its key in its header (``kid``); every key in the directory verifies, and the
one that signs is ``security.signing_kid`` (default: the greatest private key id — ids made
here are ``k<UTC time>``, so the newest). Rotation: add a key, sign with it, and remove the
old key once the tokens it signed have expired.

Claims: ``sub`` (the principal), ``iss``, ``aud``, ``iat``, ``exp`` (all required), ``jti``.
"""

from __future__ import annotations

import os
import re
import secrets
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import jwt
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from danube.security.errors import UnauthenticatedError

ALGORITHM = "EdDSA"
KID_RE = re.compile(r"[A-Za-z0-9_-]{1,64}")
PRIVATE_SUFFIX = ".pem"
PUBLIC_SUFFIX = ".pub.pem"
# Clocks of the issuer and of discovery may differ this much.
LEEWAY_S = 5
# No key file is read past this size (a PEM Ed25519 key is ~120 bytes).
KEY_FILE_BYTES_MAX = 16 * 1024
# A token is a header line, not a document.
TOKEN_CHARS_MAX = 8192


@dataclass(frozen=True, slots=True)
class SigningKey:
    """A private key and its id."""

    kid: str
    private: Ed25519PrivateKey

    @property
    def public(self) -> Ed25519PublicKey:
        return self.private.public_key()


@dataclass(frozen=True, slots=True)
class Claims:
    """What a verified token says."""

    principal: str
    issuer: str
    audience: str
    expires_at_s: float
    kid: str


@dataclass(frozen=True, slots=True)
class KeySet:
    """The keys of a directory: the one that signs (if any private key is there) and every
    key that verifies, by id."""

    signing: SigningKey | None
    public: Mapping[str, Ed25519PublicKey]


def _check_kid(kid: str) -> str:
    if KID_RE.fullmatch(kid) is None:
        raise ValueError(f"key id must be 1 to 64 of A-Z a-z 0-9 _ -, got {kid[:80]!r}")
    return kid


def _read(path: Path) -> bytes:
    if path.stat().st_size > KEY_FILE_BYTES_MAX:
        raise ValueError(f"{path}: over {KEY_FILE_BYTES_MAX} bytes, not a key")
    return path.read_bytes()


def _private_key(path: Path) -> Ed25519PrivateKey:
    key = serialization.load_pem_private_key(_read(path), password=None)
    if not isinstance(key, Ed25519PrivateKey):
        raise ValueError(f"{path}: not an Ed25519 private key")
    return key


def _public_key(path: Path) -> Ed25519PublicKey:
    key = serialization.load_pem_public_key(_read(path))
    if not isinstance(key, Ed25519PublicKey):
        raise ValueError(f"{path}: not an Ed25519 public key")
    return key


def load_keys(keys_dir: Path, *, signing_kid: str | None = None) -> KeySet:
    """Every key of ``keys_dir``; ValueError when a file is not a key, when ``signing_kid``
    is named but has no private key there, or when there is no key at all."""
    private: dict[str, Ed25519PrivateKey] = {}
    public: dict[str, Ed25519PublicKey] = {}
    for path in sorted(keys_dir.iterdir()):
        name = path.name
        if name.endswith(PUBLIC_SUFFIX):
            kid = _check_kid(name[: -len(PUBLIC_SUFFIX)])
            public.setdefault(kid, _public_key(path))
        elif name.endswith(PRIVATE_SUFFIX):
            kid = _check_kid(name[: -len(PRIVATE_SUFFIX)])
            private[kid] = _private_key(path)
            public[kid] = private[kid].public_key()
    if not public:
        raise ValueError(f"no keys in {keys_dir} (<kid>.pem or <kid>.pub.pem)")
    if signing_kid is not None and signing_kid not in private:
        raise ValueError(f"signing key {signing_kid!r} has no private key in {keys_dir}")
    chosen = signing_kid or (max(private) if private else None)
    signing = SigningKey(chosen, private[chosen]) if chosen is not None else None
    return KeySet(signing, public)


def new_kid() -> str:
    """A key id that sorts by creation time: ``k20260124T021500Z-<4 hex>``."""
    return time.strftime("k%Y%m%dT%H%M%SZ", time.gmtime()) + "-" + secrets.token_hex(2)


def generate_key(keys_dir: Path, kid: str | None = None) -> SigningKey:
    """Write a new Ed25519 private key ``<keys_dir>/<kid>.pem`` (mode 0600, never
    overwriting a file) and return it."""
    kid = _check_kid(kid or new_kid())
    keys_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    private = Ed25519PrivateKey.generate()
    pem = private.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    path = keys_dir / f"{kid}{PRIVATE_SUFFIX}"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as file:
        file.write(pem)
        file.flush()
        os.fsync(file.fileno())
    return SigningKey(kid, private)


def write_public_keys(keys_dir: Path, public_dir: Path) -> list[str]:
    """Make ``public_dir`` hold the public half of every key of ``keys_dir`` and nothing
    else: ``<kid>.pub.pem`` each (written elsewhere and renamed in, so a service reading the
    directory never sees half a file), public files of keys gone from ``keys_dir`` removed.
    For the services that only verify tokens (ingest and dispatcher doors): they never hold
    a key that signs. Returns the key ids, sorted."""
    keys = load_keys(keys_dir)
    public_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    for kid, key in keys.public.items():
        pem = key.public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
        path = public_dir / f"{kid}{PUBLIC_SUFFIX}"
        if path.exists() and path.read_bytes() == pem:
            continue
        staged = public_dir / f".{kid}.staged"
        staged.write_bytes(pem)
        os.chmod(staged, 0o644)
        os.replace(staged, path)
    for path in public_dir.iterdir():
        name = path.name
        if name.endswith(PUBLIC_SUFFIX) and name[: -len(PUBLIC_SUFFIX)] not in keys.public:
            path.unlink()
    return sorted(keys.public)


def ensure_signing_key(keys_dir: Path, kid: str | None = None) -> SigningKey:
    """The key that signs in ``keys_dir`` (the greatest private key id), made (with id
    ``kid``, default :func:`new_kid`) when the directory has none: what ``danube up
    --secure`` calls before issuing its admin token."""
    if keys_dir.is_dir():
        keys = load_keys(keys_dir) if any(keys_dir.iterdir()) else None
        if keys is not None and keys.signing is not None:
            return keys.signing
    return generate_key(keys_dir, kid)


def public_pem(key: SigningKey) -> bytes:
    """The public half of ``key`` as PEM (to write ``<kid>.pub.pem`` elsewhere)."""
    return key.public.public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )


def issue_token(
    key: SigningKey,
    principal: str,
    ttl_s: float,
    *,
    issuer: str,
    audience: str,
    now_s: float | None = None,
) -> str:
    """A token for ``principal`` valid ``ttl_s`` seconds, signed by ``key``."""
    if ttl_s <= 0:
        raise ValueError(f"ttl_s must be positive, got {ttl_s}")
    if not principal:
        raise ValueError("a token needs a principal")
    now = int(time.time() if now_s is None else now_s)
    claims = {
        "sub": principal,
        "iss": issuer,
        "aud": audience,
        "iat": now,
        "exp": now + int(ttl_s),
        "jti": secrets.token_urlsafe(12),
    }
    return jwt.encode(claims, key.private, algorithm=ALGORITHM, headers={"kid": key.kid})


class TokenVerifier:
    """Checks tokens against the listed keys, issuer and audience."""

    def __init__(self, keys: Mapping[str, Ed25519PublicKey], *, issuer: str, audience: str) -> None:
        if not keys:
            raise ValueError("a verifier needs at least one key")
        self.keys = dict(keys)
        self.issuer = issuer
        self.audience = audience

    def verify(self, token: str) -> Claims:
        """The token's claims; UnauthenticatedError naming what is wrong (never the token)."""
        if len(token) > TOKEN_CHARS_MAX:
            raise UnauthenticatedError("token too long", code="invalid_token")
        try:
            header = jwt.get_unverified_header(token)
        except jwt.InvalidTokenError as exc:
            raise UnauthenticatedError("malformed token", code="invalid_token") from exc
        kid = header.get("kid")
        if header.get("alg") != ALGORITHM:
            raise UnauthenticatedError(f"token algorithm must be {ALGORITHM}", code="invalid_token")
        key = self.keys.get(kid) if isinstance(kid, str) else None
        if key is None or not isinstance(kid, str):
            raise UnauthenticatedError("token signed by an unknown key id", code="invalid_token")
        try:
            claims = jwt.decode(
                token,
                key,
                algorithms=[ALGORITHM],
                audience=self.audience,
                issuer=self.issuer,
                leeway=LEEWAY_S,
                options={"require": ["exp", "iat", "sub", "iss", "aud"]},
            )
        except jwt.ExpiredSignatureError as exc:
            raise UnauthenticatedError("token expired", code="token_expired") from exc
        except jwt.InvalidAudienceError as exc:
            raise UnauthenticatedError("token for another audience", code="invalid_token") from exc
        except jwt.InvalidIssuerError as exc:
            raise UnauthenticatedError("token from another issuer", code="invalid_token") from exc
        except jwt.InvalidSignatureError as exc:
            raise UnauthenticatedError(
                "token signature does not verify", code="invalid_token"
            ) from exc
        except jwt.MissingRequiredClaimError as exc:
            raise UnauthenticatedError(
                f"token lacks claim {exc.claim}", code="invalid_token"
            ) from exc
        except jwt.InvalidTokenError as exc:
            raise UnauthenticatedError("invalid token", code="invalid_token") from exc
        exp = float(claims["exp"])
        sub = claims["sub"]
        if not isinstance(sub, str) or not sub:
            raise UnauthenticatedError("token subject must be a string", code="invalid_token")
        return Claims(sub, self.issuer, self.audience, exp, kid)

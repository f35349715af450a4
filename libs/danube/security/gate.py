"""The one gate of every door (docs/security.md): who is asking (authentication) and may
they (authorization), answered from memory.

:class:`SecurityGate` holds the token verifier and the RBAC :class:`~danube.security.Policy`,
loaded from etcd before serving and kept current by a watch (:meth:`SecurityGate.follow`),
so no request waits on etcd for a decision. Discovery's HTTP (``danube.discovery.doors.http.auth``)
and gRPC (``danube.grpc_door.auth``) doors, and admission (danube.admission) for
any door that produces, map each route or method to a permission and resource and call
:meth:`SecurityGate.authorize`; it counts denials (in the counters its service gives it:
danube.admission.counters) and writes the audit log. Here in the libs, not in discovery,
so that an ingest node serving produce builds the same gate over the same etcd keys.

With ``security.enabled`` false the gate lets everything through, anonymous.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import time
from collections import OrderedDict

from prometheus_client import Counter

from danube.config import SecurityConfig
from danube.meta import MetaError, MetaStore, WatchEvent
from danube.meta import keys as meta_keys
from danube.meta.backoff import backoff_s
from danube.meta.kv import decode_model
from danube.security import (
    MANAGEMENT,
    Binding,
    Decision,
    Permission,
    PermissionDeniedError,
    Policy,
    Resource,
    Role,
    TokenVerifier,
    UnauthenticatedError,
    decide,
    load_keys,
)
from danube.security.files import DirStamp, dir_stamp
from danube.security.tokens import KeySet, SigningKey

log = logging.getLogger(__name__)
# One line per management decision and per denial: principal, action, resource, allowed.
audit = logging.getLogger("danube.audit")

ANONYMOUS = "anonymous"

_RETRY_BASE_S = 0.1
_RETRY_CAP_S = 5.0


class SecurityGate:
    """Authentication and authorization for one process (a discovery instance, an ingest
    node)."""

    def __init__(
        self,
        config: SecurityConfig,
        *,
        store: MetaStore | None = None,
        verifier: TokenVerifier | None = None,
        signing: SigningKey | None = None,
        authn_failed: Counter | None = None,
        authz_denied: Counter | None = None,
    ) -> None:
        """``authn_failed`` (by code) and ``authz_denied`` (by permission): where refusals
        are counted (AdmissionCounters'; None: not counted)."""
        if config.enabled and verifier is None:
            raise ValueError("security enabled without token keys (security.keys_dir)")
        self.config = config
        self.store = store
        self.verifier = verifier
        self.signing = signing
        self.super_admins = frozenset(config.super_admins)
        self.authn_failed = authn_failed
        self.authz_denied = authz_denied
        self.policy = Policy()
        self._seen_revision = 0
        self._keys_seen: DirStamp | None = None
        self._keys_refused: str | None = None
        # sha256(token) -> (principal, trusted until): not the token itself, so a heap dump
        # of the cache holds no credential.
        self._verified: OrderedDict[bytes, tuple[str, float]] = OrderedDict()

    @classmethod
    def disabled(cls) -> SecurityGate:
        """A gate that allows everything (``security.enabled: false``)."""
        return cls(SecurityConfig())

    @classmethod
    def from_config(
        cls,
        config: SecurityConfig,
        store: MetaStore,
        *,
        authn_failed: Counter | None = None,
        authz_denied: Counter | None = None,
    ) -> SecurityGate:
        """The gate of ``config``: its keys read from ``security.keys_dir`` when enabled
        (ValueError naming what is missing); refusals counted in the counters given."""
        if not config.enabled:
            return cls(config, store=store, authn_failed=authn_failed, authz_denied=authz_denied)
        if config.keys_dir is None:
            raise ValueError("security.enabled needs security.keys_dir")
        seen = dir_stamp(config.keys_dir)
        keys = load_keys(config.keys_dir, signing_kid=config.signing_kid)
        verifier = TokenVerifier(keys.public, issuer=config.issuer, audience=config.audience)
        gate = cls(
            config,
            store=store,
            verifier=verifier,
            signing=keys.signing,
            authn_failed=authn_failed,
            authz_denied=authz_denied,
        )
        gate._keys_seen = seen
        return gate

    # --- keys ------------------------------------------------------------------------------

    def _read_keys_if_changed(self) -> tuple[DirStamp, KeySet | None]:
        """Blocking (files): the directory's stamp, and its keys if it changed since
        they were last taken (None: unchanged); what load_keys raises for a directory that
        does not load (no key, a file that is not a key, say one half written)."""
        keys_dir = self.config.keys_dir
        assert keys_dir is not None
        seen = dir_stamp(keys_dir)
        if seen == self._keys_seen:
            return seen, None
        return seen, load_keys(keys_dir, signing_kid=self.config.signing_kid)

    async def reload_keys(self) -> bool:
        """Take the keys of ``security.keys_dir`` if its files changed; True if it did. A
        removed key verifies nothing from then on: the tokens it signed are forgotten by the
        cache of verified tokens too (cleared). A directory that does not load (no key, a
        bad file, ``signing_kid`` gone) leaves the keys in use, logged once per reason; it
        is read again at the next look."""
        try:
            seen, keys = await asyncio.to_thread(self._read_keys_if_changed)
        except (OSError, ValueError) as exc:
            if self._keys_refused != str(exc):
                self._keys_refused = str(exc)
                log.warning("security keys not reloaded, the ones in use stay: %s", exc)
            return False
        if keys is None:
            return False
        config = self.config
        self.verifier = TokenVerifier(keys.public, issuer=config.issuer, audience=config.audience)
        self.signing = keys.signing
        self._verified.clear()
        self._keys_seen, self._keys_refused = seen, None
        signing = "none" if keys.signing is None else keys.signing.kid
        log.info("security keys reloaded: verify %s, sign with %s", sorted(keys.public), signing)
        return True

    async def follow_keys(self) -> None:
        """Look at ``security.keys_dir`` every ``keys_reload_s`` until cancelled."""
        interval_s = self.config.keys_reload_s
        if not self.enabled or interval_s <= 0:
            return
        while True:
            await asyncio.sleep(interval_s)
            await self.reload_keys()

    @property
    def enabled(self) -> bool:
        return self.config.enabled

    # --- authentication --------------------------------------------------------------------

    def authenticate(self, authorization: str | None, tls_principal: str | None = None) -> str:
        """The principal of a request: the ``sub`` of its bearer token (``authorization`` is
        the header's value), else the verified client-certificate subject, else
        UnauthenticatedError. ``"anonymous"`` when security is off."""
        if not self.enabled:
            return ANONYMOUS
        try:
            if authorization:
                return self._bearer(authorization)
            if tls_principal:
                return tls_principal
            raise UnauthenticatedError(
                "authentication required: send Authorization: Bearer <token>"
            )
        except UnauthenticatedError as exc:
            if self.authn_failed is not None:
                self.authn_failed.labels(exc.code).inc()
            audit.warning(
                "audit: unauthenticated (%s)",
                exc.code,
                extra={"audit": True, "allowed": False, "reason": exc.message},
            )
            raise

    def _bearer(self, authorization: str) -> str:
        scheme, _, token = authorization.strip().partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or not token:
            raise UnauthenticatedError(
                "Authorization must be 'Bearer <token>'", code="invalid_token"
            )
        assert self.verifier is not None
        digest = hashlib.sha256(token.encode("utf-8", "replace")).digest()
        now = time.time()
        cached = self._verified.get(digest)
        if cached is not None and now < cached[1]:
            return cached[0]
        claims = self.verifier.verify(token)
        if self.config.token_cache_entries > 0 and self.config.token_cache_s > 0:
            self._verified[digest] = (
                claims.principal,
                min(now + self.config.token_cache_s, claims.expires_at_s),
            )
            self._verified.move_to_end(digest)
            while len(self._verified) > self.config.token_cache_entries:
                self._verified.popitem(last=False)
        return claims.principal

    # --- authorization ---------------------------------------------------------------------

    def authorize(
        self, principal: str, permission: Permission, resource: Resource, *, action: str
    ) -> None:
        """Nothing when ``principal`` may ``permission`` on ``resource``, else
        PermissionDeniedError naming the permission. ``action`` (``"DELETE
        /v1/topics/{ns}/{topic}"``, ``"grpc Subscribe"``) goes to the audit log."""
        if not self.enabled:
            return
        decision = decide(
            self.policy, principal, permission, resource, super_admins=self.super_admins
        )
        if decision.allowed and permission not in MANAGEMENT:
            return  # the data path: not logged when allowed
        fields = {
            "audit": True,
            "principal": principal,
            "action": action,
            "permission": permission.value,
            "resource": str(resource),
            "allowed": decision.allowed,
            "reason": decision.reason,
        }
        audit.info(
            "audit: %s %s %s on %s: %s",
            principal,
            action,
            permission.value,
            resource,
            "allowed" if decision.allowed else "denied",
            extra=fields,
        )
        if not decision.allowed:
            if self.authz_denied is not None:
                self.authz_denied.labels(permission.value).inc()
            raise PermissionDeniedError(
                f"permission {permission.value} required on {resource}: {decision.reason}",
                permission=permission.value,
                resource=str(resource),
            )

    # --- what a principal asks about itself (whoami, can): not audited, not counted ------

    def decision(self, principal: str, permission: Permission, resource: Resource) -> Decision:
        """The decision :meth:`authorize` would take, without acting on it: the console asks
        this to show only what its user may do. Everything is allowed with security off."""
        if not self.enabled:
            return Decision(True, "security off")
        return decide(self.policy, principal, permission, resource, super_admins=self.super_admins)

    def permissions(self, principal: str, resource: Resource) -> list[Permission]:
        """Every permission ``principal`` holds on ``resource``, in :class:`Permission` order."""
        return [p for p in Permission if self.decision(principal, p, resource).allowed]

    def grants(self, principal: str) -> list[tuple[Binding, list[Permission]]]:
        """The principal's own bindings, each with the permissions it grants (none with
        security off: everything is allowed, nothing is bound)."""
        if not self.enabled:
            return []
        return [(b, self.policy.permissions_of(b)) for b in self.policy.bindings_for(principal)]

    # --- the policy view: loaded before serving, then followed -----------------------------

    async def load(self) -> int:
        """Read every role and binding; return the revision read at."""
        assert self.store is not None
        snapshot = await self.store.snapshot(meta_keys.SECURITY_PREFIX)
        roles: list[Role] = []
        bindings: list[Binding] = []
        for kv in snapshot.kvs:
            try:
                if kv.key.startswith(meta_keys.SECURITY_ROLES_PREFIX):
                    roles.append(decode_model(kv, Role))
                elif kv.key.startswith(meta_keys.SECURITY_BINDINGS_PREFIX):
                    bindings.append(decode_model(kv, Binding))
            except (ValueError, MetaError) as exc:
                log.warning("security record %s ignored: %s", kv.key, exc)
        self.policy = Policy.of(roles, bindings)
        self._seen_revision = snapshot.revision
        return snapshot.revision

    def apply(self, event: WatchEvent, *, watched: bool = True) -> None:
        """One change of ``security/``: a role or binding put or deleted. ``watched``: it
        came from the watch (where a resumed watch starts); a write of this instance applied
        at once is not, so a broken watch never skips another instance's earlier change."""
        if watched:
            self._seen_revision = max(self._seen_revision, event.mod_revision)
        key = event.key
        if key.startswith(meta_keys.SECURITY_ROLES_PREFIX):
            name = key[len(meta_keys.SECURITY_ROLES_PREFIX) :]
            if event.kind == "delete":
                self.policy.delete_role(name)
            else:
                self.policy.put_role(Role.model_validate_json(event.value))
        elif key.startswith(meta_keys.SECURITY_BINDINGS_PREFIX):
            binding_id = key[len(meta_keys.SECURITY_BINDINGS_PREFIX) :]
            if event.kind == "delete":
                self.policy.delete_binding(binding_id)
            else:
                self.policy.put_binding(Binding.model_validate_json(event.value))

    async def follow(self, revision: int) -> None:
        """Keep the policy current until cancelled; a broken watch is followed by a fresh
        read of the whole prefix, so no change is missed."""
        assert self.store is not None
        failures = 0
        while True:
            revision = max(revision, self._seen_revision)
            try:
                async with self.store.watch_prefix(
                    meta_keys.SECURITY_PREFIX, start_revision=revision + 1
                ) as events:
                    async for event in events:
                        failures = 0
                        try:
                            self.apply(event)
                        except (ValueError, MetaError) as exc:
                            log.warning("security watch: %s: %s", event.key, exc)
            except MetaError as exc:
                log.warning("security watch broke: %s", exc)
            failures += 1
            await asyncio.sleep(backoff_s(failures - 1, base_s=_RETRY_BASE_S, cap_s=_RETRY_CAP_S))
            with contextlib.suppress(MetaError):
                revision = await self.load()

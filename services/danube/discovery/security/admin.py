"""Roles, bindings and API keys in etcd (``security/...``), and the exchange of an API key
for a token. Writes go to etcd and then to this instance's policy at once (the watch
brings them to the other instances)."""

from __future__ import annotations

import time

from danube.discovery.errors import BadRequestError, ConflictError, NotFoundError
from danube.meta import MetaStore, WatchEvent, decode_model, encode_model
from danube.meta import keys as meta_keys
from danube.names import InvalidNameError, TopicName, validate_segment
from danube.security import Binding, Resource, Role, UnauthenticatedError, issue_token
from danube.security.apikeys import ApiKeyRecord, check_secret, new_api_key, parse_api_key
from danube.security.gate import SecurityGate

API_KEYS_MAX = 10_000
# Reads and transactions a role delete makes while bindings keep being written meanwhile.
_WRITE_ATTEMPTS = 5


def _now_ms() -> int:
    return int(time.time() * 1000)


def binding_resource(scope: str, resource: str) -> str:
    """The stored resource name of a binding: "" for the cluster, the namespace, or the
    topic ``/<ns>/<topic>`` (never a partition); BadRequestError otherwise."""
    try:
        if scope == "cluster":
            if resource:
                raise BadRequestError("a cluster binding names no resource", code="bad_request")
            return ""
        if scope == "namespace":
            return validate_segment("namespace", resource)
        topic = TopicName.parse(resource)
    except InvalidNameError as exc:
        raise BadRequestError(exc.message, code="invalid_name") from exc
    if topic.partition is not None:
        raise BadRequestError("bind a topic, not one of its partitions", code="bad_request")
    return Resource.topic(topic).name


class SecurityAdmin:
    """What the ``/v1/security`` and ``/v1/auth`` routes do."""

    def __init__(self, store: MetaStore, gate: SecurityGate) -> None:
        self.store = store
        self.gate = gate

    def _applied(self, key: str, value: bytes | None, revision: int) -> None:
        if value is None:
            self.gate.apply(WatchEvent("delete", key, b"", revision, 0, 0), watched=False)
        else:
            self.gate.apply(WatchEvent("put", key, value, revision, revision, 0), watched=False)

    # --- roles -----------------------------------------------------------------------------

    async def roles(self) -> list[Role]:
        kvs = await self.store.range_models(meta_keys.SECURITY_ROLES_PREFIX, Role)
        return [role for _, role in kvs]

    async def role(self, name: str) -> Role:
        role = await self.store.get_model(meta_keys.role_key(name), Role)
        if role is None:
            raise NotFoundError(f"no role {name!r}", code="role_not_found")
        return role

    async def put_role(self, role: Role) -> tuple[Role, bool]:
        """Create or replace; True when created."""
        key = meta_keys.role_key(role.name)
        old = await self.store.get_model(key, Role)
        if old is not None:
            role = role.model_copy(update={"created_ms": old.created_ms})
        else:
            role = role.model_copy(update={"created_ms": _now_ms()})
        value = encode_model(role)
        revision = await self.store.put(key, value)
        self._applied(key, value, revision)
        return role, old is None

    async def delete_role(self, name: str) -> None:
        """Delete a role no binding names (409 ``role_in_use`` otherwise).

        One transaction: the role goes only if no binding was written since the bindings
        were read, so a binding naming it cannot be stored in between (put_binding checks
        its roles in its own transaction); a binding written meanwhile makes it read again."""
        key = meta_keys.role_key(name)
        prefix = meta_keys.SECURITY_BINDINGS_PREFIX
        for _ in range(_WRITE_ATTEMPTS):
            read = await self.store.snapshot(prefix)
            users = [
                binding.id
                for binding in (decode_model(kv, Binding) for kv in read.kvs)
                if name in binding.roles
            ]
            if users:
                raise ConflictError(
                    f"role {name!r} is used by bindings {', '.join(users[:10])}",
                    code="role_in_use",
                )
            txn = self.store.txn().if_present(key).if_prefix_unchanged_since(prefix, read.revision)
            result = await txn.then_delete(key).else_get(key).commit()
            if result.succeeded:
                self._applied(key, None, 0)
                return
            if result.first_kv() is None:
                raise NotFoundError(f"no role {name!r}", code="role_not_found")
        raise ConflictError(
            f"the bindings changed while role {name!r} was being deleted; retry",
            code="conflict",
        )

    # --- bindings --------------------------------------------------------------------------

    async def bindings(self) -> list[Binding]:
        kvs = await self.store.range_models(meta_keys.SECURITY_BINDINGS_PREFIX, Binding)
        return [binding for _, binding in kvs]

    async def binding(self, binding_id: str) -> Binding:
        binding = await self.store.get_model(meta_keys.binding_key(binding_id), Binding)
        if binding is None:
            raise NotFoundError(f"no binding {binding_id!r}", code="binding_not_found")
        return binding

    async def put_binding(self, binding: Binding) -> tuple[Binding, bool]:
        """Create or replace; 400 ``unknown_role`` when a role it names does not exist (at
        the write itself: one transaction with the roles' presence, see delete_role)."""
        resource = binding_resource(binding.scope, binding.resource)
        await self._check_roles(binding.roles)
        key = meta_keys.binding_key(binding.id)
        old = await self.store.get_model(key, Binding)
        created_ms = _now_ms() if old is None else old.created_ms
        binding = binding.model_copy(update={"resource": resource, "created_ms": created_ms})
        value = encode_model(binding)
        txn = self.store.txn()
        for name in binding.roles:
            txn.if_present(meta_keys.role_key(name))
        result = await txn.then_put(key, value).commit()
        if not result.succeeded:  # a role was deleted since the check: name it
            await self._check_roles(binding.roles)
            raise BadRequestError("a role of the binding was deleted", code="unknown_role")
        self._applied(key, value, result.revision)
        return binding, old is None

    async def _check_roles(self, names: list[str]) -> None:
        for name in names:
            if await self.store.get(meta_keys.role_key(name)) is None:
                raise BadRequestError(f"no role {name!r}", code="unknown_role")

    async def delete_binding(self, binding_id: str) -> None:
        key = meta_keys.binding_key(binding_id)
        if not await self.store.delete(key):
            raise NotFoundError(f"no binding {binding_id!r}", code="binding_not_found")
        self._applied(key, None, 0)

    # --- API keys --------------------------------------------------------------------------

    async def api_keys(self) -> list[ApiKeyRecord]:
        kvs = await self.store.range_models(
            meta_keys.SECURITY_API_KEYS_PREFIX, ApiKeyRecord, limit=API_KEYS_MAX
        )
        return [record for _, record in kvs]

    async def create_api_key(
        self, principal: str, *, description: str, expires_s: int | None
    ) -> tuple[ApiKeyRecord, str]:
        """A new key for ``principal``: its record and the key (shown this once)."""
        key_id, api_key, digest = new_api_key()
        now = _now_ms()
        record = ApiKeyRecord(
            id=key_id,
            principal=principal,
            secret_sha256=digest,
            created_ms=now,
            expires_ms=None if expires_s is None else now + expires_s * 1000,
            description=description,
        )
        await self.store.create_model(meta_keys.api_key_key(key_id), record)
        return record, api_key

    async def revoke_api_key(self, key_id: str) -> None:
        if not await self.store.delete(meta_keys.api_key_key(key_id)):
            raise NotFoundError(f"no API key {key_id!r}", code="api_key_not_found")

    async def exchange(self, api_key: str, ttl_s: int | None) -> tuple[str, str, int]:
        """``(token, principal, expires_ms)`` for a valid API key; 401 otherwise."""
        gate = self.gate
        if not gate.enabled or gate.signing is None:
            raise BadRequestError(
                "token exchange needs security enabled with a private key in security.keys_dir",
                code="security_disabled",
            )
        key_id, secret = parse_api_key(api_key)
        record = await self.store.get_model(meta_keys.api_key_key(key_id), ApiKeyRecord)
        if record is None:
            raise UnauthenticatedError("unknown or revoked API key", code="invalid_api_key")
        now_s = time.time()
        check_secret(record, secret, now_ms=int(now_s * 1000))
        config = gate.config
        ttl = min(ttl_s or config.token_ttl_s, config.token_max_ttl_s)
        if record.expires_ms is not None:  # a token never outlives its key
            ttl = min(ttl, max(1, int(record.expires_ms / 1000 - now_s)))
        token = issue_token(
            gate.signing,
            record.principal,
            ttl,
            issuer=config.issuer,
            audience=config.audience,
            now_s=now_s,
        )
        return token, record.principal, int((int(now_s) + ttl) * 1000)

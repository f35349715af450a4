"""Roles and bindings written by concurrent requests (two discovery instances, say): a role
is never deleted while a binding names it, and a binding is never stored naming a deleted
role. Each race is forced at its worst moment against a real etcd: the other request's
write lands between this one's read and its write."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import pytest

from danube.config import SecurityConfig
from danube.discovery.errors import BadRequestError, ConflictError, NotFoundError
from danube.discovery.security.admin import SecurityAdmin
from danube.meta import MetaStore, RangeResult, encode_model
from danube.meta import keys as meta_keys
from danube.security import Binding, Role
from danube.security.gate import SecurityGate

pytestmark = pytest.mark.integration


def _admin(store: MetaStore) -> SecurityAdmin:
    return SecurityAdmin(store, SecurityGate(SecurityConfig(), store=store))


def _binding(binding_id: str, role: str) -> Binding:
    return Binding(id=binding_id, principal="app", roles=[role], scope="cluster")


def _after_snapshot(store: MetaStore, meanwhile: Callable[[], Awaitable[object]]) -> list[int]:
    """Make the store's next reads of the bindings run ``meanwhile`` once, right after the
    read (the other request's write, between this one's read and its transaction); the
    list counts the reads."""
    reads: list[int] = []
    real = store.snapshot

    async def snapshot(prefix: str, **kwargs: object) -> RangeResult:
        result = await real(prefix, **kwargs)  # type: ignore[arg-type]
        if prefix == meta_keys.SECURITY_BINDINGS_PREFIX:
            reads.append(result.revision)
            if len(reads) == 1:
                await meanwhile()
        return result

    store.snapshot = snapshot  # type: ignore[method-assign]
    return reads


async def test_a_binding_written_during_a_role_delete_keeps_the_role(store: MetaStore) -> None:
    admin = _admin(store)
    await admin.put_role(Role(name="producer", permissions=["Produce"]))
    binding = _binding("orders", "producer")

    async def bind() -> None:  # another instance, whose role check passed before the delete
        await store.put(meta_keys.binding_key("orders"), encode_model(binding))

    reads = _after_snapshot(store, bind)
    with pytest.raises(ConflictError) as raised:
        await admin.delete_role("producer")
    assert raised.value.code == "role_in_use"
    assert len(reads) == 2  # the transaction failed and the bindings were read again
    assert (await admin.role("producer")).name == "producer"
    assert [b.id for b in await admin.bindings()] == ["orders"]


async def test_an_unrelated_binding_written_meanwhile_only_costs_a_read(store: MetaStore) -> None:
    admin = _admin(store)
    await admin.put_role(Role(name="old", permissions=["Lookup"]))
    await admin.put_role(Role(name="other", permissions=["Lookup"]))

    async def bind_other() -> None:
        await store.put(meta_keys.binding_key("b"), encode_model(_binding("b", "other")))

    reads = _after_snapshot(store, bind_other)
    await admin.delete_role("old")
    assert len(reads) == 2
    assert await store.get(meta_keys.role_key("old")) is None
    assert await store.get(meta_keys.role_key("other")) is not None


async def test_a_role_deleted_during_a_binding_write_refuses_the_binding(
    store: MetaStore,
) -> None:
    admin = _admin(store)
    await admin.put_role(Role(name="producer", permissions=["Produce"]))
    real_get = store.get
    checked: list[str] = []

    async def get(key: str) -> object:
        found = await real_get(key)
        if key == meta_keys.role_key("producer") and not checked:
            checked.append(key)
            await store.delete(key)  # another instance deletes it right after the check
        return found

    store.get = get  # type: ignore[method-assign, assignment]
    with pytest.raises(BadRequestError) as raised:
        await admin.put_binding(_binding("orders", "producer"))
    assert raised.value.code == "unknown_role"
    assert checked  # the check itself had passed: the transaction refused the write
    assert await real_get(meta_keys.binding_key("orders")) is None


async def test_deleting_a_missing_role_is_not_found(store: MetaStore) -> None:
    admin = _admin(store)
    with pytest.raises(NotFoundError) as raised:
        await admin.delete_role("nobody")
    assert raised.value.code == "role_not_found"

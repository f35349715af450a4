"""Token keys rotated without a restart (docs/security.md, "Rotating keys without a
restart"): a discovery's gate takes the keys of ``security.keys_dir`` when its files change,
drops a removed key at once (tokens it signed, cached ones included, are refused), and keeps
the keys in use when the directory does not load."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from danube.config import SecurityConfig
from danube.meta import MetaStore
from danube.security import UnauthenticatedError, generate_key, issue_token
from danube.security.gate import SecurityGate
from danube.security.tokens import SigningKey, public_pem

pytestmark = pytest.mark.integration


def _token(key: SigningKey, principal: str = "app") -> str:
    return issue_token(key, principal, 600, issuer="danube", audience="danube")


def _gate(keys: Path, store: MetaStore, reload_s: float = 10.0) -> SecurityGate:
    config = SecurityConfig(enabled=True, keys_dir=keys, keys_reload_s=reload_s)
    return SecurityGate.from_config(config, store)


async def test_a_key_added_verifies_and_a_key_removed_is_refused(
    tmp_path: Path, store: MetaStore
) -> None:
    keys = tmp_path / "keys"
    old = generate_key(keys, "k1")
    gate = _gate(keys, store)
    old_token = _token(old)
    assert gate.authenticate(f"Bearer {old_token}") == "app"  # verified, and now cached

    new = generate_key(tmp_path / "elsewhere", "k2")
    new_token = _token(new)
    with pytest.raises(UnauthenticatedError):
        gate.authenticate(f"Bearer {new_token}")
    assert await gate.reload_keys() is False  # nothing changed in keys_dir yet

    (keys / "k2.pub.pem").write_bytes(public_pem(new))
    assert await gate.reload_keys() is True
    assert gate.authenticate(f"Bearer {new_token}") == "app"
    assert gate.signing is not None
    assert gate.signing.kid == "k1"  # the only private key

    (keys / "k1.pem").unlink()
    assert await gate.reload_keys() is True
    with pytest.raises(UnauthenticatedError):  # cached before, refused now
        gate.authenticate(f"Bearer {old_token}")
    assert gate.authenticate(f"Bearer {new_token}") == "app"
    assert gate.signing is None  # no private key left: this instance issues no token


async def test_a_directory_that_does_not_load_keeps_the_keys_in_use(
    tmp_path: Path, store: MetaStore, caplog: pytest.LogCaptureFixture
) -> None:
    keys = tmp_path / "keys"
    key = generate_key(keys, "k1")
    gate = _gate(keys, store)
    token = _token(key)
    (keys / "k2.pem").write_bytes(b"-----BEGIN PRIVATE KEY-----\nhalf")  # a copy under way
    for _ in range(3):
        assert await gate.reload_keys() is False
    assert gate.authenticate(f"Bearer {token}") == "app"
    refusals = [r for r in caplog.records if "not reloaded" in r.getMessage()]
    assert len(refusals) == 1  # once per state of the directory, not at every look

    (keys / "k2.pem").unlink()  # back as it was: nothing to take (the same files)
    assert await gate.reload_keys() is False
    assert gate.authenticate(f"Bearer {token}") == "app"


async def test_the_gate_looks_every_keys_reload_s(tmp_path: Path, store: MetaStore) -> None:
    keys = tmp_path / "keys"
    generate_key(keys, "k1")
    gate = _gate(keys, store, reload_s=0.05)
    new = generate_key(tmp_path / "elsewhere", "k2")
    staged = tmp_path / "k2.pub.pem"  # beside keys_dir, on the same file system
    staged.write_bytes(public_pem(new))
    following = asyncio.create_task(gate.follow_keys())
    try:
        os.rename(staged, keys / "k2.pub.pem")  # written elsewhere, renamed in: one step
        async with asyncio.timeout(10):
            while True:
                try:
                    assert gate.authenticate(f"Bearer {_token(new)}") == "app"
                    break
                except UnauthenticatedError:
                    await asyncio.sleep(0.02)
    finally:
        following.cancel()


async def test_zero_reads_the_keys_at_start_only(tmp_path: Path, store: MetaStore) -> None:
    keys = tmp_path / "keys"
    generate_key(keys, "k1")
    gate = _gate(keys, store, reload_s=0)
    await asyncio.wait_for(gate.follow_keys(), 1)  # returns at once: nothing to follow

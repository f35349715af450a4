"""etcd with authentication as ``danube up --secure`` sets it up: anonymous and wrong logins
refused, the mesh user confined to the metadata prefix, a restart of etcd survived."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import pytest

from danube.config import MetadataConfig
from danube.meta import MetaAuthError, MetaStore
from danube.runtime import ServerProcess, etcd_spec, free_port
from danube.runtime.secure import (
    ETCD_MESH_USER,
    ETCD_ROOT_USER,
    MeshCredentials,
    enable_etcd_auth,
    ensure_credentials,
)

pytestmark = pytest.mark.integration

PREFIX = "/danube"


@pytest.fixture
def credentials(tmp_path: Path) -> MeshCredentials:
    return ensure_credentials(tmp_path / "data")


@pytest.fixture
def etcd(tmp_path: Path) -> Iterator[ServerProcess]:
    """An etcd of this test's own: turning auth on must not touch the session's."""
    spec = etcd_spec(data_dir=tmp_path / "etcd", client_port=free_port(), peer_port=free_port())
    server = ServerProcess(spec, tmp_path / "etcd.log")
    server.start()
    try:
        yield server
    finally:
        server.stop()


def endpoint(etcd: ServerProcess) -> str:
    return f"127.0.0.1:{etcd.spec.port}"


def mesh_config(etcd: ServerProcess, credentials: MeshCredentials, **kw: object) -> MetadataConfig:
    return MetadataConfig.model_validate(
        {
            "etcd_endpoint": endpoint(etcd),
            "prefix": PREFIX,
            "user": ETCD_MESH_USER,
            "password_file": credentials.etcd_mesh_password_file,
            "request_timeout_s": 3.0,
            **kw,
        }
    )


async def test_auth_on_refuses_anonymous_and_wrong_logins(
    etcd: ServerProcess, credentials: MeshCredentials
) -> None:
    anonymous = MetadataConfig(etcd_endpoint=endpoint(etcd), prefix=PREFIX, request_timeout_s=3)
    async with await MetaStore.connect(anonymous) as store:  # auth still off: all open
        await store.put("before", b"1")

    await enable_etcd_auth(endpoint(etcd), credentials, prefix=PREFIX, timeout_s=5)

    with pytest.raises(MetaAuthError) as raised:
        await MetaStore.connect(anonymous)
    assert "user name is empty" in str(raised.value)
    guess = "a-wrong-password-0123456789"
    with pytest.raises(MetaAuthError) as raised:
        await MetaStore.connect(mesh_config(etcd, credentials, password_file=None, password=guess))
    assert "authentication failed" in str(raised.value)
    assert guess not in str(raised.value)

    async with await MetaStore.connect(mesh_config(etcd, credentials)) as store:
        assert (await store.get("before")) is not None
        await store.put("after", b"2")
        lease = await store.grant_lease(5)
        await store.put("leased", b"3", lease=lease)
        assert [kv.key for kv in await store.range("")] == ["after", "before", "leased"]
        await lease.revoke()


async def test_mesh_user_is_confined_to_the_prefix(
    etcd: ServerProcess, credentials: MeshCredentials
) -> None:
    await enable_etcd_auth(endpoint(etcd), credentials, prefix=PREFIX, timeout_s=5)
    outside = mesh_config(etcd, credentials, prefix="/elsewhere")
    async with await MetaStore.connect(mesh_config(etcd, credentials)) as inside:
        await inside.put("k", b"v")
    with pytest.raises(MetaAuthError) as raised:
        await MetaStore.connect(outside)  # its ping reads /elsewhere/
    assert "permission denied" in str(raised.value)
    root = mesh_config(
        etcd,
        credentials,
        user=ETCD_ROOT_USER,
        password_file=credentials.etcd_root_password_file,
        prefix="/elsewhere",
    )
    async with await MetaStore.connect(root) as store:  # root reaches everything
        await store.put("k", b"v")


async def test_setup_again_and_etcd_restart_keep_the_mesh_logged_in(
    etcd: ServerProcess, credentials: MeshCredentials, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="danube.meta.client")
    await enable_etcd_auth(endpoint(etcd), credentials, prefix=PREFIX, timeout_s=5)
    # A second `danube up --secure` on the same data: auth is on, setup runs as root.
    await enable_etcd_auth(endpoint(etcd), credentials, prefix=PREFIX, timeout_s=5)
    async with await MetaStore.connect(mesh_config(etcd, credentials)) as store:
        await store.put("k", b"1")
        # etcd forgets its (simple) tokens when it restarts: the client logs in again.
        etcd.stop()
        etcd.start()
        await store.put("k", b"2")
        found = await store.get("k")
        assert found is not None
        assert found.value == b"2"
    assert "auth token is no longer valid; logging in again" in caplog.text

"""etcd with authentication as ``danube up --secure`` sets it up: anonymous and wrong logins
refused, the mesh user confined to the metadata prefix, a restart of etcd survived; and the
client over (mutual) TLS."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import pytest

from danube.config import MetadataConfig
from danube.meta import MetaAuthError, MetaError, MetaStore
from danube.up import ServerProcess, etcd_spec, free_port
from danube.up.secure import (
    ETCD_MESH_USER,
    ETCD_ROOT_USER,
    MeshCredentials,
    enable_etcd_auth,
    ensure_credentials,
)
from danube.up.servers import ServerTls

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


def _write_pki(directory: Path) -> tuple[Path, Path, Path, Path, Path]:
    """A test CA, a server certificate for 127.0.0.1 and a client certificate, as PEM files:
    (ca, server cert, server key, client cert, client key)."""
    import datetime
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    now = datetime.datetime.now(datetime.UTC)

    def name(cn: str) -> x509.Name:
        return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])

    def builder(
        subject: str, issuer: str, key: ec.EllipticCurvePrivateKey
    ) -> x509.CertificateBuilder:
        return (
            x509.CertificateBuilder()
            .subject_name(name(subject))
            .issuer_name(name(issuer))
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
        )

    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = (
        builder("danube test ca", "danube test ca", ca_key)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    paths = []
    for subject, usage in (("etcd", "server"), ("danube-mesh", "client")):
        key = ec.generate_private_key(ec.SECP256R1())
        eku = (
            ExtendedKeyUsageOID.SERVER_AUTH
            if usage == "server"
            else (ExtendedKeyUsageOID.CLIENT_AUTH)
        )
        cert = (
            builder(subject, "danube test ca", key)
            .add_extension(
                x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                critical=False,
            )
            .add_extension(x509.ExtendedKeyUsage([eku]), critical=False)
            .sign(ca_key, hashes.SHA256())
        )
        cert_path, key_path = directory / f"{subject}.pem", directory / f"{subject}-key.pem"
        cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        key_path.write_bytes(
            key.private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.PKCS8,
                serialization.NoEncryption(),
            )
        )
        paths += [cert_path, key_path]
    ca_path = directory / "ca.pem"
    ca_path.write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    return ca_path, paths[0], paths[1], paths[2], paths[3]


async def test_etcd_over_mutual_tls_with_a_login(
    tmp_path: Path, credentials: MeshCredentials
) -> None:
    ca, server_cert, server_key, client_cert, client_key = _write_pki(tmp_path)
    tls = ServerTls(cert_file=server_cert, key_file=server_key, client_ca_file=ca)
    port = free_port()
    spec = etcd_spec(data_dir=tmp_path / "etcd", client_port=port, peer_port=free_port(), tls=tls)
    with ServerProcess(spec, tmp_path / "etcd.log"):
        address = f"127.0.0.1:{port}"
        secured = {"ca_file": ca, "cert_file": client_cert, "key_file": client_key}
        async with await MetaStore.connect(
            MetadataConfig.model_validate({"etcd_endpoint": address, **secured})
        ) as store:
            await store.put("over-tls", b"1")
        plain = MetadataConfig(etcd_endpoint=address, request_timeout_s=2)
        with pytest.raises(MetaError):  # a plain-text client gets nowhere
            await MetaStore.connect(plain)
        no_client_cert = MetadataConfig(etcd_endpoint=address, ca_file=ca, request_timeout_s=2)
        with pytest.raises(MetaError):  # mutual TLS: no certificate, no connection
            await MetaStore.connect(no_client_cert)


def test_the_etcd_setup_command_turns_auth_on_once_and_again(
    etcd: ServerProcess, tmp_path: Path
) -> None:
    """`danube admin security init` then `etcd-setup` (what compose and Kubernetes run):
    anonymous refused, the mesh user in; a second run (auth on already) succeeds too."""
    import asyncio

    from typer.testing import CliRunner

    from danube.cli.main import app

    directory = tmp_path / "secure"
    runner = CliRunner()
    made = runner.invoke(app, ["admin", "security", "init", "--dir", str(directory)], env={})
    assert made.exit_code == 0, made.output
    setup = ["admin", "security", "etcd-setup", "--dir", str(directory)]
    env = {"DANUBE_WAL_CLOUD__METADATA__ETCD_ENDPOINT": endpoint(etcd)}
    for _ in range(2):
        result = runner.invoke(app, setup, env=env)
        assert result.exit_code == 0, result.output
        assert f"etcd {endpoint(etcd)}: auth on" in result.output

    async def check() -> None:
        anonymous = MetadataConfig(etcd_endpoint=endpoint(etcd), request_timeout_s=3)
        with pytest.raises(MetaAuthError):
            await MetaStore.connect(anonymous)
        credentials = MeshCredentials(directory)
        async with await MetaStore.connect(mesh_config(etcd, credentials)) as store:
            await store.put("k", b"v")

    asyncio.run(check())

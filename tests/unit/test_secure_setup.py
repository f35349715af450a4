"""`danube admin security init`: the files of a secured deployment, their modes, the names in
the server certificate, the same layout and settings as `danube up --secure`, and a second
run that changes nothing but the admin token."""

from __future__ import annotations

import json
import stat
from pathlib import Path

import jwt
import pytest
from cryptography import x509
from typer.testing import CliRunner

from danube.bus.permissions import KIND_PERMISSIONS
from danube.cli.main import app
from danube.config import load_settings
from danube.security import generate_key, load_keys, write_public_keys
from danube.security.tokens import TokenVerifier
from danube.up.secure import (
    SECURE_DIR_NAME,
    SecureFiles,
    ensure_secure_files,
    prepare_secure_mesh,
    service_environment,
)

pytestmark = pytest.mark.unit

HOSTS = ("discovery", "discovery.danube.svc.cluster.local", "10.0.0.7")


def init(directory: Path, *args: str) -> None:
    hosts = [arg for host in HOSTS for arg in ("--host", host)]
    result = CliRunner().invoke(
        app, ["admin", "security", "init", "--dir", str(directory), *hosts, *args], env={}
    )
    assert result.exit_code == 0, result.output


def snapshot(directory: Path) -> dict[str, tuple[bytes, int]]:
    """Every file under ``directory``: its bytes and permission bits."""
    return {
        str(path.relative_to(directory)): (path.read_bytes(), stat.S_IMODE(path.stat().st_mode))
        for path in sorted(directory.rglob("*"))
        if path.is_file()
    }


def test_init_lays_out_every_file_private(tmp_path: Path) -> None:
    directory = tmp_path / "secure"
    init(directory)
    assert stat.S_IMODE(directory.stat().st_mode) == 0o700
    files = snapshot(directory)
    secrets = [
        *(f"nats-{kind}.password" for kind in KIND_PERMISSIONS),
        "etcd-root.password",
        "etcd-mesh.password",
        "nats.conf",
        "admin.token",
        "pki/ca-key.pem",
        "pki/server-key.pem",
        "pki/clients/admin-key.pem",
    ]
    for name in secrets:
        assert files[name][1] == 0o600, name
    (signing,) = [name for name in files if name.startswith("keys/")]
    assert files[signing][1] == 0o600
    assert stat.S_IMODE((directory / "keys").stat().st_mode) == 0o700
    for name in ("pki/ca.pem", "pki/server.pem", "pki/clients/admin.pem"):
        assert name in files, name  # certificates: public, readable
    passwords = {files[name][0] for name in secrets if name.endswith(".password")}
    assert len(passwords) == len(KIND_PERMISSIONS) + 2  # each its own
    # nats.conf: one user per service kind, each with its own file's password.
    users = json.loads(files["nats.conf"][0])["authorization"]["users"]
    by_user = {user["user"]: user["password"] for user in users}
    assert set(by_user) == set(KIND_PERMISSIONS)
    for kind, password in by_user.items():
        assert files[f"nats-{kind}.password"][0].decode().strip() == password


def test_the_server_certificate_covers_loopback_and_the_names_asked_for(tmp_path: Path) -> None:
    init(tmp_path / "secure")
    cert = x509.load_pem_x509_certificate((tmp_path / "secure/pki/server.pem").read_bytes())
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    names = set(san.get_values_for_type(x509.DNSName))
    addresses = {str(ip) for ip in san.get_values_for_type(x509.IPAddress)}
    assert {"localhost", "discovery", "discovery.danube.svc.cluster.local"} <= names
    assert {"127.0.0.1", "::1", "10.0.0.7"} <= addresses
    ca = x509.load_pem_x509_certificate((tmp_path / "secure/pki/ca.pem").read_bytes())
    cert.verify_directly_issued_by(ca)


def test_a_second_run_changes_nothing_but_the_admin_token(tmp_path: Path) -> None:
    directory = tmp_path / "secure"
    init(directory)
    first = snapshot(directory)
    init(directory)
    second = snapshot(directory)
    assert set(first) == set(second)
    changed = {name for name in first if first[name] != second[name]}
    assert changed == {"admin.token"}
    # Both tokens are the admin's, signed by the one key the directory keeps.
    keys = load_keys(directory / "keys")
    verifier = TokenVerifier(dict(keys.public), issuer="danube", audience="danube")
    for snap in (first, second):
        assert verifier.verify(snap["admin.token"][0].decode().strip()).principal == "admin"
    # A new host name re-issues the server certificate only (same CA, same secrets).
    hosts = [arg for host in HOSTS for arg in ("--host", host)]
    result = CliRunner().invoke(
        app,
        ["admin", "security", "init", "--dir", str(directory), *hosts, "--host", "api.example"],
        env={},
    )
    assert result.exit_code == 0, result.output
    third = snapshot(directory)
    changed = {name for name in first if first[name] != third[name]}
    assert changed == {"admin.token", "pki/server.pem", "pki/server-key.pem"}


def test_init_and_up_secure_share_the_layout_and_the_settings(tmp_path: Path) -> None:
    """`danube up --secure` lays out <data dir>/secure exactly as init does, and gives each
    service the settings :func:`service_environment` derives from those files."""
    settings = load_settings(None, environ={})
    secured = prepare_secure_mesh(settings, tmp_path / "data")
    init(tmp_path / "init")
    made_by_up = set(snapshot(tmp_path / "data" / SECURE_DIR_NAME))
    made_by_init = set(snapshot(tmp_path / "init"))

    def keyless(names: set[str]) -> set[str]:  # each made its own key: a new id
        return {name for name in names if not name.startswith(("keys/", "verify-keys/"))}

    assert keyless(made_by_up) == keyless(made_by_init)
    assert {name.split("/")[0] for name in made_by_up - keyless(made_by_up)} == {
        "keys",
        "verify-keys",
    }
    files = SecureFiles(
        credentials=secured.credentials,
        nats_config=secured.nats_config,
        pki=secured.pki,
        keys_dir=secured.credentials.dir / "keys",
        verify_keys_dir=secured.credentials.dir / "verify-keys",
        admin_token_file=secured.admin_token_file,
    )
    for kind in KIND_PERMISSIONS:
        assert secured.env_for(kind) == service_environment(files, kind), kind
        child = load_settings(None, environ=service_environment(files, kind))
        assert child.bus.user == kind
        section = getattr(child, kind)
        assert section.tls.cert_file == secured.pki.server.cert
    discovery = load_settings(None, environ=secured.env_for("discovery"))
    assert discovery.security.enabled
    assert discovery.security.super_admins == ["admin"]
    assert discovery.security.keys_dir == files.keys_dir
    for kind in ("ingest", "dispatcher"):  # they verify tokens: the public halves only
        verifying = load_settings(None, environ=secured.env_for(kind))
        assert verifying.security.enabled
        assert verifying.security.keys_dir == files.verify_keys_dir


def test_the_verifying_kinds_get_public_keys_that_verify_and_never_sign(tmp_path: Path) -> None:
    directory = tmp_path / "secure"
    init(directory, "--signing-kid", "dev")
    verify = directory / "verify-keys"
    assert [path.name for path in verify.iterdir()] == ["dev.pub.pem"]
    assert b"PRIVATE" not in (verify / "dev.pub.pem").read_bytes()
    public = load_keys(verify)
    assert public.signing is None
    token = (directory / "admin.token").read_text().strip()
    verifier = TokenVerifier(dict(public.public), issuer="danube", audience="danube")
    assert verifier.verify(token).principal == "admin"
    # A key added where the signing keys are shows up beside it; a key removed goes.
    generate_key(directory / "keys", "k2")
    assert write_public_keys(directory / "keys", verify) == ["dev", "k2"]
    assert sorted(path.name for path in verify.iterdir()) == ["dev.pub.pem", "k2.pub.pem"]
    (directory / "keys" / "dev.pem").unlink()
    assert write_public_keys(directory / "keys", verify) == ["k2"]
    assert [path.name for path in verify.iterdir()] == ["k2.pub.pem"]


def test_init_uses_the_configured_subject_prefix(tmp_path: Path) -> None:
    files = ensure_secure_files(
        tmp_path / "secure", subject_prefix="mesh2", issuer="i", audience="a"
    )
    rendered = files.nats_config.read_text()
    assert "mesh2.produce.>" in rendered
    assert "danube.produce.>" not in rendered


def test_etcd_setup_refuses_a_directory_init_did_not_make(tmp_path: Path) -> None:
    result = CliRunner().invoke(
        app,
        ["admin", "security", "etcd-setup", "--dir", str(tmp_path), "--endpoint", "127.0.0.1:1"],
        env={},
    )
    assert result.exit_code == 2
    assert "run `init` first" in result.output


def test_a_fixed_signing_key_id_names_the_key_file_and_the_tokens(tmp_path: Path) -> None:
    directory = tmp_path / "secure"
    init(directory, "--signing-kid", "dev")
    assert [path.name for path in (directory / "keys").iterdir()] == ["dev.pem"]
    token = (directory / "admin.token").read_text().strip()
    assert jwt.get_unverified_header(token)["kid"] == "dev"
    init(directory, "--signing-kid", "other")  # a key exists: kept, not replaced
    assert [path.name for path in (directory / "keys").iterdir()] == ["dev.pem"]
    bad = CliRunner().invoke(
        app,
        ["admin", "security", "init", "--dir", str(tmp_path / "b"), "--signing-kid", "a/b"],
        env={},
    )
    assert bad.exit_code == 1
    assert "key id must be" in bad.output

"""Security inside the mesh, without servers: the bus permission table and the nats-server
config built from it, the credentials keys of bus/metadata, and the --secure mesh plan."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from danube.bus.permissions import KIND_PERMISSIONS, bus_permissions, inbox_prefix
from danube.bus.subjects import Kind
from danube.config import BusConfig, ConfigError, MetadataConfig, load_settings
from danube.config.secrets import read_password
from danube.meta.keys import SERVICE_KINDS
from danube.up.mesh import plan_mesh
from danube.up.secure import prepare_secure_mesh

pytestmark = pytest.mark.unit


def test_every_service_kind_has_a_row_and_every_subject_kind_a_server_and_a_caller() -> None:
    assert set(KIND_PERMISSIONS) == set(SERVICE_KINDS)
    published = set().union(*(row.publish for row in KIND_PERMISSIONS.values()))
    subscribed = set().union(*(row.subscribe for row in KIND_PERMISSIONS.values()))
    # Each subject someone sends to is served by someone, and the other way round.
    assert published == subscribed == set(Kind)


def test_permissions_follow_the_subject_prefix_and_keep_inboxes_private() -> None:
    ingest = bus_permissions("ingest", user="ingest", subject_prefix="mesh2")
    assert "mesh2.live.>" in ingest.publish
    assert "mesh2.produce.>" in ingest.subscribe
    assert "mesh2.disp.>" not in ingest.subscribe  # the dispatcher's
    assert ingest.subscribe[-1] == f"{inbox_prefix('ingest')}.>" == "_INBOX.ingest.>"
    assert all(not pattern.startswith("_INBOX") for pattern in ingest.publish)
    cloud = bus_permissions("cloud_reader", user="cloud_reader", subject_prefix="danube")
    # Publishes nothing of its own, answers requests only (allow_responses).
    assert cloud.to_nats()["publish"] == {"deny": [">"]}
    assert cloud.to_nats()["allow_responses"] is True


def test_bus_and_metadata_credentials_are_validated_and_never_printed(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="go together"):
        BusConfig(user="ingest")
    with pytest.raises(ValueError, match="go together"):
        MetadataConfig(password="x" * 20)
    with pytest.raises(ValueError, match="not both"):
        BusConfig(user="ingest", password="x" * 20, password_file=tmp_path / "p")
    with pytest.raises(ValueError, match="cert_file and key_file"):
        MetadataConfig(ca_file=tmp_path / "ca", cert_file=tmp_path / "c")
    secret = "s3cr3t-value-that-must-not-show"
    config = BusConfig(user="ingest", password=secret)
    assert secret not in repr(config)
    assert secret not in str(config.model_dump())
    assert read_password(config.password, None, key="bus") == secret
    # From the environment, as an operator gives it; a bad value elsewhere in the section
    # is reported without echoing the password.
    env = {"DANUBE_BUS__USER": "ingest", "DANUBE_BUS__PASSWORD": secret}
    assert load_settings(None, environ=env).bus.password is not None
    bad = {**env, "DANUBE_BUS__USER": "bad user!"}
    with pytest.raises(ConfigError) as raised:
        load_settings(None, environ=bad)
    assert "bus.user" in str(raised.value)
    assert secret not in str(raised.value)


def test_password_files(tmp_path: Path) -> None:
    path = tmp_path / "password"
    path.write_text("from-a-file\n")
    assert read_password(None, path, key="bus") == "from-a-file"
    path.write_text("")
    with pytest.raises(ConfigError, match=r"bus\.password_file: .* is empty"):
        read_password(None, path, key="bus")
    with pytest.raises(ConfigError, match="cannot read"):
        read_password(None, tmp_path / "missing", key="metadata")


def test_the_secure_plan_gives_each_kind_its_own_login(tmp_path: Path) -> None:
    settings = load_settings(None, environ={})
    secure = prepare_secure_mesh(settings, tmp_path / "data")
    plan = plan_mesh(
        settings,
        data_dir=tmp_path / "data",
        services=["ingest", "dispatcher"],
        secure=secure,
    )
    specs = {spec.name: spec for spec in plan.specs}
    assert list(specs["nats"].argv[-2:]) == ["-c", str(secure.nats_config)]
    assert specs["etcd"].on_first_ready is secure.etcd_setup
    for name, kind in (("ingest-0", "ingest"), ("dispatcher-0", "dispatcher")):
        child = load_settings(None, environ=dict(specs[name].env))
        assert child.bus.user == kind
        assert child.bus.password is None  # a path only: no secret in any environment
        assert child.bus.password_file == secure.credentials.nats_password_file(kind)
        assert child.wal_cloud.metadata.user == "danube-mesh"
        assert child.wal_cloud.metadata.password_file == secure.credentials.etcd_mesh_password_file
    users = json.loads(secure.nats_config.read_text())["authorization"]["users"]
    assert sorted(user["user"] for user in users) == sorted(SERVICE_KINDS)
    # Without --secure, nothing changes: no config file, no credentials.
    plain = plan_mesh(settings, data_dir=tmp_path / "plain", services=["ingest"])
    assert "-c" not in plain.specs[0].argv
    assert not any("PASSWORD" in key for spec in plain.specs for key in spec.env)


def test_docs_security_shows_the_table_the_code_has() -> None:
    doc = (Path(__file__).resolve().parents[2] / "docs" / "security.md").read_text()
    for kind in KIND_PERMISSIONS:
        allowed = bus_permissions(kind, user=kind, subject_prefix="danube")
        publish = ", ".join(f"`{s}`" for s in allowed.publish) or "nothing"
        subscribe = ", ".join(f"`{s}`" for s in allowed.subscribe)
        assert f"| `{kind}` | {publish} | {subscribe} |" in doc, kind

"""deploy/kubernetes/, rendered by `kubectl kustomize` for both overlays and validated
against the Kubernetes 1.32 schemas (kubernetes-validate, strict): ingest a StatefulSet
with a volume per replica and its pod name as node id; every mesh workload probed on
/readyz and /healthz at the port its settings listen on, with requests, a disruption
budget and the object store keys from a Secret; every DANUBE_* variable a setting, and
each service's settings load from the rendered ConfigMap plus its environment; secured by
default: each workload mounts its kind's credentials and the certificate from Secrets and
runs with the settings of `danube up --secure`, the dev overlay generates those Secrets from
the files of `danube admin security init`, and a Job turns etcd's authentication on."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from typing import Any

import kubernetes_validate  # type: ignore[import-untyped]
import pytest
import yaml
from cryptography import x509
from typer.testing import CliRunner

from danube.cli.main import app
from danube.config import PROCESS_VARIABLES, S3Cloud, load_settings
from danube.up.mesh import SERVICE_ORDER
from danube.up.secure import TOKEN_KINDS, ensure_secure_files, service_environment
from tests.unit.test_compose_file import is_setting, parses

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[2]
KUBERNETES = REPO / "deploy/kubernetes"
OVERLAYS = ("dev", "production")
KUBERNETES_VERSION = "1.32.0"  # the schemas validated against (docs/operations.md)
MESH_IMAGES = ("danube-mesh", "registry.example.com/danube/danube-mesh")
SECRET = "danube-object-store"
WORKLOADS = {name: name.replace("_", "-") for name in SERVICE_ORDER}  # kind -> object name
SECURE_MOUNT = "/run/danube/secure"
KEYS_MOUNT = "/run/danube/keys"
MESH_SECRETS = (
    "danube-tls",
    "danube-nats",
    "danube-etcd",
    "danube-signing-keys",
    "danube-verify-keys",
)
# What docs/operations.md and the dev overlay's kustomization tell the operator to run.
DEV_HOSTS = (
    "discovery",
    "discovery.danube-dev",
    "discovery.danube-dev.svc",
    "discovery.danube-dev.svc.cluster.local",
)
_tree: list[Path] = []  # the copy of deploy/kubernetes rendered (see the fixture below)


@pytest.fixture(scope="module", autouse=True)
def secured_tree(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """deploy/kubernetes copied, with the dev overlay's secure/ made by `danube admin
    security init` as its kustomization documents (the repository holds no secret)."""
    tree = tmp_path_factory.mktemp("kubernetes") / "kubernetes"
    shutil.copytree(KUBERNETES, tree, ignore=shutil.ignore_patterns("secure"))
    hosts = [arg for host in DEV_HOSTS for arg in ("--host", host)]
    secure = tree / "overlays/dev/secure"
    argv = ["admin", "security", "init", "--dir", str(secure), "--signing-kid", "dev", *hosts]
    made = CliRunner().invoke(app, argv, env={})
    assert made.exit_code == 0, made.output
    _tree.append(tree)
    render.cache_clear()
    yield tree
    _tree.clear()
    render.cache_clear()


@cache
def render(overlay: str) -> tuple[dict[str, Any], ...]:
    """The overlay's objects, as `kubectl kustomize` renders them (`make setup-tools`
    installs kubectl when missing)."""
    kubectl = shutil.which("kubectl")
    assert kubectl is not None, "kubectl not found: run `make setup-tools` (kubernetes-client)"
    (tree,) = _tree
    result = subprocess.run(
        [kubectl, "kustomize", str(tree / "overlays" / overlay)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    return tuple(doc for doc in yaml.safe_load_all(result.stdout) if doc)


def find(overlay: str, kind: str, name: str) -> dict[str, Any]:
    (found,) = [
        doc for doc in render(overlay) if doc["kind"] == kind and doc["metadata"]["name"] == name
    ]
    return found


def mesh_workloads(overlay: str) -> Iterator[tuple[str, dict[str, Any]]]:
    """``(service kind, workload)`` of each mesh service."""
    for kind, name in WORKLOADS.items():
        workload_kind = "StatefulSet" if kind == "ingest" else "Deployment"
        yield kind, find(overlay, workload_kind, name)


def container(workload: dict[str, Any]) -> dict[str, Any]:
    (only,) = workload["spec"]["template"]["spec"]["containers"]
    assert isinstance(only, dict)
    return only


def config_text(overlay: str, workload: dict[str, Any]) -> str:
    """The danube.yml of the ConfigMap the workload mounts at /etc/danube."""
    spec = workload["spec"]["template"]["spec"]
    mounts = {m["name"]: m["mountPath"] for m in container(workload)["volumeMounts"]}
    (volume,) = [v for v in spec["volumes"] if mounts.get(v["name"]) == "/etc/danube"]
    config_map = find(overlay, "ConfigMap", volume["configMap"]["name"])
    text: str = config_map["data"]["danube.yml"]
    return text


def environment(workload: dict[str, Any]) -> dict[str, str]:
    """What the process sees: plain values, with ``$(VAR)`` of earlier variables expanded
    as the kubelet does; Secret keys as placeholders; the pod name as the first ordinal's
    (``ingest-0``), its namespace as the workload's (``default`` when it names none)."""
    env: dict[str, str] = {}
    fields = {
        "metadata.name": f"{workload['metadata']['name']}-0",
        "metadata.namespace": workload["metadata"].get("namespace", "default"),
    }
    for item in container(workload).get("env", []):
        if "value" in item:
            env[item["name"]] = re.sub(
                r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)",
                lambda m: env.get(m[1], m[0]),
                item["value"],
            )
        elif "secretKeyRef" in item["valueFrom"]:
            env[item["name"]] = f"from-secret-{item['valueFrom']['secretKeyRef']['key']}"
        else:
            env[item["name"]] = fields[item["valueFrom"]["fieldRef"]["fieldPath"]]
    return env


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_object_validates_against_the_kubernetes_schemas(overlay: str) -> None:
    kinds = set()
    for doc in render(overlay):
        kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)
        kinds.add(doc["kind"])
    assert {"StatefulSet", "Deployment", "PodDisruptionBudget", "ConfigMap", "Service"} <= kinds


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_ingest_is_a_statefulset_with_a_volume_per_replica_and_its_pod_name_as_node_id(
    overlay: str,
) -> None:
    ingest = find(overlay, "StatefulSet", "ingest")
    (claim,) = ingest["spec"]["volumeClaimTemplates"]
    mounts = {m["name"]: m["mountPath"] for m in container(ingest)["volumeMounts"]}
    assert mounts[claim["metadata"]["name"]] == "/var/lib/danube"
    env = environment(ingest)
    assert env["DANUBE_NODE_ID"] == "ingest-0"
    headless = find(overlay, "Service", ingest["spec"]["serviceName"])
    assert headless["spec"]["clusterIP"] == "None"


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_each_mesh_service_loads_its_settings_and_is_probed_where_it_listens(
    overlay: str, tmp_path: Path
) -> None:
    for kind, workload in mesh_workloads(overlay):
        main = container(workload)
        assert main["image"].rsplit(":", 1)[0] in MESH_IMAGES
        assert main["command"] == ["python", "-m", f"danube.{kind}"]
        env = environment(workload)
        for key in env:
            if key.startswith("DANUBE_"):
                assert key in PROCESS_VARIABLES or is_setting(key), f"{kind}: {key}"
        config = tmp_path / overlay / kind / Path(env["DANUBE_CONFIG"]).name
        config.parent.mkdir(parents=True)
        config.write_text(config_text(overlay, workload))
        node_id = env.get("DANUBE_NODE_ID", f"{kind}-pod")
        settings = load_settings(config, environ=env | {"DANUBE_NODE_ID": node_id})
        cloud = settings.wal_cloud.cloud
        assert isinstance(cloud, S3Cloud)
        assert cloud.access_key == "from-secret-access_key"
        assert cloud.secret_key is not None
        assert cloud.secret_key.get_secret_value() == "from-secret-secret_key"
        section = getattr(settings, kind)
        assert section.host == "0.0.0.0", kind
        port = settings.discovery.port if kind == "discovery" else section.metrics_port
        # TLS on every listener: kubelet probes over HTTPS (it verifies no certificate).
        readiness = {"path": "/readyz", "port": port, "scheme": "HTTPS"}
        assert main["readinessProbe"]["httpGet"] == readiness, kind
        liveness = {"path": "/healthz", "port": port, "scheme": "HTTPS"}
        assert main["livenessProbe"]["httpGet"] == liveness, kind
        assert str(port) in {str(p["containerPort"]) for p in main["ports"]}, kind
        annotations = workload["spec"]["template"]["metadata"]["annotations"]
        assert annotations["prometheus.io/port"] == str(port), kind
        assert annotations["prometheus.io/scheme"] == "https", kind
        requests = main["resources"]["requests"]
        assert requests["cpu"], kind
        assert requests["memory"], kind
        if kind == "ingest":
            assert settings.wal_cloud.wal.dir == Path("/var/lib/danube/wal/ingest-0")
        if overlay == "production":
            assert settings.ingest.replication_factor == 3
            assert settings.ingest.min_insync_replicas == 2


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_object_store_keys_come_from_the_secret(overlay: str) -> None:
    for kind, workload in mesh_workloads(overlay):
        refs = {
            item["name"]: item["valueFrom"]["secretKeyRef"]
            for item in container(workload)["env"]
            if "secretKeyRef" in item.get("valueFrom", {})
        }
        assert refs == {
            "DANUBE_WAL_CLOUD__CLOUD__ACCESS_KEY": {"name": SECRET, "key": "access_key"},
            "DANUBE_WAL_CLOUD__CLOUD__SECRET_KEY": {"name": SECRET, "key": "secret_key"},
        }, kind
    config = yaml.safe_load(config_text(overlay, find(overlay, "StatefulSet", "ingest")))
    assert "access_key" not in config["wal_cloud"]["cloud"]
    assert "secret_key" not in config["wal_cloud"]["cloud"]


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_mesh_workload_has_a_disruption_budget(overlay: str) -> None:
    budgets = [doc for doc in render(overlay) if doc["kind"] == "PodDisruptionBudget"]
    for kind, workload in mesh_workloads(overlay):
        labels = workload["spec"]["template"]["metadata"]["labels"]
        matching = [
            b for b in budgets if b["spec"]["selector"]["matchLabels"].items() <= labels.items()
        ]
        assert len(matching) == 1, kind
        assert matching[0]["spec"]["maxUnavailable"] == 1, kind
        assert workload["spec"]["selector"]["matchLabels"].items() <= labels.items()


def test_dev_includes_its_prerequisites_and_production_only_names_them() -> None:
    dev = {(doc["kind"], doc["metadata"]["name"]) for doc in render("dev")}
    assert {("Deployment", "nats"), ("StatefulSet", "etcd"), ("Deployment", "s3")} <= dev
    assert ("Secret", SECRET) in dev
    assert ("Job", "s3-bucket") in dev
    production = {(doc["kind"], doc["metadata"]["name"]) for doc in render("production")}
    assert not {name for _, name in production} & {"nats", "etcd", "s3", SECRET, *MESH_SECRETS}
    replicas = {
        kind: workload["spec"]["replicas"] for kind, workload in mesh_workloads("production")
    }
    assert replicas["ingest"] == 3
    assert all(count >= 2 for count in replicas.values())
    for doc in render("production"):
        assert doc["metadata"].get("namespace", "danube") == "danube"


# --- secured by default -------------------------------------------------------------------


def volume_files(workload: dict[str, Any]) -> dict[str, tuple[str, str]]:
    """Each file the container sees from a Secret: path -> (Secret, key)."""
    spec = workload["spec"]["template"]["spec"]
    mounts = {m["name"]: m for m in container(workload)["volumeMounts"]}
    files: dict[str, tuple[str, str]] = {}
    for volume in spec["volumes"]:
        mount = mounts.get(volume["name"])
        if mount is None:
            continue
        assert mount.get("readOnly") is True or "secret" not in repr(volume), volume["name"]
        sources = [s["secret"] for s in volume.get("projected", {}).get("sources", [])]
        if "secret" in volume:
            sources.append({"name": volume["secret"]["secretName"], **volume["secret"]})
        for secret in sources:
            assert volume.get("projected", volume.get("secret", {})).get("defaultMode") == 0o440
            for item in secret.get("items", [{"key": "*", "path": "*"}]):
                files[f"{mount['mountPath']}/{item['path']}"] = (secret["name"], item["key"])
    return files


@pytest.fixture(scope="module")
def secured_env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, str]]:
    """What `danube up --secure` gives each kind, with the files where the pods have them."""
    made = tmp_path_factory.mktemp("secure") / "secure"
    files = ensure_secure_files(made, subject_prefix="danube", issuer="danube", audience="danube")
    return {
        kind: {
            key: value.replace(str(made / "verify-keys"), KEYS_MOUNT)
            .replace(str(made / "keys"), KEYS_MOUNT)
            .replace(str(made), SECURE_MOUNT)
            for key, value in service_environment(files, kind).items()
        }
        for kind in SERVICE_ORDER
    }


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_mesh_workload_mounts_its_credentials_and_runs_secured(
    overlay: str, secured_env: dict[str, dict[str, str]], tmp_path: Path
) -> None:
    for kind, workload in mesh_workloads(overlay):
        env = environment(workload)
        assert {key: env.get(key) for key in secured_env[kind]} == secured_env[kind], kind
        files = volume_files(workload)
        # Every path a setting names is a file of a Secret; its own NATS password only.
        for key, value in secured_env[kind].items():
            if value.startswith(SECURE_MOUNT):
                assert value in files, f"{kind}: {key} -> {value}"
        passwords = {path for path in files if "/nats-" in path}
        assert passwords == {f"{SECURE_MOUNT}/nats-{kind}.password"}, kind
        assert files[f"{SECURE_MOUNT}/pki/server.pem"] == ("danube-tls", "tls.crt"), kind
        assert files[f"{SECURE_MOUNT}/etcd-mesh.password"] == ("danube-etcd", "etcd-mesh.password")
        assert "etcd-root.password" not in repr(files), kind  # the Job's only
        config = tmp_path / overlay / kind / "danube.yml"
        config.parent.mkdir(parents=True)
        config.write_text(config_text(overlay, workload))
        settings = load_settings(config, environ=env | {"DANUBE_NODE_ID": f"{kind}-0"})
        assert settings.bus.user == kind
        assert getattr(settings, kind).tls.cert_file == Path(f"{SECURE_MOUNT}/pki/server.pem")
        if kind in TOKEN_KINDS:  # the services with client doors
            assert settings.security.enabled
            assert settings.security.keys_dir == Path(KEYS_MOUNT)
            # Only discovery issues tokens: the others hold the public halves, never a
            # key that signs.
            keys = "danube-signing-keys" if kind == "discovery" else "danube-verify-keys"
            assert files[f"{KEYS_MOUNT}/*"] == (keys, "*"), kind
        else:
            assert KEYS_MOUNT not in repr(files), kind
        if kind == "discovery":
            assert (settings.discovery.grpc_advertised_url or "").startswith("https://")
            # Outside clients reach the load balancer only: no Redirect to the pods.
            assert settings.discovery.grpc_redirect is (overlay != "production")
        elif kind == "dispatcher":
            assert (settings.dispatcher.data_advertised_url or "").startswith("https://")
            assert settings.dispatcher.data_port == 7002
        if kind == "ingest":  # each pod's doors at its DNS name, on their container ports
            ports = [p["containerPort"] for p in container(workload)["ports"]]
            pod = f"https://ingest-0.ingest.{env['POD_NAMESPACE']}.svc"
            assert settings.ingest.data_port in ports
            assert settings.ingest.data_advertised_url == f"{pod}:{settings.ingest.data_port}"
            assert settings.ingest.grpc_port in ports
            assert settings.ingest.grpc_advertised_url == f"{pod}:{settings.ingest.grpc_port}"
        if kind not in TOKEN_KINDS:
            assert not settings.security.enabled
            assert not any(path.startswith(KEYS_MOUNT) for path in files), kind


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_a_job_turns_etcd_auth_on_with_the_etcd_passwords_only(overlay: str) -> None:
    job = find(overlay, "Job", "etcd-setup")
    main = container(job)
    assert main["image"].rsplit(":", 1)[0] in MESH_IMAGES
    assert parses(main["command"]).params["dir"] == Path(SECURE_MOUNT)
    files = volume_files(job)
    assert files == {
        f"{SECURE_MOUNT}/etcd-root.password": ("danube-etcd", "etcd-root.password"),
        f"{SECURE_MOUNT}/etcd-mesh.password": ("danube-etcd", "etcd-mesh.password"),
    }
    assert job["spec"]["template"]["spec"]["restartPolicy"] == "OnFailure"
    assert job["spec"]["ttlSecondsAfterFinished"] > 0  # the next apply runs it again
    env = environment(job)
    assert all(
        key in PROCESS_VARIABLES or is_setting(key) for key in env if key != "DANUBE_NODE_ID"
    )


def _secret_data(overlay: str, name: str) -> dict[str, bytes]:
    import base64

    secret = find(overlay, "Secret", name)
    return {key: base64.b64decode(value) for key, value in secret["data"].items()}


def test_dev_generates_the_secrets_from_the_files_init_writes(secured_tree: Path) -> None:
    secure = secured_tree / "overlays/dev/secure"
    tls = _secret_data("dev", "danube-tls")
    assert tls == {
        "tls.crt": (secure / "pki/server.pem").read_bytes(),
        "tls.key": (secure / "pki/server-key.pem").read_bytes(),
        "ca.crt": (secure / "pki/ca.pem").read_bytes(),
    }
    san = x509.load_pem_x509_certificate(tls["tls.crt"]).extensions.get_extension_for_class(
        x509.SubjectAlternativeName
    )
    assert set(DEV_HOSTS) <= set(san.value.get_values_for_type(x509.DNSName))
    nats = _secret_data("dev", "danube-nats")
    assert set(nats) == {f"nats-{kind}.password" for kind in SERVICE_ORDER}
    for key, value in nats.items():
        assert value == (secure / key).read_bytes()
    assert set(_secret_data("dev", "danube-etcd")) == {"etcd-root.password", "etcd-mesh.password"}
    assert set(_secret_data("dev", "danube-signing-keys")) == {"dev.pem"}
    (public,) = _secret_data("dev", "danube-verify-keys").items()
    assert public == ("dev.pub.pem", (secure / "verify-keys/dev.pub.pem").read_bytes())
    assert b"PRIVATE" not in public[1]
    config = json.loads(_secret_data("dev", "danube-nats-config")["nats.conf"])
    users = {user["user"] for user in config["authorization"]["users"]}
    assert users == set(SERVICE_ORDER)
    nats_server = container(find("dev", "Deployment", "nats"))
    assert nats_server["args"][:2] == ["--config", "/etc/nats-auth/nats.conf"]
    mounts = {m["name"]: m["mountPath"] for m in nats_server["volumeMounts"]}
    volumes = find("dev", "Deployment", "nats")["spec"]["template"]["spec"]["volumes"]
    (auth,) = [v for v in volumes if mounts.get(v["name"]) == "/etc/nats-auth"]
    assert auth["secret"]["secretName"] == "danube-nats-config"


def test_no_secret_is_committed_for_the_dev_overlay() -> None:
    ignored = (REPO / ".gitignore").read_text().splitlines()
    assert "deploy/kubernetes/overlays/dev/secure/" in ignored
    tracked = subprocess.run(
        ["git", "-C", str(REPO), "ls-files", "deploy/kubernetes"],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    ).stdout.split()
    assert not [path for path in tracked if "/secure/" in path]

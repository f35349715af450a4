"""deploy/kubernetes/, rendered by `kubectl kustomize` for both overlays and validated
against the Kubernetes 1.32 schemas (kubernetes-validate, strict): ingest a StatefulSet
with a volume per replica and its pod name as node id; every mesh workload probed on
/readyz and /healthz at the port its settings listen on, with requests, a disruption
budget and the object store keys from a Secret; every DANUBE_* variable a setting, and
each service's settings load from the rendered ConfigMap plus its environment."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from typing import Any

import kubernetes_validate  # type: ignore[import-untyped]
import pytest
import yaml

from danube.config import PROCESS_VARIABLES, S3Cloud, load_settings
from danube.runtime.mesh import SERVICE_ORDER
from tests.unit.test_compose_file import is_setting

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[2]
KUBERNETES = REPO / "deploy/kubernetes"
OVERLAYS = ("dev", "production")
KUBERNETES_VERSION = "1.32.0"  # the schemas validated against (docs/operations.md)
MESH_IMAGES = ("danube-mesh", "registry.example.com/danube/danube-mesh")
SECRET = "danube-object-store"
WORKLOADS = {name: name.replace("_", "-") for name in SERVICE_ORDER}  # kind -> object name


@cache
def render(overlay: str) -> tuple[dict[str, Any], ...]:
    """The overlay's objects, as `kubectl kustomize` renders them (`make setup-tools`
    installs kubectl when missing)."""
    kubectl = shutil.which("kubectl")
    assert kubectl is not None, "kubectl not found: run `make setup-tools` (kubernetes-client)"
    result = subprocess.run(
        [kubectl, "kustomize", str(KUBERNETES / "overlays" / overlay)],
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
    """What the process sees: plain values; Secret keys as placeholders; the pod name as
    the first ordinal's (``ingest-0``)."""
    env: dict[str, str] = {}
    for item in container(workload).get("env", []):
        if "value" in item:
            env[item["name"]] = item["value"]
        elif "secretKeyRef" in item["valueFrom"]:
            env[item["name"]] = f"from-secret-{item['valueFrom']['secretKeyRef']['key']}"
        else:
            assert item["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
            env[item["name"]] = f"{workload['metadata']['name']}-0"
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
        assert main["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": port}, kind
        assert main["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": port}, kind
        assert str(port) in {str(p["containerPort"]) for p in main["ports"]}, kind
        annotations = workload["spec"]["template"]["metadata"]["annotations"]
        assert annotations["prometheus.io/port"] == str(port), kind
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
    assert not {name for _, name in production} & {"nats", "etcd", "s3", SECRET}
    replicas = {
        kind: workload["spec"]["replicas"] for kind, workload in mesh_workloads("production")
    }
    assert replicas["ingest"] == 3
    assert all(count >= 2 for count in replicas.values())
    for doc in render("production"):
        assert doc["metadata"].get("namespace", "danube") == "danube"

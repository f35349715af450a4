"""docker-compose.yml and its overrides, read as YAML (no Docker): every service has a
healthcheck and a command that exists, DANUBE_* keys are settings, each service's settings
load from deploy/config/compose.yml plus its environment, and the mesh runs secured as
`danube up --secure` does (the same settings, from the files security-init writes)."""

from __future__ import annotations

import importlib.util
import json
import re
import types
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
import typer
import yaml
from pydantic import BaseModel

from danube.cli.main import app
from danube.config import PROCESS_VARIABLES, DanubeSettings, S3Cloud, load_settings
from danube.up.mesh import SERVICE_ORDER
from danube.up.secure import ensure_secure_files, service_environment

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[2]
BASE = REPO / "docker-compose.yml"
STANDINS = REPO / "tests/compose/standins"
SMOKE = REPO / "tests/compose/smoke.yml"
CONFIG_MOUNT = "/etc/danube"
SECURE_MOUNT = "/run/danube/secure"  # the volume `secure`, written by security-init
SECURE_ONE_SHOTS = ("security-init", "etcd-setup")
HEALTHCHECK = ["CMD", "python", "-m", "danube.runtime.healthcheck"]


class _Reset:
    """Compose's `!reset` (drop the base value) and `!override` (replace, not merge)."""

    def __init__(self, value: Any, *, override: bool) -> None:
        self.value = value
        self.override = override


class _ComposeLoader(yaml.SafeLoader):
    pass


def _construct(override: bool) -> Any:
    def construct(loader: yaml.SafeLoader, node: yaml.Node) -> _Reset:
        if isinstance(node, yaml.MappingNode):
            value: Any = loader.construct_mapping(node, deep=True)
        elif isinstance(node, yaml.SequenceNode):
            value = loader.construct_sequence(node, deep=True)
        else:
            value = loader.construct_scalar(node)  # type: ignore[arg-type]
        return _Reset(value, override=override)

    return construct


_ComposeLoader.add_constructor("!reset", _construct(override=False))
_ComposeLoader.add_constructor("!override", _construct(override=True))


def load(path: Path) -> dict[str, Any]:
    document = yaml.load(path.read_text(), Loader=_ComposeLoader)  # a SafeLoader
    assert isinstance(document, dict)
    return document


def _merge(base: Any, override: Any) -> Any:
    """Compose's merge, as far as these files use it: mappings merge key by key (so do
    `environment`s); anything else, and `!override`, replaces; `!reset` empties."""
    if isinstance(override, _Reset):
        return override.value if override.override else type(override.value)()
    if isinstance(base, dict) and isinstance(override, dict):
        merged = dict(base)
        for key, value in override.items():
            merged[key] = _merge(base.get(key), value)
        return merged
    return override


def services(*paths: Path) -> dict[str, dict[str, Any]]:
    merged: dict[str, Any] = {}
    for path in paths:
        merged = _merge(merged, load(path).get("services", {}))
    return merged


_VARIABLE = re.compile(r"\$\{(?P<name>[A-Za-z_][A-Za-z0-9_]*)(?::-(?P<default>[^}]*))?\}")


def interpolate(value: Any, variables: Mapping[str, str]) -> Any:
    """Compose's ``${VAR}`` / ``${VAR:-default}`` / ``$$``, as ``docker compose`` would
    resolve them with ``variables`` as its environment."""
    if isinstance(value, str):
        parts = value.split("$$")
        resolved = [
            _VARIABLE.sub(lambda m: variables.get(m["name"]) or (m["default"] or ""), part)
            for part in parts
        ]
        return "$".join(resolved)
    if isinstance(value, list):
        return [interpolate(item, variables) for item in value]
    if isinstance(value, dict):
        return {key: interpolate(item, variables) for key, item in value.items()}
    return value


def _models(annotation: Any) -> list[type[BaseModel]]:
    """The pydantic models an annotation can hold (through Annotated, unions, Optional)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    if typing.get_origin(annotation) in (typing.Annotated, typing.Union, types.UnionType):
        return [model for arg in typing.get_args(annotation) for model in _models(arg)]
    return []


def is_setting(variable: str) -> bool:
    """``DANUBE_<SECTION>__<KEY>...`` names a key of the settings schema (for ``cloud``,
    a key of one of its backends)."""
    parts = variable.removeprefix("DANUBE_").lower().split("__")
    models: list[type[BaseModel]] = [DanubeSettings]
    for index, part in enumerate(parts):
        fields = [model.model_fields[part] for model in models if part in model.model_fields]
        if not fields:
            return False
        models = [model for field in fields for model in _models(field.annotation)]
        if not models:
            return index == len(parts) - 1  # a leaf: nothing may follow
    return False  # a whole section: not how these files set anything


def mesh_environment(service: dict[str, Any], node_id: str) -> dict[str, str]:
    """What the service's process sees: its environment (interpolated with no variables
    set, as `docker compose up` with no .env), plus the node id run_service sets."""
    env = interpolate(service.get("environment", {}), {})
    assert isinstance(env, dict)
    return {**{key: str(value) for key, value in env.items()}, "DANUBE_NODE_ID": node_id}


def config_file(service: dict[str, Any], env: Mapping[str, str]) -> Path:
    """The host file behind DANUBE_CONFIG, through the service's bind mount."""
    inside = Path(env["DANUBE_CONFIG"])
    volumes: list[str] = service["volumes"]
    for volume in volumes:
        source, target, *_ = volume.split(":")
        if inside.is_relative_to(target) and source.startswith("./"):
            return REPO / source / inside.relative_to(target)
    raise AssertionError(f"no bind mount holds {inside}")


def one_shots(stack: Mapping[str, dict[str, Any]]) -> set[str]:
    """Services others wait on to *complete*: their exit code is their health."""
    return {
        name
        for service in stack.values()
        for name, condition in service.get("depends_on", {}).items()
        if condition.get("condition") == "service_completed_successfully"
    }


COMBINATIONS = {"base": (BASE,), "smoke": (BASE, SMOKE)}


@pytest.fixture(params=sorted(COMBINATIONS))
def stack(request: pytest.FixtureRequest) -> tuple[str, dict[str, dict[str, Any]]]:
    return request.param, services(*COMBINATIONS[request.param])


def test_the_stack_has_every_mesh_service_and_its_backing_services() -> None:
    names = set(services(BASE))
    assert set(SERVICE_ORDER) <= names
    assert {"nats", "etcd", "s3", "s3-init", *SECURE_ONE_SHOTS} <= names
    assert set(services(BASE, SMOKE)) == names  # the smoke's override adds no service


def test_every_service_has_a_healthcheck_or_is_a_one_shot(
    stack: tuple[str, dict[str, dict[str, Any]]],
) -> None:
    _, found = stack
    for name in one_shots(found):
        assert found[name].get("restart") == "no", name
        assert "healthcheck" not in found[name], name
    for name, service in found.items():
        if name in one_shots(found):
            continue
        test = service.get("healthcheck", {}).get("test")
        assert isinstance(test, list), f"{name}: no healthcheck"
        assert test[0] == "CMD", f"{name}: {test}"


def test_mesh_services_run_their_module_and_the_danube_healthcheck(
    stack: tuple[str, dict[str, dict[str, Any]]],
) -> None:
    _, found = stack
    assert importlib.util.find_spec("danube.runtime.healthcheck") is not None
    for name in SERVICE_ORDER:
        service = found[name]
        assert service["command"] == ["python", "-m", f"danube.{name}"]
        assert importlib.util.find_spec(f"danube.{name}.__main__") is not None, name
        assert service["healthcheck"]["test"] == HEALTHCHECK, name


def test_the_standins_provide_what_the_file_asks_of_the_real_images() -> None:
    """The compose smoke's stand-ins (tests/compose/standins/) have the programs, at the
    paths, that the commands and healthchecks of docker-compose.yml run."""
    found = services(BASE)
    nats = (STANDINS / "nats.Dockerfile").read_text()
    assert found["nats"]["command"][0] == "nats-server"
    assert "COPY nats-server /usr/local/bin/nats-server" in nats
    assert "ENV PATH=/usr/local/bin:/bin" in nats
    assert found["nats"]["healthcheck"]["test"][:2] == ["CMD", "wget"]
    assert '"--install", "-s", "/bin"' in nats  # busybox's wget as /bin/wget
    etcd = (STANDINS / "etcd.Dockerfile").read_text()
    assert found["etcd"]["command"][0] == "/usr/local/bin/etcd"
    assert found["etcd"]["healthcheck"]["test"][1] == "/usr/local/bin/etcdctl"
    assert "COPY etcd etcdctl /usr/local/bin/" in etcd
    assert "FROM scratch" in etcd
    weed = (STANDINS / "seaweedfs.Dockerfile").read_text()
    assert 'ENTRYPOINT ["/usr/bin/weed"]' in weed
    assert "/usr/bin/wget" in weed
    assert found["s3"]["command"][0] == "server"
    assert found["s3"]["healthcheck"]["test"][:2] == ["CMD", "wget"]
    assert found["s3-init"]["entrypoint"] == ["/bin/sh", "-c"]
    script = found["s3-init"]["command"][0]
    assert script.count("weed shell -master=s3:9333") == 2
    assert '"s3.bucket.list"' in script
    assert '"s3.bucket.create -name $$S3_BUCKET"' in script


def test_the_smoke_override_sets_only_mesh_settings() -> None:
    """tests/compose/smoke.yml changes environment settings and nothing else: the smoke runs
    docker-compose.yml as it is, with its images named by its own variables."""
    raw = yaml.safe_load(SMOKE.read_text())
    for name, service in raw["services"].items():
        assert set(service) == {"environment"}, name
        assert all(key.startswith("DANUBE_") for key in service["environment"]), name
    assert {key for key in raw if not key.startswith("x-")} == {"services"}


def test_danube_environment_keys_are_settings_or_process_variables(
    stack: tuple[str, dict[str, dict[str, Any]]],
) -> None:
    _, found = stack
    for name, service in found.items():
        for key in service.get("environment", {}):
            if not key.startswith("DANUBE_"):
                continue
            assert key in PROCESS_VARIABLES or is_setting(key), f"{name}: {key}"


def test_the_schema_walk_rejects_what_the_settings_do_not_have() -> None:
    assert is_setting("DANUBE_WAL_CLOUD__CLOUD__ENDPOINT")  # an s3 key, through the union
    assert is_setting("DANUBE_DISPATCHER__METRICS_PORT")
    assert not is_setting("DANUBE_DISPATCHER__METRIC_PORT")
    assert not is_setting("DANUBE_WAL_CLOUD__WAL__DIR__X")
    assert not is_setting("DANUBE_BUS")
    assert not is_setting("DANUBE_BUCKET")


def test_each_mesh_service_loads_its_settings(
    stack: tuple[str, dict[str, dict[str, Any]]],
) -> None:
    combination, found = stack
    for name in SERVICE_ORDER:
        service = found[name]
        env = mesh_environment(service, f"{name}-0")
        settings = load_settings(config_file(service, env), environ=env)
        cloud = settings.wal_cloud.cloud
        assert isinstance(cloud, S3Cloud)
        assert cloud.root == "s3://danube/cluster-data"
        assert cloud.secret_key is not None
        assert settings.wal_cloud.wal.dir == Path(f"/var/lib/danube/wal/{name}-0")
        section = getattr(settings, name)
        # The smoke runs the file's own addresses and ports: only the tiers' timing moves.
        assert settings.bus.servers == ["nats://nats:4222"]
        assert settings.wal_cloud.metadata.etcd_endpoints == ["etcd:2379"]
        assert cloud.endpoint == "http://s3:8333"
        assert section.host == "0.0.0.0"
        assert name == "discovery" or section.metrics_port == 9100
        if combination == "smoke":
            assert settings.wal_cloud.wal.rotation.max_bytes == 65536


def test_mesh_services_share_slots_and_ingest_keeps_its_wal_on_a_volume() -> None:
    found = services(BASE)
    declared = set(load(BASE)["volumes"])
    for name in SERVICE_ORDER:
        env = mesh_environment(found[name], f"{name}-0")
        mounts = dict(volume.split(":")[:2][::-1] for volume in found[name]["volumes"])
        assert mounts[env["DANUBE_NODE_SLOTS"]] == "node-slots", name
        assert mounts[CONFIG_MOUNT] == "./deploy/config", name
        assert set(mounts.values()) - {"./deploy/config"} <= declared
    ingest = dict(volume.split(":")[:2][::-1] for volume in found["ingest"]["volumes"])
    assert ingest["/var/lib/danube"] == "ingest-data"
    assert "ports" in found["discovery"]  # the API, published


def test_the_image_runs_as_a_user_and_checks_its_health() -> None:
    dockerfile = (REPO / "deploy/Dockerfile").read_text()
    final_stage = dockerfile.rsplit("\nFROM ", 1)[1]
    users = re.findall(r"^USER (\S+)", final_stage, re.MULTILINE)
    assert users == ["10001:10001"]
    assert 'CMD ["python", "-m", "danube.runtime.healthcheck"]' in final_stage
    assert "DANUBE_HEALTH_FILE=" in final_stage
    for source in re.findall(r"^COPY (?!--from)(.+) \S+$", dockerfile, re.MULTILINE):
        for path in source.split():
            assert (REPO / path).exists(), path


# --- the images a user pulls --------------------------------------------------------------

_IMAGE = re.compile(r"^\$\{(?P<variable>[A-Z0-9_]+_IMAGE):-(?P<default>[^}]+)\}$")


def test_every_image_is_a_variable_with_a_pinned_default() -> None:
    """Each image can be swapped (the smoke does, with local stand-ins) and its default is
    a version, never `latest` or a bare major: what users pull is what was chosen."""
    for name, service in services(BASE).items():
        match = _IMAGE.match(service["image"])
        assert match is not None, f"{name}: {service['image']}"
        if match["variable"] == "DANUBE_IMAGE":
            continue  # built here (deploy/Dockerfile): the mesh and its one-shots
        repository, _, tag = match["default"].rpartition(":")
        assert repository, name
        assert tag != "latest", name
        assert re.search(r"\d+\.\d+\.\d+|^\d+\.\d+$", tag), f"{name}: {tag} is not pinned"
    images = {name: services(BASE)[name]["image"] for name in ("etcd", "s3", "nats")}
    assert "gcr.io/etcd-development/etcd:" in images["etcd"]  # etcd's own registry
    assert "bitnami" not in repr(services(BASE))
    assert "minio" not in repr(services(BASE))


def test_healthchecks_need_no_shell_where_the_image_has_none() -> None:
    found = services(BASE)
    # etcd's image is distroless: etcdctl itself, by absolute path, as a CMD (no CMD-SHELL).
    assert found["etcd"]["healthcheck"]["test"][:2] == ["CMD", "/usr/local/bin/etcdctl"]
    assert found["etcd"]["command"][0] == "/usr/local/bin/etcd"
    for name in ("nats", "s3"):  # alpine images: busybox wget
        assert found[name]["healthcheck"]["test"][:2] == ["CMD", "wget"], name


def test_the_s3_identity_and_the_mesh_share_the_keys() -> None:
    compose = load(BASE)
    identities = interpolate(compose["configs"]["s3-identities"]["content"], {})
    (identity,) = json.loads(identities)["identities"]
    (keys,) = identity["credentials"]
    env = mesh_environment(services(BASE)["ingest"], "ingest-0")
    assert keys["accessKey"] == env["DANUBE_WAL_CLOUD__CLOUD__ACCESS_KEY"]
    assert keys["secretKey"] == env["DANUBE_WAL_CLOUD__CLOUD__SECRET_KEY"]
    s3 = services(BASE)["s3"]
    assert "-s3.config=/etc/seaweedfs/s3.json" in s3["command"]
    assert s3["configs"] == [{"source": "s3-identities", "target": "/etc/seaweedfs/s3.json"}]


def test_the_minio_override_keeps_the_mesh_settings_valid() -> None:
    found = services(BASE, REPO / "deploy/compose/minio.yml")
    assert found["s3"]["image"].startswith("${MINIO_IMAGE:?")
    for name in SERVICE_ORDER:
        env = mesh_environment(found[name], f"{name}-0")
        assert env["DANUBE_WAL_CLOUD__CLOUD__ENDPOINT"] == "http://s3:9000"


def test_the_observability_profile_mounts_what_exists() -> None:
    found = services(BASE)
    for name in ("prometheus", "grafana"):
        assert found[name]["profiles"] == ["observability"], name
        for volume in found[name]["volumes"]:
            source = volume.split(":")[0]
            if source.startswith("./"):
                assert (REPO / source).exists(), f"{name}: {source}"
    for service in SERVICE_ORDER:
        assert "observability" not in found[service].get("profiles", [])


# --- secured by default -------------------------------------------------------------------


def mounts(service: dict[str, Any]) -> dict[str, tuple[str, bool]]:
    """target -> (source, read-only) of a service's volumes."""
    found = {}
    for volume in service.get("volumes", []):
        source, target, *options = volume.split(":")
        found[target] = (source, "ro" in options)
    return found


def waits_for(stack: Mapping[str, dict[str, Any]], name: str) -> dict[str, str]:
    """Every service ``name`` waits on, directly or through another, with its condition."""
    seen: dict[str, str] = {}
    todo = [name]
    while todo:
        for other, condition in stack[todo.pop()].get("depends_on", {}).items():
            if other not in seen:
                seen[other] = condition["condition"]
                todo.append(other)
    return seen


def parses(argv: list[str]) -> Any:
    """``argv`` parsed by the `danube` command the image installs (its options, the
    required ones present): the parsed context, whose ``params`` are the options' values."""
    assert argv[0] == "danube", argv
    command: Any = typer.main.get_command(app)
    args = argv[1:]
    while getattr(command, "commands", None) is not None:  # a group: descend
        name, *args = args
        assert name in command.commands, f"no command {name} in {argv}"
        command = command.commands[name]
    return command.make_context(argv[0], list(args))


@pytest.fixture(scope="module")
def secured_env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, str]]:
    """What `danube up --secure` gives each kind, with its files where compose has them."""
    made = tmp_path_factory.mktemp("secure") / "secure"
    files = ensure_secure_files(made, subject_prefix="danube", issuer="danube", audience="danube")
    return {
        kind: {
            key: value.replace(str(made), SECURE_MOUNT)
            for key, value in service_environment(files, kind).items()
        }
        for kind in SERVICE_ORDER
    }


def test_each_mesh_service_runs_with_the_settings_of_up_secure(
    stack: tuple[str, dict[str, dict[str, Any]]], secured_env: dict[str, dict[str, str]]
) -> None:
    _, found = stack
    for name in SERVICE_ORDER:
        service = found[name]
        env = mesh_environment(service, f"{name}-0")
        assert {key: env.get(key) for key in secured_env[name]} == secured_env[name], name
        assert mounts(service)[SECURE_MOUNT] == ("secure", True), name
        waits = waits_for(found, name)
        for one_shot in SECURE_ONE_SHOTS:
            assert waits[one_shot] == "service_completed_successfully", name
        settings = load_settings(config_file(service, env), environ=env)
        assert settings.bus.user == name
        assert settings.bus.password_file == Path(f"{SECURE_MOUNT}/nats-{name}.password")
        assert settings.wal_cloud.metadata.user == "danube-mesh"
        assert getattr(settings, name).tls.cert_file == Path(f"{SECURE_MOUNT}/pki/server.pem")
        assert not any("PASSWORD" in key and "FILE" not in key for key in env), name
    discovery = mesh_environment(found["discovery"], "discovery-0")
    settings = load_settings(config_file(found["discovery"], discovery), environ=discovery)
    assert settings.security.enabled
    assert settings.security.keys_dir == Path(f"{SECURE_MOUNT}/keys")
    assert "admin" in settings.security.super_admins
    assert settings.discovery.tls.client_ca_file == Path(f"{SECURE_MOUNT}/pki/ca.pem")
    assert (settings.discovery.grpc_advertised_url or "").startswith("https://")
    # Host clients reach the published port only: lookups never Redirect to a container.
    assert settings.discovery.grpc_redirect is False


def test_security_init_writes_the_volume_every_other_service_reads(
    stack: tuple[str, dict[str, dict[str, Any]]],
) -> None:
    _, found = stack
    init = found["security-init"]
    assert mounts(init)[SECURE_MOUNT] == ("secure", False)  # the one writer
    for name, service in found.items():
        if name != "security-init" and SECURE_MOUNT in mounts(service):
            assert mounts(service)[SECURE_MOUNT] == ("secure", True), name
    command = interpolate(init["command"], {})
    context = parses(command)
    assert context.params["dir"] == Path(SECURE_MOUNT)
    assert {"discovery", "localhost"} <= set(context.params["host"])
    hosts = parses(interpolate(init["command"], {"DANUBE_PUBLIC_HOST": "mq.example"}))
    assert "mq.example" in hosts.params["host"]
    # Its settings (the subject prefix, token issuer and audience) load like the mesh's.
    env = mesh_environment(init, "security-init")
    load_settings(config_file(init, env), environ=env)
    assert "secure" in load(BASE)["volumes"]


def test_etcd_setup_runs_once_etcd_answers_against_the_mesh_etcd(
    stack: tuple[str, dict[str, dict[str, Any]]],
) -> None:
    combination, found = stack
    setup = found["etcd-setup"]
    assert setup["depends_on"] == {
        "etcd": {"condition": "service_healthy"},
        "security-init": {"condition": "service_completed_successfully"},
    }
    assert parses(setup["command"]).params["dir"] == Path(SECURE_MOUNT)
    assert mounts(setup)[SECURE_MOUNT] == ("secure", True)
    env = mesh_environment(setup, "etcd-setup")
    endpoint = load_settings(config_file(setup, env), environ=env).wal_cloud.metadata
    mesh = mesh_environment(found["ingest"], "ingest-0")
    expected = load_settings(config_file(found["ingest"], mesh), environ=mesh).wal_cloud.metadata
    assert endpoint.etcd_endpoints == expected.etcd_endpoints
    assert endpoint.prefix == expected.prefix
    if combination == "base":
        assert endpoint.etcd_endpoints == ["etcd:2379"]
        # `endpoint health` reads a key, which etcd refuses without a login once auth is on.
        assert found["etcd"]["healthcheck"]["test"][-2:] == ["endpoint", "status"]


def test_the_one_shots_run_the_image_the_mesh_runs() -> None:
    """Built as the mesh's image is (never pulled by a name nobody publishes)."""
    found = services(BASE)
    for name in SECURE_ONE_SHOTS:
        assert found[name]["image"] == found["ingest"]["image"], name
        assert found[name]["build"] == found["ingest"]["build"], name
        assert found[name]["command"][0] == "danube", name  # the image's console script
    assert (REPO / "pyproject.toml").read_text().count('danube = "danube.cli.main:') == 1


def test_nats_runs_with_the_generated_config(
    stack: tuple[str, dict[str, dict[str, Any]]],
) -> None:
    _, found = stack
    nats = found["nats"]
    assert f"--config={SECURE_MOUNT}/nats.conf" in nats["command"]
    assert mounts(nats)[SECURE_MOUNT] == ("secure", True)
    assert nats["depends_on"]["security-init"] == {"condition": "service_completed_successfully"}


def test_the_image_owns_the_secure_mount_point() -> None:
    """A named volume takes the mount point's owner and mode from the image: without it the
    volume would be root's and security-init (uid 10001) could not write it."""
    final_stage = (REPO / "deploy/Dockerfile").read_text().rsplit("\nFROM ", 1)[1]
    assert f"install -d -o danube -g danube -m 0700 {SECURE_MOUNT}" in final_stage

"""danube.config: YAML + env loading, ${VAR} interpolation, error key paths, shipped defaults."""

from __future__ import annotations

import logging
import re
import textwrap
from pathlib import Path
from typing import Any

import pytest
from pydantic import SecretStr, ValidationError

from danube.config import (
    CLIENT_VARIABLES,
    PROCESS_VARIABLES,
    AzblobCloud,
    ConfigError,
    DanubeSettings,
    FsCloud,
    GcsCloud,
    MemoryCloud,
    S3Cloud,
    load_settings,
)
from danube.config.interpolate import interpolate_value
from danube.config.section import MiB

pytestmark = pytest.mark.unit

REPO_ROOT = Path(__file__).resolve().parents[2]
SHIPPED_CONFIG = REPO_ROOT / "deploy" / "config" / "danube.yml"

# Danube's documented example, key for key.
DANUBE_S3_EXAMPLE = """
wal_cloud:
  wal:
    dir: "./danube-data/wal"
    file_name: "wal.log"
    cache_capacity: 1024
    file_sync:
      interval_ms: 5000         # fsync cadence (checkpoint frequency)
      max_batch_bytes: 10485760 # 10 MiB write batch
    rotation:
      max_bytes: 536870912      # 512 MiB WAL file size
      # max_hours: 24           # optional time-based rotation
    retention:
      time_minutes: 2880        # prune locally after 48h
      size_mb: 20480            # or when size exceeds 20 GiB
      check_interval_minutes: 5 # deleter tick interval
  uploader:
    enabled: true
    interval_seconds: 300       # one upload cycle every 5 minutes
    root_prefix: "/danube-data"
    max_object_mb: 1024         # optional cap per object
  cloud:
    backend: "s3"
    root: "s3://danube-messages/cluster-data"  # S3 bucket and prefix
    region: "us-east-1"
    endpoint: "http://minio:9000"     # MinIO endpoint
    access_key: "minioadmin"
    secret_key: "minioadmin123"
    anonymous: false
    virtual_host_style: false
  metadata:
    etcd_endpoint: "127.0.0.1:2379"
    in_memory: false
"""


def write_config(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "danube.yml"
    path.write_text(textwrap.dedent(text), encoding="utf-8")
    return path


def load_text(tmp_path: Path, text: str, environ: dict[str, str] | None = None) -> DanubeSettings:
    return load_settings(write_config(tmp_path, text), environ=environ or {})


def load_error(tmp_path: Path, text: str, environ: dict[str, str] | None = None) -> ConfigError:
    with pytest.raises(ConfigError) as caught:
        load_text(tmp_path, text, environ)
    assert caught.value.code == "bad_config"
    assert caught.value.retriable is False
    return caught.value


def cloud_yaml(body: str) -> str:
    return "wal_cloud:\n  cloud:\n" + textwrap.indent(textwrap.dedent(body), "    ")


# --- Danube's documented examples ---------------------------------------------------


def test_danube_documented_s3_example_loads_key_for_key(tmp_path: Path) -> None:
    settings = load_text(tmp_path, DANUBE_S3_EXAMPLE)
    wal = settings.wal_cloud.wal
    assert wal.dir == Path("./danube-data/wal")
    assert wal.file_name == "wal.log"
    assert wal.cache_capacity == 1024
    assert (wal.file_sync.interval_ms, wal.file_sync.max_batch_bytes) == (5000, 10 * MiB)
    assert (wal.rotation.max_bytes, wal.rotation.max_hours) == (512 * MiB, None)
    assert (wal.retention.time_minutes, wal.retention.size_mb) == (2880, 20480)
    assert wal.retention.check_interval_minutes == 5
    uploader = settings.wal_cloud.uploader
    assert (uploader.enabled, uploader.interval_seconds) == (True, 300)
    assert (uploader.root_prefix, uploader.max_object_mb) == ("/danube-data", 1024)
    cloud = settings.wal_cloud.cloud
    assert isinstance(cloud, S3Cloud)
    assert cloud.root == "s3://danube-messages/cluster-data"
    assert (cloud.region, cloud.endpoint) == ("us-east-1", "http://minio:9000")
    assert cloud.access_key == "minioadmin"
    assert cloud.secret_key is not None
    assert cloud.secret_key.get_secret_value() == "minioadmin123"
    assert (cloud.anonymous, cloud.virtual_host_style) == (False, False)
    metadata = settings.wal_cloud.metadata
    assert (metadata.etcd_endpoints, metadata.in_memory) == (["127.0.0.1:2379"], False)


def test_danube_s3_variant_with_null_profile_role_and_token(tmp_path: Path) -> None:
    settings = load_text(
        tmp_path,
        cloud_yaml("""
            backend: "s3"
            root: "s3://danube-messages/cluster-data"
            region: "us-east-1"
            profile: null
            role_arn: null
            session_token: null
        """),
    )
    cloud = settings.wal_cloud.cloud
    assert isinstance(cloud, S3Cloud)
    assert (cloud.profile, cloud.role_arn, cloud.session_token) == (None, None, None)
    assert (cloud.access_key, cloud.secret_key, cloud.endpoint) == (None, None, None)


def test_danube_gcs_variant(tmp_path: Path) -> None:
    settings = load_text(
        tmp_path,
        cloud_yaml("""
            backend: "gcs"
            root: "gcs://my-bucket/prefix"
            project: "my-project"
            credentials_json: null
            credentials_path: "/path/to/creds.json"
        """),
    )
    assert settings.wal_cloud.cloud == GcsCloud(
        backend="gcs",
        root="gcs://my-bucket/prefix",
        project="my-project",
        credentials_json=None,
        credentials_path="/path/to/creds.json",
    )


def test_danube_azblob_variant(tmp_path: Path) -> None:
    settings = load_text(
        tmp_path,
        cloud_yaml("""
            backend: "azblob"
            root: "my-container/prefix"
            endpoint: "http://azurite:10000/devstoreaccount1"
            account_name: "devstoreaccount1"
            account_key: "Eby8vdM02xNOcqF=="
        """),
    )
    cloud = settings.wal_cloud.cloud
    assert isinstance(cloud, AzblobCloud)
    assert (cloud.root, cloud.account_name) == ("my-container/prefix", "devstoreaccount1")
    assert cloud.endpoint == "http://azurite:10000/devstoreaccount1"
    assert cloud.account_key == SecretStr("Eby8vdM02xNOcqF==")


def test_danube_memory_and_fs_variants(tmp_path: Path) -> None:
    memory = load_text(tmp_path, cloud_yaml('backend: "memory"\nroot: "mem-prefix"\n'))
    assert memory.wal_cloud.cloud == MemoryCloud(backend="memory", root="mem-prefix")
    fs = load_text(tmp_path, cloud_yaml('backend: "fs"\nroot: "./object_root"\n'))
    assert fs.wal_cloud.cloud == FsCloud(backend="fs", root="./object_root")


# --- precedence: defaults < file < environment ----------------------------------------


def test_no_file_and_empty_environment_gives_model_defaults() -> None:
    settings = load_settings(None, environ={})
    assert settings == DanubeSettings.model_construct()
    assert settings.wal_cloud.cloud == FsCloud(backend="fs", root="./danube-data/objects")
    assert settings.bus.servers == ["nats://127.0.0.1:4222"]


def test_environment_override_wins_over_file(tmp_path: Path) -> None:
    settings = load_text(
        tmp_path, DANUBE_S3_EXAMPLE, {"DANUBE_WAL_CLOUD__WAL__CACHE_CAPACITY": "7"}
    )
    assert settings.wal_cloud.wal.cache_capacity == 7
    # The rest of the file still applies around the overridden key.
    assert settings.wal_cloud.wal.file_sync.interval_ms == 5000
    assert isinstance(settings.wal_cloud.cloud, S3Cloud)


def test_environment_names_are_case_insensitive_and_reach_union_members(tmp_path: Path) -> None:
    environ = {
        "danube_wal_cloud__cloud__region": "eu-west-1",
        "Danube_Cluster_Name": "east",
    }
    settings = load_text(tmp_path, DANUBE_S3_EXAMPLE, environ)
    cloud = settings.wal_cloud.cloud
    assert isinstance(cloud, S3Cloud)
    assert (cloud.region, cloud.endpoint) == ("eu-west-1", "http://minio:9000")
    assert settings.cluster_name == "east"


def test_environment_list_value_is_json() -> None:
    environ = {"DANUBE_BUS__SERVERS": '["nats://a:4222", "nats://b:4222"]'}
    settings = load_settings(environ=environ)
    assert settings.bus.servers == ["nats://a:4222", "nats://b:4222"]


def test_environment_value_that_is_not_json_fails_as_config_error() -> None:
    with pytest.raises(ConfigError) as caught:
        load_settings(environ={"DANUBE_BUS__SERVERS": "nats://a:4222"})
    assert caught.value.code == "bad_config"
    assert "bus" in caught.value.message


def test_config_path_comes_from_danube_config(tmp_path: Path) -> None:
    path = write_config(tmp_path, "cluster_name: from-file\n")
    settings = load_settings(environ={"DANUBE_CONFIG": str(path)})
    assert settings.cluster_name == "from-file"
    # An explicit path wins over DANUBE_CONFIG.
    other = tmp_path / "other.yml"
    other.write_text("cluster_name: explicit\n", encoding="utf-8")
    assert load_settings(other, environ={"DANUBE_CONFIG": str(path)}).cluster_name == "explicit"


def test_settings_are_frozen(tmp_path: Path) -> None:
    settings = load_text(tmp_path, "cluster_name: c\n")
    with pytest.raises(ValidationError):
        settings.cluster_name = "other"  # type: ignore[misc]


# --- ${VAR} interpolation ----------------------------------------------------------------


def test_interpolation_fills_values_from_environment(tmp_path: Path) -> None:
    text = cloud_yaml("""
        backend: "s3"
        root: "s3://${BUCKET}/data"
        secret_key: "${AWS_SECRET_ACCESS_KEY}"
        region: "${AWS_REGION:-eu-central-1}"
        endpoint: "http://host:9000/$${literal}"
    """)
    environ = {"BUCKET": "b1", "AWS_SECRET_ACCESS_KEY": "s3cr3t"}
    cloud = load_text(tmp_path, text, environ).wal_cloud.cloud
    assert isinstance(cloud, S3Cloud)
    assert cloud.root == "s3://b1/data"
    assert cloud.secret_key == SecretStr("s3cr3t")
    assert cloud.region == "eu-central-1"
    assert cloud.endpoint == "http://host:9000/${literal}"


def test_interpolated_string_is_validated_as_the_field_type(tmp_path: Path) -> None:
    text = "wal_cloud:\n  wal:\n    cache_capacity: ${CACHE}\n"
    settings = load_text(tmp_path, text, {"CACHE": "2048"})
    assert settings.wal_cloud.wal.cache_capacity == 2048


def test_unset_variable_fails_naming_key_and_variable(tmp_path: Path) -> None:
    text = cloud_yaml("""
        backend: "s3"
        root: "s3://b/p"
        secret_key: "${AWS_SECRET_ACCESS_KEY}"
        session_token: "${AWS_SESSION_TOKEN}"
    """)
    error = load_error(tmp_path, text)
    assert [p.path for p in error.problems] == [
        "wal_cloud.cloud.secret_key",
        "wal_cloud.cloud.session_token",
    ]
    assert "AWS_SECRET_ACCESS_KEY" in error.problems[0].message
    assert error.problems[0].origin == "line 6"
    assert "wal_cloud.cloud.secret_key" in error.message


def test_keys_are_never_interpolated(tmp_path: Path) -> None:
    error = load_error(tmp_path, "bus:\n  ${KEY}: 1\n", {"KEY": "subject_prefix"})
    assert [p.path for p in error.problems] == ["bus.${KEY}"]


@pytest.mark.parametrize(
    ("text", "environ", "expected"),
    [
        ("plain $HOME stays", {}, "plain $HOME stays"),
        ("${A}${A}", {"A": "x"}, "xx"),
        ("${A:-d}", {"A": ""}, "d"),
        ("${A}", {"A": ""}, ""),
        ("${A:-}", {}, ""),
        ("$$", {}, "$"),
        ("${A}", {"A": "${B}"}, "${B}"),  # a value is never scanned again
    ],
)
def test_interpolate_value(text: str, environ: dict[str, str], expected: str) -> None:
    assert interpolate_value(text, environ) == expected


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("${UNSET}", "UNSET is not set"),
        ("${1BAD}", "bad reference"),
        ("${OPEN", "unclosed"),
        ("${A:-${B}}", "nested reference"),
        ("${A-x}", "bad reference"),
    ],
)
def test_interpolate_value_rejects(text: str, fragment: str) -> None:
    with pytest.raises(ValueError, match=re.escape(fragment)):
        interpolate_value(text, {})


# --- bad values: every problem, named by the path the user wrote ------------------------


def test_string_max_bytes_fails_with_key_path(tmp_path: Path) -> None:
    text = "wal_cloud:\n  wal:\n    rotation:\n      max_bytes: big\n"
    error = load_error(tmp_path, text)
    assert len(error.problems) == 1
    problem = error.problems[0]
    assert problem.path == "wal_cloud.wal.rotation.max_bytes"
    assert problem.message.startswith("Input should be a valid integer")
    assert problem.message.endswith("(got 'big')")
    assert problem.origin == "line 4"
    assert "wal_cloud.wal.rotation.max_bytes: Input should be a valid integer" in error.message
    assert error.source == tmp_path / "danube.yml"


def test_all_bad_values_are_reported(tmp_path: Path) -> None:
    text = """
        wal_cloud:
          wal:
            cache_capacity: -1
            rotation:
              max_bytes: big
        bus:
          servers: []
          request_timeout_s: 0
    """
    error = load_error(tmp_path, text)
    assert sorted(p.path for p in error.problems) == [
        "bus.request_timeout_s",
        "bus.servers",
        "wal_cloud.wal.cache_capacity",
        "wal_cloud.wal.rotation.max_bytes",
    ]
    assert "(4 problems)" in error.message


def test_unknown_keys_fail_naming_them(tmp_path: Path) -> None:
    text = """
        wal_cloud:
          wal:
            cache_capcity: 10
        buss: {}
    """
    error = load_error(tmp_path, text)
    paths = {p.path: p.message for p in error.problems}
    assert set(paths) == {"wal_cloud.wal.cache_capcity", "buss"}
    assert paths["buss"].startswith("Extra inputs are not permitted")


def test_cloud_errors_use_the_written_path_not_the_union_tag(tmp_path: Path) -> None:
    text = cloud_yaml("""
        backend: "s3"
        root: "s3://b/p"
        region: 5
        bucket: "x"
    """)
    error = load_error(tmp_path, text)
    assert [p.path for p in error.problems] == ["wal_cloud.cloud.region", "wal_cloud.cloud.bucket"]
    assert "s3" not in error.problems[0].path


def test_unknown_or_missing_backend_points_at_backend_key(tmp_path: Path) -> None:
    unknown = load_error(tmp_path, cloud_yaml('backend: "ftp"\nroot: "x"\n'))
    assert [p.path for p in unknown.problems] == ["wal_cloud.cloud.backend"]
    assert "'ftp'" in unknown.problems[0].message
    missing = load_error(tmp_path, cloud_yaml('root: "x"\n'))
    assert [p.path for p in missing.problems] == ["wal_cloud.cloud.backend"]


def test_missing_required_key_of_a_backend(tmp_path: Path) -> None:
    error = load_error(tmp_path, cloud_yaml('backend: "azblob"\nroot: "c/p"\n'))
    assert [(p.path, p.message) for p in error.problems] == [
        ("wal_cloud.cloud.endpoint", "Field required")
    ]


def test_error_from_environment_names_the_variable(tmp_path: Path) -> None:
    environ = {"DANUBE_WAL_CLOUD__WAL__CACHE_CAPACITY": "lots"}
    error = load_error(tmp_path, DANUBE_S3_EXAMPLE, environ)
    assert [(p.path, p.origin) for p in error.problems] == [
        ("wal_cloud.wal.cache_capacity", "from DANUBE_WAL_CLOUD__WAL__CACHE_CAPACITY")
    ]


def test_list_items_are_named_by_index(tmp_path: Path) -> None:
    error = load_error(tmp_path, "bus:\n  servers: ['nats://a:1', 5]\n")
    assert [p.path for p in error.problems] == ["bus.servers[1]"]


def test_secret_values_are_never_shown(tmp_path: Path) -> None:
    text = cloud_yaml('backend: "s3"\nroot: "b/p"\nsecret_key: 918273645\nregion: 7\n')
    error = load_error(tmp_path, text)
    assert [p.path for p in error.problems] == [
        "wal_cloud.cloud.region",
        "wal_cloud.cloud.secret_key",
    ]
    assert "918273645" not in error.message
    assert "(got 7)" in error.message
    settings = load_text(tmp_path, cloud_yaml('backend: "s3"\nroot: "b/p"\nsecret_key: hush1\n'))
    assert "hush1" not in repr(settings)
    assert "hush1" not in settings.model_dump_json()


# --- the file itself -------------------------------------------------------------------


def test_missing_file_fails(tmp_path: Path) -> None:
    missing = tmp_path / "nope.yml"
    with pytest.raises(ConfigError) as caught:
        load_settings(missing, environ={})
    assert caught.value.code == "bad_config"
    assert str(missing) in caught.value.message
    assert caught.value.source == missing


def test_directory_instead_of_file_fails(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="is not a file"):
        load_settings(tmp_path, environ={})


def test_yaml_syntax_error_reports_line(tmp_path: Path) -> None:
    error = load_error(tmp_path, "bus:\n  subject_prefix: a\n bad: b\n")
    assert len(error.problems) == 1
    assert error.problems[0].message.startswith("invalid YAML")
    assert error.problems[0].origin == "line 3, column 2"
    assert "line 3, column 2" in error.message


def test_duplicate_key_is_refused_with_its_line(tmp_path: Path) -> None:
    error = load_error(tmp_path, "bus:\n  subject_prefix: a\n  subject_prefix: b\n")
    assert "duplicate key 'subject_prefix'" in error.problems[0].message
    assert error.problems[0].origin is not None
    assert error.problems[0].origin.startswith("line 3")


def test_non_string_key_is_refused(tmp_path: Path) -> None:
    error = load_error(tmp_path, "bus:\n  on: 1\n")
    assert "keys must be strings" in error.problems[0].message


@pytest.mark.parametrize("text", ["- a\n- b\n", "just text\n", "42\n"])
def test_top_level_must_be_a_mapping(tmp_path: Path, text: str) -> None:
    error = load_error(tmp_path, text)
    assert "top level must be a mapping" in error.message


def test_empty_file_means_defaults(tmp_path: Path) -> None:
    assert load_text(tmp_path, "# nothing set\n") == load_settings(environ={})


def test_alias_bomb_is_refused(tmp_path: Path) -> None:
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    lines += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]" for i in range(1, 7)]
    error = load_error(tmp_path, "\n".join(lines) + "\n")
    assert "too large" in error.message


# --- the shipped deploy/config/danube.yml ----------------------------------------------


def _key_paths(value: Any, prefix: str = "") -> set[str]:
    if not isinstance(value, dict):
        return {prefix}
    paths: set[str] = set()
    for key, item in value.items():
        paths |= _key_paths(item, f"{prefix}.{key}" if prefix else key)
    return paths


def test_shipped_config_loads_and_equals_model_defaults() -> None:
    settings = load_settings(SHIPPED_CONFIG, environ={})
    assert settings == load_settings(environ={})


def test_shipped_config_names_every_key() -> None:
    import yaml

    written = yaml.safe_load(SHIPPED_CONFIG.read_text(encoding="utf-8"))
    defaults = load_settings(environ={}).model_dump(mode="json")
    assert _key_paths(written) == _key_paths(defaults)


def test_unknown_danube_variable_is_warned_not_fatal(caplog: pytest.LogCaptureFixture) -> None:
    environ = {"DANUBE_BUSS__SERVERS": "[]", "DANUBE_CONFIG": "", "DANUBE_BUS__SUBJECT_PREFIX": "x"}
    with caplog.at_level(logging.WARNING, logger="danube.config"):
        settings = load_settings(environ=environ)
    assert settings.bus.subject_prefix == "x"
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warned == ["environment variable DANUBE_BUSS__SERVERS matches no setting; ignored"]


def test_the_cli_variables_are_not_warned(caplog: pytest.LogCaptureFixture) -> None:
    # README's compose section exports DANUBE_SERVICE_ADDR for the CLI; `danube up` in that
    # shell passes it to every service (issue 35).
    environ = {"DANUBE_SERVICE_ADDR": "https://127.0.0.1:8080", "DANUBE_TOKEN": "t"}
    with caplog.at_level(logging.WARNING, logger="danube.config"):
        load_settings(environ=environ)
    assert [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING] == []


def test_every_variable_the_cli_reads_is_known_to_the_settings() -> None:
    import typer.main

    from danube.cli.main import app

    read: set[str] = set()
    commands = [typer.main.get_command(app)]
    while commands:
        command = commands.pop()
        commands += getattr(command, "commands", {}).values()
        for param in command.params:
            names = [param.envvar] if isinstance(param.envvar, str) else param.envvar or []
            read |= {name for name in names if name.startswith("DANUBE_")}
    assert read  # the walk found the CLI's variables
    sections = {name.upper() for name in DanubeSettings.model_fields}
    settings = {name for name in read if name[len("DANUBE_") :].split("__")[0] in sections}
    assert read - settings - PROCESS_VARIABLES == CLIENT_VARIABLES

"""`danube up`'s plan (danube.up.mesh): what the config file names holds for every child,
and --data-dir only fills in what the file leaves unset (issue 14 item 11); the banner names
each process's fixed metrics address (free ones with up_port_base 0)."""

from __future__ import annotations

from pathlib import Path

import pytest

from danube.config import load_settings
from danube.up.mesh import plan_mesh

pytestmark = pytest.mark.unit


def _envs(tmp_path: Path, text: str | None, **scale: int) -> dict[str, dict[str, str]]:
    config = None
    if text is not None:
        config = tmp_path / "my.yml"
        config.write_text(text)
    settings = load_settings(config, environ={})
    plan = plan_mesh(
        settings,
        data_dir=tmp_path / "data",
        scale=scale,
        services=["ingest", "uploader"],
        config_path=config,
    )
    return {spec.name: dict(spec.env) for spec in plan.specs}


def _child(env: dict[str, str]) -> tuple[Path, str]:
    """The WAL dir and objects root a child process ends up with, loaded as it would."""
    settings = load_settings(None, environ=env)
    return settings.wal_cloud.wal.dir, str(settings.wal_cloud.cloud.root)


def test_the_files_objects_root_and_wal_dir_hold(tmp_path: Path) -> None:
    envs = _envs(
        tmp_path,
        "wal_cloud:\n  wal: {dir: /srv/wal}\n  cloud: {backend: fs, root: /srv/objects}\n",
        ingest=2,
    )
    for name in ("ingest-0", "ingest-1"):
        wal_dir, root = _child(envs[name])
        assert wal_dir == Path("/srv/wal") / name  # per-node, under the configured dir
        assert root == "/srv/objects"
    assert _child(envs["uploader-0"])[1] == "/srv/objects"
    assert envs["ingest-0"]["DANUBE_CONFIG"] == str(tmp_path / "my.yml")


def test_the_data_dir_fills_in_what_the_file_leaves_unset(tmp_path: Path) -> None:
    envs = _envs(tmp_path, "wal_cloud:\n  wal: {cache_capacity: 7}\n")
    wal_dir, root = _child(envs["ingest-0"])
    assert wal_dir == tmp_path / "data" / "wal" / "ingest-0"
    assert root == str(tmp_path / "data" / "objects")
    assert load_settings(None, environ=envs["ingest-0"]).wal_cloud.wal.cache_capacity == 7


def test_without_a_file_everything_goes_under_the_data_dir(tmp_path: Path) -> None:
    envs = _envs(tmp_path, None)
    assert "DANUBE_CONFIG" not in envs["ingest-0"]
    wal_dir, root = _child(envs["ingest-0"])
    assert wal_dir == tmp_path / "data" / "wal" / "ingest-0"
    assert root == str(tmp_path / "data" / "objects")


def test_services_with_tls_are_probed_and_announced_over_https(tmp_path: Path) -> None:
    config = tmp_path / "tls.yml"
    tls = "  tls: {cert_file: s.pem, key_file: k.pem}\n"
    config.write_text(f"discovery:\n{tls}ingest:\n{tls}")
    plan = plan_mesh(
        load_settings(config, environ={}),
        data_dir=tmp_path / "data",
        scale={},
        services=["discovery", "ingest", "uploader"],
        config_path=config,
    )
    ready = {spec.name: spec.ready_url or "" for spec in plan.specs}
    assert ready["discovery-0"].startswith("https://127.0.0.1:8080/")
    assert ready["ingest-0"].startswith("https://127.0.0.1:")
    assert ready["uploader-0"].startswith("http://127.0.0.1:")
    assert (plan.urls["http"], plan.urls["grpc"]) == (
        "https://127.0.0.1:8080",
        "https://127.0.0.1:6650",
    )


def test_the_banner_names_each_process_metrics_address(tmp_path: Path) -> None:
    from danube.cli.up import metrics_banner

    plan = plan_mesh(
        load_settings(None, environ={}),
        data_dir=tmp_path / "data",
        scale={"ingest": 2},
        services=["ingest", "dispatcher"],
    )
    where, prometheus = metrics_banner(plan, Path("danube-data"))
    assert where == (
        "  metrics ingest-0 127.0.0.1:9400, ingest-1 127.0.0.1:9401, dispatcher-0 127.0.0.1:9480"
    )
    assert "deploy/observability/prometheus-local.yml" in prometheus
    assert "danube-data/prometheus/targets.json" in prometheus
    free = plan_mesh(
        load_settings(None, environ={"DANUBE_METRICS__UP_PORT_BASE": "0"}),
        data_dir=tmp_path / "data",
        services=["ingest"],
    )
    assert free.metrics["ingest-0"] != "127.0.0.1:9400"  # any free port

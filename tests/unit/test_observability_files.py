"""deploy/observability/: every metric the Grafana dashboard and the alert rules name is
one the services export (their prometheus_client families, as scraped), the rules pass
`promtool check rules` and both Prometheus files `promtool check config` (Debian's
prometheus package; `make setup-tools`), the compose profile's Prometheus loads those rules,
and the one for `make run` scrapes exactly the fixed ports `danube up` gives its processes."""

from __future__ import annotations

import importlib
import json
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client import REGISTRY

from danube.config import load_settings
from danube.up.mesh import SCRAPE_TARGETS_FILE, SERVICE_ORDER, plan_mesh, write_scrape_targets

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[2]
OBSERVABILITY = REPO / "deploy/observability"
RULES = OBSERVABILITY / "alerts.yml"
DASHBOARD = OBSERVABILITY / "danube-dashboard.json"
# Series Prometheus itself or prometheus_client's default collectors provide.
STANDARD = {"up", "process_start_time_seconds"}
_NAME = re.compile(r"\b(danube_[a-z0-9_]+|up|process_[a-z_]+)\b")


def exported_names() -> set[str]:
    """Every sample name the services can export: their metrics modules (and the lease
    counter of the shared process entry) registered, then each family's sample names."""
    for service in SERVICE_ORDER:
        importlib.import_module(f"danube.{service}.metrics")
    importlib.import_module("danube.runtime.service")
    names: set[str] = set()
    for family in REGISTRY.collect():
        names.add(family.name)
        suffixes = {
            "counter": ("_total", "_created"),
            "histogram": ("_bucket", "_sum", "_count", "_created"),
            "gauge": ("",),
        }.get(family.type, ("",))
        names.update(family.name + suffix for suffix in suffixes)
    return names


def dashboard_expressions() -> Iterator[str]:
    dashboard = json.loads(DASHBOARD.read_text())
    for panel in dashboard["panels"]:
        for target in panel.get("targets", []):
            yield target["expr"]
    for variable in dashboard["templating"]["list"]:
        if variable["type"] == "query":
            yield variable["definition"]


def rule_expressions() -> Iterator[tuple[str, str]]:
    rules: dict[str, Any] = yaml.safe_load(RULES.read_text())
    for group in rules["groups"]:
        for rule in group["rules"]:
            yield rule["alert"], rule["expr"]


def named_metrics(expression: str) -> set[str]:
    # Drop label matchers and strings first: label values may look like names.
    bare = re.sub(r'\{[^}]*\}|"[^"]*"', "", expression)
    return set(_NAME.findall(bare))


def test_every_metric_the_dashboard_names_is_exported() -> None:
    exported = exported_names() | STANDARD
    seen: set[str] = set()
    for expression in dashboard_expressions():
        names = named_metrics(expression)
        assert names, f"no metric in {expression!r}"
        assert names <= exported, f"{expression!r}: {sorted(names - exported)}"
        seen |= names
    # The per-topic and per-subscription series are all on it.
    for name in (
        "danube_topic_messages_in_total",
        "danube_topic_bytes_in_total",
        "danube_subscription_messages_out_total",
        "danube_subscription_bytes_out_total",
        "danube_subscription_backlog_messages",
        "danube_subscription_unacked_messages",
        "danube_subscription_consumers",
        "danube_subscription_redelivered_messages_total",
        "danube_subscription_dead_lettered_messages_total",
        "danube_partition_upload_lag_messages",
        "danube_topic_cloud_bytes",
    ):
        assert name in seen, name


def test_every_metric_the_alert_rules_name_is_exported() -> None:
    exported = exported_names() | STANDARD
    alerts = dict(rule_expressions())
    for alert, expression in alerts.items():
        names = named_metrics(expression)
        assert names, alert
        assert names <= exported, f"{alert}: {sorted(names - exported)}"
    for wanted in (
        "DanubeUnderReplicatedPartitions",
        "DanubeBacklogGrowing",
        "DanubeUploaderLagging",
        "DanubeFsyncSlow",
        "DanubeWalDiskFreeLow",
        "DanubeLeaseLost",
    ):
        assert wanted in alerts, wanted


def test_the_name_check_rejects_a_metric_nobody_exports() -> None:
    assert named_metrics('sum(rate(danube_topic_mesages_in_total{topic="x"}[5m]))') == {
        "danube_topic_mesages_in_total"
    }
    assert "danube_topic_mesages_in_total" not in exported_names()


def _promtool(*args: str) -> subprocess.CompletedProcess[str]:
    promtool = shutil.which("promtool")
    assert promtool is not None, "promtool not found: run `make setup-tools` (prometheus)"
    return subprocess.run(
        [promtool, "check", *args], capture_output=True, text=True, timeout=60, check=False
    )


def test_promtool_accepts_the_rules() -> None:
    result = _promtool("rules", str(RULES))
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(dict(rule_expressions()))} rules found" in result.stdout


def test_promtool_accepts_the_compose_prometheus_file(tmp_path: Path) -> None:
    # Its rule file is where compose mounts this directory, /etc/prometheus: here, beside it.
    text = (OBSERVABILITY / "prometheus.yml").read_text()
    (tmp_path / "prometheus.yml").write_text(
        text.replace("/etc/prometheus/alerts.yml", "alerts.yml")
    )
    (tmp_path / "alerts.yml").write_text(RULES.read_text())
    result = _promtool("config", str(tmp_path / "prometheus.yml"))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


# `make run ARGS="--scale ingest=2 --scale discovery=2"`: every process and its port.
FIXED_PORTS = {
    "ingest-0": 9400,
    "ingest-1": 9401,
    "cloud_reader-0": 9420,
    "uploader-0": 9440,
    "retention-0": 9460,
    "dispatcher-0": 9480,
    "discovery-0": 8080,  # its API port, where it serves /metrics
    "discovery-1": 9501,
}


def test_the_make_run_prometheus_scrapes_the_fixed_ports_danube_up_gives(tmp_path: Path) -> None:
    # The repository as `make run` sees it: the shipped file, and the targets `danube up`
    # writes under its default data directory (./danube-data), which the file names.
    observability = tmp_path / "deploy" / "observability"
    observability.mkdir(parents=True)
    local = observability / "prometheus-local.yml"
    local.write_text((OBSERVABILITY / "prometheus-local.yml").read_text())
    (observability / "alerts.yml").write_text(RULES.read_text())
    settings = load_settings(None, environ={})
    plan = plan_mesh(
        settings, data_dir=tmp_path / "danube-data", scale={"ingest": 2, "discovery": 2}
    )
    written = write_scrape_targets(plan, tmp_path / "danube-data")
    assert written == tmp_path / "danube-data" / SCRAPE_TARGETS_FILE
    config = yaml.safe_load(local.read_text())
    assert config["rule_files"] == ["alerts.yml"]
    (job,) = config["scrape_configs"]
    assert job["job_name"] == "danube"  # what the rules and the dashboard select
    (sd,) = job["file_sd_configs"]
    assert [(local.parent / name).resolve() for name in sd["files"]] == [written]
    # promtool reads the targets file too: the path resolves and its groups are valid.
    result = _promtool("config", str(local))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "WARNING" not in result.stdout + result.stderr
    # Every service process is a target, on the port it is told to serve metrics on.
    groups = json.loads(written.read_text())
    targets = {group["labels"]["node"]: group for group in groups}
    told = {
        spec.name: int(
            spec.env.get(f"DANUBE_{spec.name.rsplit('-', 1)[0].upper()}__METRICS_PORT")
            or spec.env[f"DANUBE_{spec.name.rsplit('-', 1)[0].upper()}__PORT"]
        )
        for spec in plan.specs
        if spec.name.rsplit("-", 1)[0] in SERVICE_ORDER
    }
    assert told == FIXED_PORTS
    assert {node: group["targets"] for node, group in targets.items()} == {
        node: [f"127.0.0.1:{port}"] for node, port in FIXED_PORTS.items()
    }
    assert {node: group["labels"]["service"] for node, group in targets.items()} == {
        node: node.rsplit("-", 1)[0] for node in FIXED_PORTS
    }


def test_the_compose_prometheus_loads_the_rules_and_scrapes_every_service() -> None:
    config = yaml.safe_load((OBSERVABILITY / "prometheus.yml").read_text())
    assert config["rule_files"] == ["/etc/prometheus/alerts.yml"]  # ./deploy/observability
    (job,) = config["scrape_configs"]
    names = {name for sd in job["dns_sd_configs"] for name in sd["names"]}
    assert names == set(SERVICE_ORDER)
    provisioned = yaml.safe_load((OBSERVABILITY / "grafana/dashboards/danube.yml").read_text())
    assert provisioned["providers"][0]["options"]["path"] == "/var/lib/grafana/dashboards"

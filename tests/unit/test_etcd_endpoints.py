"""The etcd members of the config: the list, Danube's single (or comma-separated) key, the
environment replacing the file's, and the client's parsing of them."""

from __future__ import annotations

from pathlib import Path

import pytest

from danube.config import ConfigError, load_settings
from danube.meta.client import member_failed, split_endpoints
from danube.meta.errors import (
    MetaAuthError,
    MetaRequestError,
    MetaTimeoutError,
    MetaUnavailableError,
)

pytestmark = pytest.mark.unit

VARIABLE = "DANUBE_WAL_CLOUD__METADATA__ETCD_ENDPOINT"
LIST_VARIABLE = "DANUBE_WAL_CLOUD__METADATA__ETCD_ENDPOINTS"


def _file(tmp_path: Path, metadata: str) -> Path:
    path = tmp_path / "danube.yml"
    path.write_text(f"wal_cloud:\n  metadata:\n{metadata}")
    return path


def test_the_list_and_danubes_key_name_the_same_members(tmp_path: Path) -> None:
    listed = load_settings(_file(tmp_path, '    etcd_endpoints: ["a:1", "b:2"]\n'), environ={})
    single = load_settings(_file(tmp_path, '    etcd_endpoint: "a:1"\n'), environ={})
    several = load_settings(_file(tmp_path, '    etcd_endpoint: "a:1, b:2"\n'), environ={})
    assert listed.wal_cloud.metadata.etcd_endpoints == ["a:1", "b:2"]
    assert single.wal_cloud.metadata.etcd_endpoints == ["a:1"]
    assert several.wal_cloud.metadata.etcd_endpoints == ["a:1", "b:2"]
    assert load_settings(None, environ={}).wal_cloud.metadata.etcd_endpoints == ["127.0.0.1:2379"]


def test_both_keys_in_one_place_is_an_error(tmp_path: Path) -> None:
    text = '    etcd_endpoints: ["a:1"]\n    etcd_endpoint: "b:2"\n'
    with pytest.raises(ConfigError, match="set etcd_endpoints or etcd_endpoint"):
        load_settings(_file(tmp_path, text), environ={})


@pytest.mark.parametrize(
    ("variable", "value"), [(VARIABLE, "c:3,d:4"), (LIST_VARIABLE, '["c:3", "d:4"]')]
)
def test_a_variable_replaces_the_files_members_whichever_key(
    tmp_path: Path, variable: str, value: str
) -> None:
    for written in ('    etcd_endpoints: ["a:1"]\n', '    etcd_endpoint: "a:1"\n'):
        settings = load_settings(_file(tmp_path, written), environ={variable: value})
        assert settings.wal_cloud.metadata.etcd_endpoints == ["c:3", "d:4"]


@pytest.mark.parametrize(
    "bad",
    [
        "etcd_endpoints: []",
        'etcd_endpoints: ["a"]',
        'etcd_endpoint: "a:1,,b:2"',
        'etcd_endpoint: "x/y:1"',
    ],
)
def test_bad_members_fail_at_start(tmp_path: Path, bad: str) -> None:
    with pytest.raises(ConfigError, match=r"wal_cloud\.metadata"):
        load_settings(_file(tmp_path, f"    {bad}\n"), environ={})


def test_split_endpoints() -> None:
    assert split_endpoints("a:1") == ("a:1",)
    assert split_endpoints("a:1, b:2,") == ("a:1", "b:2")
    assert split_endpoints(["a:1", "b:2,c:3"]) == ("a:1", "b:2", "c:3")


def test_only_failures_of_the_member_move_the_client() -> None:
    assert member_failed(MetaUnavailableError("etcd get: connection refused"))
    assert member_failed(MetaTimeoutError("etcd get: no answer within the deadline"))
    assert not member_failed(MetaRequestError("etcd txn: too many operations"))
    assert not member_failed(MetaAuthError("etcd get: permission denied"))

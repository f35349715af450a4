"""Cloud config → OpenDAL scheme and options, exactly, for every backend; bad settings refused."""

from __future__ import annotations

import base64
import json
import os
from pathlib import Path
from typing import Any

import opendal
import pytest
from pydantic import TypeAdapter

from danube.config.wal_cloud import CloudConfig
from danube.storage import (
    PARTIAL_DIR,
    ObjectStore,
    StorageConfigError,
    open_operator,
    operator_options,
    split_root,
)

pytestmark = pytest.mark.unit

_CLOUD: TypeAdapter[Any] = TypeAdapter(CloudConfig)
SERVICE_ACCOUNT = {"type": "service_account", "project_id": "p", "client_email": "a@p.example"}


def cloud(**fields: object) -> Any:
    """A cloud section as the settings loader makes it (validated, secrets as SecretStr)."""
    return _CLOUD.validate_python(fields)


# --- s3 ------------------------------------------------------------------------------------


def test_s3_static_keys_on_a_custom_endpoint() -> None:
    section = cloud(
        backend="s3",
        root="s3://danube-bucket/mesh/objects",
        region="eu-west-1",
        endpoint="http://127.0.0.1:9000",
        access_key="AKIA",
        secret_key="s3cr3t",
    )
    assert operator_options(section) == (
        "s3",
        {
            "bucket": "danube-bucket",
            "root": "/mesh/objects",
            "region": "eu-west-1",
            "endpoint": "http://127.0.0.1:9000",
            "access_key_id": "AKIA",
            "secret_access_key": "s3cr3t",
            "disable_config_load": "true",
            "disable_ec2_metadata": "true",
        },
    )


def test_s3_defaults_leave_credentials_to_the_aws_chain() -> None:
    assert operator_options(cloud(backend="s3", root="danube-bucket")) == (
        "s3",
        {"bucket": "danube-bucket", "root": "/", "region": "us-east-1"},
    )


def test_s3_profile_role_session_token_and_virtual_host_style() -> None:
    section = cloud(
        backend="s3",
        root="b1/p/",
        access_key="AKIA",
        secret_key="s",
        session_token="tok",
        profile="prod",
        role_arn="arn:aws:iam::1:role/danube",
        virtual_host_style=True,
    )
    # A profile or role needs the config files: config loading stays on.
    assert operator_options(section)[1] == {
        "bucket": "b1",
        "root": "/p",
        "region": "us-east-1",
        "access_key_id": "AKIA",
        "secret_access_key": "s",
        "session_token": "tok",
        "profile": "prod",
        "role_arn": "arn:aws:iam::1:role/danube",
        "enable_virtual_host_style": "true",
    }


def test_s3_anonymous_skips_signing() -> None:
    assert operator_options(cloud(backend="s3", root="s3://public", anonymous=True))[1] == {
        "bucket": "public",
        "root": "/",
        "region": "us-east-1",
        "skip_signature": "true",
        "disable_config_load": "true",
        "disable_ec2_metadata": "true",
    }


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({"root": "s3://b", "access_key": "a"}, "secret_key"),
        ({"root": "s3://b", "secret_key": "s"}, "secret_key"),
        ({"root": "s3://b", "anonymous": True, "access_key": "a", "secret_key": "s"}, "anonymous"),
        ({"root": "gcs://b/p"}, "root"),
        ({"root": "s3:///p"}, "root"),
        ({"root": ""}, "root"),
        ({"root": "b/a/../c"}, "root"),
        ({"root": "b/a//c"}, "root"),
    ],
)
def test_s3_bad_settings_are_refused(fields: dict[str, object], field: str) -> None:
    with pytest.raises(StorageConfigError) as info:
        operator_options(cloud(backend="s3", **fields))
    assert info.value.field == field
    assert info.value.code == "storage_config"
    assert f"wal_cloud.cloud.{field}" in str(info.value)


# --- gcs -----------------------------------------------------------------------------------


def test_gcs_json_credentials_become_base64() -> None:
    raw = json.dumps(SERVICE_ACCOUNT)
    section = cloud(
        backend="gcs",
        root="gcs://danube-bucket/objects",
        project="my-project",
        credentials_json=raw,
        endpoint="https://storage.googleapis.com",
    )
    scheme, options = operator_options(section)
    assert scheme == "gcs"
    assert options == {
        "bucket": "danube-bucket",
        "root": "/objects",
        "endpoint": "https://storage.googleapis.com",
        "credential": base64.b64encode(raw.encode()).decode(),
    }
    assert json.loads(base64.b64decode(options["credential"])) == SERVICE_ACCOUNT


def test_gcs_base64_credentials_pass_through_and_gs_scheme() -> None:
    encoded = base64.b64encode(json.dumps(SERVICE_ACCOUNT).encode()).decode()
    section = cloud(backend="gcs", root="gs://b2", credentials_json=encoded)
    assert operator_options(section) == (
        "gcs",
        {"bucket": "b2", "root": "/", "credential": encoded},
    )


def test_gcs_credentials_path() -> None:
    section = cloud(backend="gcs", root="b3/x/y", credentials_path="/etc/gcs/sa.json")
    assert operator_options(section)[1] == {
        "bucket": "b3",
        "root": "/x/y",
        "credential_path": "/etc/gcs/sa.json",
    }


@pytest.mark.parametrize("credentials", ["{not json", "%%%", base64.b64encode(b"[1]").decode()])
def test_gcs_bad_credentials_are_refused(credentials: str) -> None:
    with pytest.raises(StorageConfigError) as info:
        operator_options(cloud(backend="gcs", root="b", credentials_json=credentials))
    assert info.value.field == "credentials_json"
    assert credentials not in str(info.value)  # never echo a secret


# --- azblob --------------------------------------------------------------------------------


def test_azblob_container_prefix_endpoint_and_account() -> None:
    section = cloud(
        backend="azblob",
        root="danube-container/mesh",
        endpoint="https://acct.blob.core.windows.net",
        account_name="acct",
        account_key="a2V5",
    )
    assert operator_options(section) == (
        "azblob",
        {
            "container": "danube-container",
            "root": "/mesh",
            "endpoint": "https://acct.blob.core.windows.net",
            "account_name": "acct",
            "account_key": "a2V5",
        },
    )


def test_azblob_minimal_and_scheme_form() -> None:
    section = cloud(backend="azblob", root="azblob://c1", endpoint="http://127.0.0.1:10000/dev")
    assert operator_options(section)[1] == {
        "container": "c1",
        "root": "/",
        "endpoint": "http://127.0.0.1:10000/dev",
    }


# --- fs and memory -------------------------------------------------------------------------


def test_fs_root_is_made_absolute_with_a_partial_dir_inside(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    scheme, options = operator_options(cloud(backend="fs", root="./data/objects/"))
    root = str(tmp_path / "data" / "objects")
    assert scheme == "fs"
    assert options == {"root": root, "atomic_write_dir": os.path.join(root, PARTIAL_DIR)}


def test_fs_default_root_and_absolute_root(tmp_path: Path) -> None:
    options = operator_options(cloud(backend="fs"))[1]
    assert options["root"] == os.path.abspath("./danube-data/objects")
    assert operator_options(cloud(backend="fs", root=str(tmp_path)))[1]["root"] == str(tmp_path)


def test_memory_root() -> None:
    assert operator_options(cloud(backend="memory")) == ("memory", {"root": "/danube"})
    assert operator_options(cloud(backend="memory", root="/a/b/")) == ("memory", {"root": "/a/b"})


def test_split_root_forms() -> None:
    assert split_root("s3://b/a/b/", ("s3",)) == ("b", "/a/b")
    assert split_root("b", ("s3",)) == ("b", "/")
    with pytest.raises(StorageConfigError):
        split_root("http://b/a", ("s3",))


# --- building operators (no I/O) -----------------------------------------------------------


@pytest.mark.parametrize(
    "fields",
    [
        {"backend": "s3", "root": "s3://b/p", "access_key": "a", "secret_key": "s"},
        {"backend": "gcs", "root": "gcs://b/p", "credentials_path": "/nonexistent.json"},
        {"backend": "azblob", "root": "c/p", "endpoint": "http://127.0.0.1:1/acct"},
        {"backend": "memory"},
    ],
)
def test_opendal_accepts_every_mapping(fields: dict[str, object]) -> None:
    assert isinstance(open_operator(cloud(**fields)), opendal.AsyncOperator)


async def test_store_from_memory_config_round_trips() -> None:
    store = ObjectStore.from_config(cloud(backend="memory", root="unit"))
    await store.write("a/b.dnb", b"bytes")
    assert await store.read("a/b.dnb") == b"bytes"

"""Where a cloud section points: what is recorded in etcd (never a credential, an fs root made
absolute), the one line errors name, a missing object's error naming it, and the recorded
section turned back into settings under the reader's own variables."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from pydantic import SecretStr, TypeAdapter

from danube.config import load_settings
from danube.config.wal_cloud import (
    AzblobCloud,
    CloudConfig,
    FsCloud,
    GcsCloud,
    MemoryCloud,
    S3Cloud,
)
from danube.meta.records import ObjectStoreRecord
from danube.spark.options import (
    backend_given,
    parse_options,
    recorded_cloud_environment,
    without_cloud,
)
from danube.storage import ObjectNotFoundError, ObjectStore
from danube.storage.location import CREDENTIAL_KEYS, describe, public_settings

pytestmark = pytest.mark.unit

_CLOUD: TypeAdapter[Any] = TypeAdapter(CloudConfig)

S3_FULL = {
    "backend": "s3",
    "root": "s3://bucket/mesh",
    "region": "eu-west-1",
    "endpoint": "http://127.0.0.1:9000",
    "access_key": "AKIA-ID",
    "secret_key": "s3cr3t",
    "session_token": "tok3n",
    "virtual_host_style": True,
}
EVERY_BACKEND = [
    S3_FULL,
    {"backend": "s3", "root": "b", "profile": "p", "role_arn": "arn:aws:iam::1:role/r"},
    {"backend": "gcs", "root": "gs://b/x", "project": "p", "credentials_json": '{"type": "sa"}'},
    {"backend": "gcs", "root": "b", "credentials_path": "/keys/sa.json"},
    {
        "backend": "azblob",
        "root": "c/x",
        "endpoint": "http://127.0.0.1:10000/acct",
        "account_name": "acct",
        "account_key": "a2V5",
    },
    {"backend": "fs", "root": "objects"},
    {"backend": "memory", "root": "danube"},
]


@pytest.mark.parametrize("section", EVERY_BACKEND, ids=lambda s: s["backend"])
def test_no_credential_and_no_secret_is_ever_recorded(section: dict[str, Any]) -> None:
    cloud = _CLOUD.validate_python(section)
    public = public_settings(cloud)
    assert not set(public) & CREDENTIAL_KEYS
    secrets = {
        name
        for name in type(cloud).model_fields
        if isinstance(getattr(cloud, name), SecretStr) or name in CREDENTIAL_KEYS
    }
    for name in secrets:
        value = getattr(cloud, name)
        shown = value.get_secret_value() if isinstance(value, SecretStr) else value
        assert shown not in public.values()
    # What is recorded is a valid record, and loads back as the same place.
    record = ObjectStoreRecord(cloud=public, recorded_by="uploader-1", updated_ms=1)
    again = _CLOUD.validate_python(record.cloud)
    assert public_settings(again) == public


def test_the_recorded_s3_section_is_where_not_who() -> None:
    assert public_settings(_CLOUD.validate_python(S3_FULL)) == {
        "backend": "s3",
        "root": "s3://bucket/mesh",
        "region": "eu-west-1",
        "endpoint": "http://127.0.0.1:9000",
        "anonymous": False,
        "virtual_host_style": True,
    }


def test_an_fs_root_is_recorded_absolute(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    public = public_settings(FsCloud(backend="fs", root="./danube-data/objects"))
    assert public == {"backend": "fs", "root": str(tmp_path / "danube-data" / "objects")}


def test_describe_names_backend_root_and_endpoint() -> None:
    assert describe(_CLOUD.validate_python(S3_FULL)) == "s3://bucket/mesh at http://127.0.0.1:9000"
    assert describe(S3Cloud(backend="s3", root="bucket/x")) == "s3://bucket/x"
    assert describe(GcsCloud(backend="gcs", root="b/x")) == "gcs://b/x"
    assert describe(AzblobCloud(backend="azblob", root="c", endpoint="http://h/a")) == (
        "azblob://c at http://h/a"
    )
    assert describe(FsCloud(backend="fs", root="/srv/objects")) == "fs:/srv/objects"
    assert describe(MemoryCloud(backend="memory", root="m")) == "memory:m"


async def test_a_missing_object_names_where_the_store_looked() -> None:
    store = ObjectStore.from_config(MemoryCloud(backend="memory", root="unit-location"))
    with pytest.raises(ObjectNotFoundError) as missing:
        await store.read("danube-data/topics/default/t/x.dnb")
    assert missing.value.message == (
        "object not found: 'danube-data/topics/default/t/x.dnb' in memory:unit-location"
    )
    assert missing.value.location == "memory:unit-location"
    explained = ObjectStore.from_config(MemoryCloud(backend="memory"), location="there (why)")
    with pytest.raises(ObjectNotFoundError, match=r"'k' in there \(why\)$"):
        await explained.stat("k")


def test_the_recorded_section_loads_under_the_readers_own_variables() -> None:
    recorded = public_settings(_CLOUD.validate_python(S3_FULL))
    recorded["from_a_newer_version"] = "ignored"
    base = recorded_cloud_environment(recorded)
    assert "DANUBE_WAL_CLOUD__CLOUD__FROM_A_NEWER_VERSION" not in base
    assert base["DANUBE_WAL_CLOUD__CLOUD__VIRTUAL_HOST_STYLE"] == "true"
    # The reader's credentials (and any key it sets) win over the recorded ones.
    own = {
        "DANUBE_WAL_CLOUD__CLOUD__ACCESS_KEY": "mine",
        "DANUBE_WAL_CLOUD__CLOUD__SECRET_KEY": "my-secret",
        "DANUBE_WAL_CLOUD__CLOUD__REGION": "us-east-2",
    }
    cloud = load_settings(None, environ={**base, **own}).wal_cloud.cloud
    assert isinstance(cloud, S3Cloud)
    assert (cloud.root, cloud.endpoint, cloud.region) == (
        "s3://bucket/mesh",
        "http://127.0.0.1:9000",
        "us-east-2",
    )
    assert cloud.access_key == "mine"
    assert cloud.secret_key is not None
    assert cloud.secret_key.get_secret_value() == "my-secret"


def test_cloud_keys_given_by_options_or_variables() -> None:
    options = parse_options({"topic": "/default/t", "wal_cloud.cloud.secret_key": "s"})
    env = {"DANUBE_WAL_CLOUD__CLOUD__ACCESS_KEY": "a", "HOME": os.environ.get("HOME", "/")}
    assert not backend_given(options, env)
    assert backend_given(options, {**env, "DANUBE_WAL_CLOUD__CLOUD__BACKEND": "fs"})
    bare_options, bare_env = without_cloud(options, env)
    assert bare_options.overrides == {}
    assert bare_env == {"HOME": env["HOME"]}

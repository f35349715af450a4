"""The cluster's object store in real etcd: recorded once however often an uploader starts,
replaced when the config changes; a backfill's settings given only etcd take the recorded
store (the reader's credentials laid over it, or the S3 server's keys from AWS_* variables),
while a config file or a named backend wins; with nothing recorded, the error of a missing
object says so."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
import yaml

from danube.config.wal_cloud import FsCloud, S3Cloud
from danube.frame import Record, encode_frame, encode_record
from danube.meta import MetaStore
from danube.meta import keys as meta_keys
from danube.meta.records import ObjectStoreRecord, TopicConfig
from danube.names import TopicName
from danube.spark.catalog import SourceSettings, check_first_object, source_settings
from danube.spark.options import ReadOptions, parse_options
from danube.storage import (
    ObjectDescriptor,
    ObjectNotFoundError,
    ObjectStore,
    SparseIndexBuilder,
    object_key,
)
from danube.up.servers import MOTO_ACCESS_KEY, moto_cloud
from danube.uploader.record import record_object_store

pytestmark = pytest.mark.integration

S3 = moto_cloud("http://127.0.0.1:9", "recorded-bucket")
TOPIC = TopicName("default", "t")
KEY = object_key("/danube-data", "default", "t", 0, 0)


async def _one_object(store: MetaStore, objects: ObjectStore) -> None:
    """``TOPIC`` with one object of one message, as the uploader leaves it."""
    frame = encode_frame(0, encode_record(Record(payload=b"x", publish_time_ms=1, producer="t")))
    builder = SparseIndexBuilder(4096)
    builder.add(0, 0, len(frame))
    await objects.write(KEY, frame)
    descriptor = ObjectDescriptor.from_builder(KEY, builder, created_ms=1)
    await store.put(meta_keys.object_descriptor_key(TOPIC, 0), descriptor.to_bytes())
    await store.put_model(meta_keys.topic_key(TOPIC), TopicConfig(partitions=0, created_ms=1))


async def _resolve(options: ReadOptions, environ: dict[str, str]) -> SourceSettings:
    """source_settings, off the event loop (it runs one of its own to read etcd)."""
    return await asyncio.to_thread(source_settings, options, environ)


def _only_etcd(etcd_endpoint: str, meta_prefix: str, **more: str) -> dict[str, str]:
    return {"topic": "/default/t", "etcd_endpoint": etcd_endpoint, "prefix": meta_prefix, **more}


async def test_recorded_once_per_config_and_replaced_when_it_changes(
    store: MetaStore, tmp_path: Path
) -> None:
    first = FsCloud(backend="fs", root=str(tmp_path / "a"))
    assert await record_object_store(store, first, "uploader-1")
    found = await store.get_model_kv(meta_keys.OBJECT_STORE_KEY, ObjectStoreRecord)
    assert found is not None
    record, kv = found
    assert record.cloud == {"backend": "fs", "root": str(tmp_path / "a")}
    # Every other start with the same config writes nothing (same revision).
    assert not await record_object_store(store, first, "uploader-2")
    again = await store.get(meta_keys.OBJECT_STORE_KEY)
    assert again is not None
    assert again.mod_revision == kv.mod_revision
    assert await record_object_store(store, S3, "uploader-2")
    changed = await store.get_model(meta_keys.OBJECT_STORE_KEY, ObjectStoreRecord)
    assert changed is not None
    assert changed.recorded_by == "uploader-2"
    assert "secret_key" not in changed.cloud
    assert "access_key" not in changed.cloud


async def test_given_only_etcd_a_backfill_reads_where_the_cluster_records(
    store: MetaStore, etcd_endpoint: str, meta_prefix: str, tmp_path: Path
) -> None:
    await record_object_store(store, S3, "uploader-1")
    options = parse_options(_only_etcd(etcd_endpoint, meta_prefix))
    found = await _resolve(options, {})
    cloud = found.settings.wal_cloud.cloud
    assert isinstance(cloud, S3Cloud)
    assert cloud.model_dump(exclude={"access_key", "secret_key"}) == S3.model_dump(
        exclude={"access_key", "secret_key"}
    )
    assert cloud.access_key is None  # credentials: from the reader's environment only
    assert found.location == (
        "s3://recorded-bucket/danube at http://127.0.0.1:9 (recorded in etcd by uploader-1)"
    )
    # Credentials alone, from variables or options, over the recorded store.
    env = {"DANUBE_WAL_CLOUD__CLOUD__ACCESS_KEY": "reader"}
    with_keys = parse_options(
        _only_etcd(etcd_endpoint, meta_prefix, **{"wal_cloud.cloud.secret_key": "s"})
    )
    keyed = (await _resolve(with_keys, env)).settings.wal_cloud.cloud
    assert isinstance(keyed, S3Cloud)
    assert keyed.model_dump(exclude={"access_key", "secret_key"}) == S3.model_dump(
        exclude={"access_key", "secret_key"}
    )
    assert keyed.access_key == "reader"
    # A named backend, or a config file's section, is used as given.
    named = {"DANUBE_WAL_CLOUD__CLOUD__BACKEND": "memory"}
    assert (await _resolve(options, named)).settings.wal_cloud.cloud.backend == "memory"
    config = tmp_path / "danube.yml"
    config.write_text(yaml.safe_dump({"wal_cloud": {"cloud": {"backend": "fs", "root": "/x"}}}))
    from_file = parse_options({**_only_etcd(etcd_endpoint, meta_prefix), "config": str(config)})
    given = await _resolve(from_file, {})
    assert given.settings.wal_cloud.cloud == FsCloud(backend="fs", root="/x")
    assert given.location == "fs:/x (as configured)"


async def test_with_nothing_recorded_a_missing_object_says_where_and_why(
    store: MetaStore,
    etcd_endpoint: str,
    meta_prefix: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.chdir(tmp_path)  # the default root is relative: not in the repository
    cloud = FsCloud(backend="fs", root=str(tmp_path / "objects"))
    await _one_object(store, ObjectStore.from_config(cloud))
    options = parse_options(_only_etcd(etcd_endpoint, meta_prefix))
    found = await _resolve(options, {})
    with pytest.raises(ObjectNotFoundError) as missing:
        await check_first_object(found, options.topic)
    default_root = tmp_path / "danube-data" / "objects"
    assert missing.value.message == (
        f"object not found: '{KEY}' in fs:{default_root} (the default: none configured, "
        f"none recorded in etcd under {meta_prefix})"
    )
    await record_object_store(store, cloud, "uploader-1")
    await check_first_object(await _resolve(options, {}), options.topic)


async def test_given_only_etcd_s3_credentials_come_from_the_readers_environment(
    store: MetaStore,
    etcd_endpoint: str,
    meta_prefix: str,
    s3_endpoint: str,
    s3_bucket: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    cloud = moto_cloud(s3_endpoint, s3_bucket)
    await _one_object(store, ObjectStore.from_config(cloud))
    await record_object_store(store, cloud, "uploader-1")  # without the keys
    # The backend's own chain: AWS_* variables, as for any S3 client.
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", MOTO_ACCESS_KEY)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", MOTO_ACCESS_KEY)
    options = parse_options(_only_etcd(etcd_endpoint, meta_prefix))
    found = await _resolve(options, {})
    assert found.settings.wal_cloud.cloud.model_dump(exclude_none=True) == cloud.model_dump(
        exclude={"access_key", "secret_key"}, exclude_none=True
    )
    await check_first_object(found, options.topic)  # found, read with the environment's keys

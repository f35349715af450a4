"""ObjectStore on a real fs root and a real S3 server (moto), the same tests on both; memory too."""

from __future__ import annotations

import hashlib
from pathlib import Path

import boto3
import pytest

from danube.config import CloudConfig
from danube.config.wal_cloud import FsCloud, MemoryCloud
from danube.frame import append_frame, decode_frames
from danube.storage import (
    PARTIAL_DIR,
    ObjectDescriptor,
    ObjectNotFoundError,
    ObjectRangeError,
    ObjectStore,
    SparseIndexBuilder,
    StorageError,
    StorageUnavailableError,
    object_key,
)
from danube.up import free_port, moto_cloud

pytestmark = pytest.mark.integration

MiB = 1024 * 1024


@pytest.fixture
def store(cloud_config: CloudConfig) -> ObjectStore:
    """The same store API on a local directory and on the S3 server, in a fresh root each."""
    return ObjectStore.from_config(cloud_config, write_chunk_bytes=5 * MiB)


def pattern(size: int, seed: int = 0) -> bytes:
    """Bytes where every position differs from its neighbours, so an off-by-one shows."""
    return bytes((i * 7 + seed) % 251 for i in range(size))


async def test_write_read_stat_delete(store: ObjectStore) -> None:
    key = object_key("/danube-data", "default", "orders", 0, 99)
    data = pattern(10_000)
    await store.write(key, data)
    assert await store.read(key) == data
    assert await store.stat(key) == len(data)
    await store.write(key, b"replaced")
    assert await store.read(key) == b"replaced"
    await store.delete(key)
    assert not await store.exists(key)
    await store.delete(key)  # deleting what is gone is fine


async def test_missing_objects_raise_object_not_found(store: ObjectStore) -> None:
    for call in (store.read("no/such"), store.stat("no/such"), store.read_range("no/such", 0, 4)):
        with pytest.raises(ObjectNotFoundError) as info:
            await call
        assert info.value.key == "no/such"
        assert info.value.code == "object_not_found"
        assert not info.value.retriable


async def test_range_read_returns_exactly_the_bytes_asked(store: ObjectStore) -> None:
    data = pattern(100_000, seed=3)
    await store.write("r/obj", data)
    for start, length in [(0, 1), (0, 16), (12_345, 678), (99_990, 10), (50_000, 50_000)]:
        assert await store.read_range("r/obj", start, length) == data[start : start + length]
    for start, length in [(99_990, 11), (100_000, 1), (200_000, 5)]:
        with pytest.raises(ObjectRangeError) as info:
            await store.read_range("r/obj", start, length)
        assert info.value.size_bytes == len(data)
        assert (info.value.start, info.value.length) == (start, length)


async def test_list_returns_sorted_keys_under_the_prefix_only(store: ObjectStore) -> None:
    ranges = [(300, 399), (0, 99), (200, 299), (100, 199)]
    keys = [object_key("/danube-data", "ns", "t", start, end) for start, end in ranges]
    others = [
        object_key("/danube-data", "ns", "t2", 0, 9),  # sibling topic: a longer prefix
        object_key("/danube-data", "ns2", "t", 0, 9),
        "danube-data/other.txt",
    ]
    for key in keys + others:
        await store.write(key, b"frames")
    listed = await store.list("danube-data/topics/ns/t")
    assert listed == sorted(keys)
    assert listed[0].endswith("00000000000000000000-00000000000000000099.dnb")
    assert await store.list("danube-data/topics/ns/t/") == listed
    assert await store.list("") == sorted(keys + others)
    assert await store.list("danube-data/topics/none") == []


async def test_streaming_writer_round_trips_20_mib(store: ObjectStore) -> None:
    digest = hashlib.sha256()
    async with store.writer("big/object.dnb") as writer:
        for i in range(20):
            chunk = pattern(MiB, seed=i)
            digest.update(chunk)
            await writer.write(chunk)
        assert not await store.exists("big/object.dnb")  # not visible before close
    assert writer.bytes_written == 20 * MiB
    assert await store.stat("big/object.dnb") == 20 * MiB
    data = await store.read("big/object.dnb", timeout_s=120)
    assert hashlib.sha256(data).digest() == digest.digest()
    # A range across a chunk (and, on S3, a part) boundary.
    assert (
        await store.read_range("big/object.dnb", 5 * MiB - 3, 6) == data[5 * MiB - 3 : 5 * MiB + 3]
    )


async def _write_then_fail(store: ObjectStore, key: str, size: int) -> None:
    async with store.writer(key) as writer:
        await writer.write(pattern(size))
        raise RuntimeError("upload source failed")


async def test_aborted_writer_leaves_no_object(store: ObjectStore) -> None:
    await store.write("kept/a", b"a")
    for key, size in (("aborted/small", 1000), ("aborted/large", 12 * MiB)):
        with pytest.raises(RuntimeError, match="upload source failed"):
            await _write_then_fail(store, key, size)
        assert not await store.exists(key)
    assert await store.list("") == ["kept/a"]


async def test_fs_aborted_writes_stay_under_partial(tmp_path: Path) -> None:
    root = tmp_path / "objects"
    store = ObjectStore.from_config(FsCloud(backend="fs", root=str(root)))
    with pytest.raises(RuntimeError):
        await _write_then_fail(store, "t/x.dnb", 1000)
    assert not (root / "t" / "x.dnb").exists()
    leftovers = [p for p in root.rglob("*") if p.is_file()]
    assert all(p.relative_to(root).parts[0] == PARTIAL_DIR for p in leftovers)


async def test_objects_of_frames_seek_through_the_descriptor(store: ObjectStore) -> None:
    # What the uploader writes and the cloud reader reads: frames, indexed every 4 KiB.
    first, count = 1_000, 3_000
    builder = SparseIndexBuilder(every_bytes=4096)
    buf = bytearray()
    for offset in range(first, first + count):
        position = len(buf)
        builder.add(offset, position, append_frame(buf, offset, pattern(offset % 97, offset)))
    key = object_key("/danube-data", "ns", "t", first, first + count - 1)
    async with store.writer(key) as writer:
        await writer.write(bytes(buf))
    stored = ObjectDescriptor.from_builder(key, builder, created_ms=1).to_bytes()
    descriptor = ObjectDescriptor.from_bytes(stored)
    assert descriptor.size_bytes == await store.stat(key)

    target = 2_345
    start = descriptor.seek(target)
    tail = await store.read_range(key, start, descriptor.size_bytes - start)
    frames, end = decode_frames(tail)
    assert end == len(tail)
    assert frames[0].offset <= target
    skipped = [frame for frame in frames if frame.offset < target]
    found = frames[len(skipped)]
    assert found.offset == target
    assert bytes(found.payload) == pattern(target % 97, target)
    # The index spared the reader all but less than one index step of unwanted frames.
    assert sum(16 + len(frame.payload) for frame in skipped) < 4096


async def test_memory_backend_round_trip() -> None:
    store = ObjectStore.from_config(MemoryCloud(backend="memory", root="it"))
    await store.write("m/1", b"one")
    async with store.writer("m/2") as writer:
        await writer.write(b"tw")
        await writer.write(b"o")
    assert await store.list("m") == ["m/1", "m/2"]
    assert [await store.read(k) for k in ("m/1", "m/2")] == [b"one", b"two"]
    assert await store.read_range("m/2", 1, 2) == b"wo"


async def test_unreachable_s3_is_retriable() -> None:
    cloud = moto_cloud(f"http://127.0.0.1:{free_port()}", "nobody-listens")
    store = ObjectStore.from_config(cloud, timeout_s=20)
    with pytest.raises(StorageUnavailableError) as info:
        await store.read("a/b")
    assert info.value.retriable
    assert info.value.op == "read"


async def test_missing_bucket_is_not_retriable(s3_endpoint: str) -> None:
    store = ObjectStore.from_config(moto_cloud(s3_endpoint, "no-such-bucket-here"))
    with pytest.raises(StorageError) as info:
        await store.write("a/b", b"x")
    assert not info.value.retriable


async def test_s3_keys_sit_under_the_configured_prefix(s3_endpoint: str, s3_bucket: str) -> None:
    store = ObjectStore.from_config(moto_cloud(s3_endpoint, s3_bucket, prefix="mesh/objects"))
    await store.write("topics/ns/t/x.dnb", b"x")
    client = boto3.client(
        "s3",
        endpoint_url=s3_endpoint,
        region_name="us-east-1",
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
    )
    listed = client.list_objects_v2(Bucket=s3_bucket)
    assert [item["Key"] for item in listed["Contents"]] == ["mesh/objects/topics/ns/t/x.dnb"]

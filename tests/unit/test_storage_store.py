"""ObjectStore without servers: deadlines, error mapping, key rules, listing, writer abort."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterable, AsyncIterator

import opendal
import pytest

from danube.storage import (
    InvalidObjectKeyError,
    ListingTooLargeError,
    ObjectNotFoundError,
    ObjectRangeError,
    ObjectStore,
    StorageConfigError,
    StorageError,
    StoragePermissionError,
    StorageTimeoutError,
    StorageUnavailableError,
)
from danube.storage.protocol import ListedEntry, ObjectMeta, WriteFile

pytestmark = pytest.mark.unit


def memory_store(*, write_chunk_bytes: int = 8 * 1024 * 1024) -> ObjectStore:
    operator = opendal.AsyncOperator("memory", root="/unit")
    return ObjectStore(operator, write_chunk_bytes=write_chunk_bytes)


class Stalled:
    """An operator whose every call hangs: the deadline is all that ends it."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    async def _hang(self, name: str) -> None:
        self.calls.append(name)
        await asyncio.Event().wait()

    async def write(self, path: str, bs: bytes, /) -> None:
        await self._hang("write")

    async def read(
        self, path: str, /, *, offset: int | None = None, size: int | None = None
    ) -> bytes:
        await self._hang("read")
        return b""

    async def stat(self, path: str, /) -> ObjectMeta:
        await self._hang("stat")
        raise AssertionError

    async def list(
        self, path: str, /, *, recursive: bool | None = None
    ) -> AsyncIterable[ListedEntry]:
        await self._hang("list")
        raise AssertionError

    async def delete(self, path: str, /) -> None:
        await self._hang("delete")

    async def open(self, path: str, mode: str, /, *, chunk: int, concurrent: int) -> WriteFile:
        await self._hang("open")
        raise AssertionError


class Failing(Stalled):
    """An operator whose every call raises the given OpenDAL exception."""

    def __init__(self, exc: Exception) -> None:
        super().__init__()
        self.exc = exc

    async def _hang(self, name: str) -> None:
        self.calls.append(name)
        raise self.exc


async def test_every_call_has_a_deadline() -> None:
    fake = Stalled()
    store = ObjectStore(fake, timeout_s=0.05)
    calls = [
        store.write("k", b"x"),
        store.read("k"),
        store.read_range("k", 0, 1),
        store.stat("k"),
        store.list("p"),
        store.delete("k"),
    ]
    for call in calls:
        with pytest.raises(StorageTimeoutError) as info:
            await call
        assert info.value.retriable
        assert info.value.code == "timeout"
    with pytest.raises(StorageTimeoutError) as info:
        async with store.writer("k"):
            pass
    assert info.value.op == "writer_open"
    assert fake.calls == ["write", "read", "read", "stat", "list", "delete", "open"]


def test_deadline_grows_with_the_bytes_moved() -> None:
    store = ObjectStore(Stalled(), timeout_s=2.0, min_throughput_bytes_per_s=1000)
    assert store.deadline_s() == 2.0
    assert store.deadline_s(5000) == 7.0


@pytest.mark.parametrize(
    ("exc", "expected", "code", "retriable"),
    [
        (
            opendal.exceptions.NotFound("NotFound (permanent) at read"),
            ObjectNotFoundError,
            "object_not_found",
            False,
        ),
        (
            opendal.exceptions.PermissionDenied("PermissionDenied (permanent) at read"),
            StoragePermissionError,
            "storage_permission_denied",
            False,
        ),
        (
            opendal.exceptions.ConfigInvalid("ConfigInvalid (permanent) at read => NoSuchBucket"),
            StorageConfigError,
            "storage_config",
            False,
        ),
        (
            opendal.exceptions.RateLimited("RateLimited (temporary) at read"),
            StorageUnavailableError,
            "storage_unavailable",
            True,
        ),
        (
            opendal.exceptions.Unexpected("Unexpected (temporary) at read => send http request"),
            StorageUnavailableError,
            "storage_unavailable",
            True,
        ),
        (
            opendal.exceptions.Unexpected("Unexpected (persistent) at read => send http request"),
            StorageUnavailableError,
            "storage_unavailable",
            True,
        ),
        (
            opendal.exceptions.Unexpected("Unexpected (permanent) at read => bad request"),
            StorageError,
            "storage_error",
            False,
        ),
    ],
)
async def test_opendal_errors_map_to_storage_errors(
    exc: Exception, expected: type[StorageError], code: str, retriable: bool
) -> None:
    store = ObjectStore(Failing(exc))
    with pytest.raises(expected) as info:
        await store.read("a/b")
    assert type(info.value) is expected
    assert info.value.code == code
    assert info.value.retriable is retriable
    assert info.value.__cause__ is exc


async def test_not_found_on_write_is_not_object_not_found() -> None:
    # OpenDAL says NotFound for a write outside the root or into a missing bucket: no object is
    # missing there, so callers must not treat it as one.
    store = ObjectStore(Failing(opendal.exceptions.NotFound("NotFound (permanent) at write")))
    with pytest.raises(StorageError) as info:
        await store.write("a/b", b"x")
    assert not isinstance(info.value, ObjectNotFoundError)


async def test_other_exceptions_pass_through_unchanged() -> None:
    store = ObjectStore(Failing(KeyError("bug")))
    with pytest.raises(KeyError):
        await store.read("a/b")


@pytest.mark.parametrize("key", ["", "/a", "a/", "a//b", "a/../b", "./a", "a/\nb"])
async def test_bad_keys_are_refused_before_any_io(key: str) -> None:
    fake = Stalled()
    store = ObjectStore(fake, timeout_s=0.01)
    for call in (store.write(key, b"x"), store.read(key), store.stat(key), store.delete(key)):
        with pytest.raises(InvalidObjectKeyError):
            await call
    with pytest.raises(InvalidObjectKeyError):
        store.writer(key)
    assert fake.calls == []


async def test_memory_round_trip_and_range() -> None:
    store = memory_store()
    await store.write("t/obj", bytes(range(256)))
    assert await store.read("t/obj") == bytes(range(256))
    assert await store.read_range("t/obj", 10, 5) == bytes([10, 11, 12, 13, 14])
    assert await store.read_range("t/obj", 250, 6) == bytes(range(250, 256))
    assert await store.read_range("t/obj", 3, 0) == b""
    assert await store.stat("t/obj") == 256
    assert await store.exists("t/obj")
    assert not await store.exists("t/nope")
    with pytest.raises(ObjectRangeError) as info:
        await store.read_range("t/obj", 250, 7)
    assert info.value.size_bytes == 256
    with pytest.raises(ObjectRangeError):
        await store.read_range("t/obj", -1, 2)
    with pytest.raises(ObjectNotFoundError):
        await store.read_range("t/nope", 0, 1)
    await store.delete("t/obj")
    await store.delete("t/obj")  # already gone: not an error
    with pytest.raises(ObjectNotFoundError) as missing:
        await store.stat("t/obj")
    assert missing.value.key == "t/obj"


async def test_list_is_sorted_recursive_and_bounded() -> None:
    store = memory_store()
    for key in ("a/b/3", "a/b/1", "a/b/c/2", "a/bc/9", "z/0"):
        await store.write(key, b"x")
    assert await store.list("a/b") == ["a/b/1", "a/b/3", "a/b/c/2"]
    assert await store.list("a/b/") == ["a/b/1", "a/b/3", "a/b/c/2"]
    assert await store.list("") == ["a/b/1", "a/b/3", "a/b/c/2", "a/bc/9", "z/0"]
    assert await store.list("nothing/here") == []
    with pytest.raises(ListingTooLargeError) as info:
        await store.list("a", max_keys=3)
    assert info.value.max_keys == 3


async def test_writer_commits_on_clean_exit_only() -> None:
    store = memory_store(write_chunk_bytes=1024)
    async with store.writer("w/ok") as writer:
        for i in range(10):
            await writer.write(bytes([i]) * 500)
        assert not await store.exists("w/ok")  # nothing visible before close
    assert writer.bytes_written == 5000
    assert await store.read("w/ok") == b"".join(bytes([i]) * 500 for i in range(10))

    with pytest.raises(RuntimeError, match="boom"):
        await _write_then_fail(store, "w/aborted")
    assert not await store.exists("w/aborted")
    assert await store.list("w") == ["w/ok"]


async def _write_then_fail(store: ObjectStore, key: str) -> None:
    async with store.writer(key) as writer:
        await writer.write(b"x" * 3000)
        raise RuntimeError("boom")


async def test_writer_is_single_use() -> None:
    store = memory_store()
    writer = store.writer("w/once")
    async with writer:
        await writer.write(b"1")
    with pytest.raises(RuntimeError):
        await writer.write(b"2")
    with pytest.raises(RuntimeError):
        async with writer:
            pass
    assert await store.read("w/once") == b"1"


async def _entries(paths: list[str]) -> AsyncIterator[ListedEntry]:
    for path in paths:
        yield _Entry(path)


class _Entry:
    def __init__(self, path: str) -> None:
        self._path = path

    @property
    def path(self) -> str:
        return self._path


class Listing(Stalled):
    """An operator that lists what an fs backend lists: directories and temporary files too."""

    async def list(
        self, path: str, /, *, recursive: bool | None = None
    ) -> AsyncIterable[ListedEntry]:
        return _entries(["a/", "a/2", ".partial/", ".partial/x.dnb.tmp123", "a/1", "/"])


async def test_list_drops_directories_and_partial_writes() -> None:
    assert await ObjectStore(Listing()).list() == ["a/1", "a/2"]

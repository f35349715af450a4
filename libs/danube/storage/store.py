"""``ObjectStore``: typed object storage calls, each with a deadline and typed errors.

A thin wrapper over an OpenDAL ``AsyncOperator``. Every call runs under ``asyncio.timeout``: a
base ``timeout_s`` plus the time to move its bytes at ``min_throughput_bytes_per_s``, so a large
transfer is not cut short and a stalled one does not hang. OpenDAL's exceptions (which share no
base class) become :class:`StorageError` subclasses in one place, :func:`_storage_error`.

Keys are relative to the backend root, ``/``-separated, never starting or ending with ``/``.
The operator is the seam for tests (:class:`protocol.Operator`): hand in a ``memory`` operator,
or a small fake, instead of patching.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from types import TracebackType

import opendal

from danube.config.wal_cloud import CloudConfig
from danube.storage.backends import PARTIAL_DIR, open_operator
from danube.storage.errors import (
    InvalidObjectKeyError,
    ListingTooLargeError,
    ObjectNotFoundError,
    ObjectRangeError,
    StorageConfigError,
    StorageError,
    StoragePermissionError,
    StorageTimeoutError,
    StorageUnavailableError,
)
from danube.storage.location import describe
from danube.storage.protocol import Operator, WriteFile

log = logging.getLogger(__name__)

MiB = 1024 * 1024
DEFAULT_TIMEOUT_S = 30.0
DEFAULT_MIN_THROUGHPUT_BYTES_PER_S = 1 * MiB
DEFAULT_WRITE_CHUNK_BYTES = 8 * MiB  # S3 parts must be at least 5 MiB (but the last)
DEFAULT_MAX_LIST_KEYS = 1_000_000

_BAD_KEY_CHARS = re.compile(r"[\x00-\x1f\x7f]")

BytesLike = bytes | bytearray | memoryview


class ObjectStore:
    """Object storage for the mesh: whole-object and range reads, writes, listings, deletes."""

    def __init__(
        self,
        operator: Operator,
        *,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        min_throughput_bytes_per_s: int = DEFAULT_MIN_THROUGHPUT_BYTES_PER_S,
        write_chunk_bytes: int = DEFAULT_WRITE_CHUNK_BYTES,
        write_concurrency: int = 1,
        location: str | None = None,
    ) -> None:
        if timeout_s <= 0 or min_throughput_bytes_per_s <= 0:
            raise ValueError("timeout_s and min_throughput_bytes_per_s must be positive")
        if write_chunk_bytes < 1 or write_concurrency < 1:
            raise ValueError("write_chunk_bytes and write_concurrency must be at least 1")
        self._op = operator
        self._timeout_s = timeout_s
        self._throughput = min_throughput_bytes_per_s
        self._chunk_bytes = write_chunk_bytes
        self._concurrency = write_concurrency
        self._location = location  # named by ObjectNotFoundError: where the store looked

    @classmethod
    def from_config(
        cls,
        cloud: CloudConfig,
        *,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        min_throughput_bytes_per_s: int = DEFAULT_MIN_THROUGHPUT_BYTES_PER_S,
        write_chunk_bytes: int = DEFAULT_WRITE_CHUNK_BYTES,
        write_concurrency: int = 1,
        location: str | None = None,
    ) -> ObjectStore:
        """A store on the backend of a ``wal_cloud.cloud`` section (see :func:`open_operator`);
        ``location`` (default: the section's backend, root and endpoint) is named by errors."""
        return cls(
            open_operator(cloud),
            timeout_s=timeout_s,
            min_throughput_bytes_per_s=min_throughput_bytes_per_s,
            write_chunk_bytes=write_chunk_bytes,
            write_concurrency=write_concurrency,
            location=describe(cloud) if location is None else location,
        )

    @property
    def location(self) -> str | None:
        """Where the objects are (backend, root, endpoint), when built from a config."""
        return self._location

    def deadline_s(self, size_bytes: int = 0) -> float:
        """The deadline of a call that moves ``size_bytes``: base timeout plus transfer time."""
        return self._timeout_s + size_bytes / self._throughput

    async def write(self, key: str, data: BytesLike, *, timeout_s: float | None = None) -> None:
        """Write a whole object, replacing any object of that key.

        On fs the bytes go to a temporary file renamed into place, on object stores a single
        PUT (or a multipart upload completed at the end): the object appears whole or not at all.
        """
        _check_key(key)
        deadline = self.deadline_s(len(data)) if timeout_s is None else timeout_s
        async with _guard("write", key, deadline):
            await self._op.write(key, bytes(data))

    async def read(self, key: str, *, timeout_s: float | None = None) -> bytes:
        """Read a whole object. Its size is unknown up front: pass ``timeout_s`` for big ones."""
        _check_key(key)
        deadline = self._timeout_s if timeout_s is None else timeout_s
        async with _guard("read", key, deadline, self._location):
            return await self._op.read(key)

    async def read_range(
        self, key: str, start: int, length: int, *, timeout_s: float | None = None
    ) -> bytes:
        """Read exactly ``length`` bytes from byte ``start``, with one ranged request.

        Raises :class:`ObjectRangeError` if the range goes past the end of the object (a reader
        knows the size from the descriptor). ``length == 0`` returns ``b""`` without I/O.
        """
        _check_key(key)
        if start < 0 or length < 0:
            raise ObjectRangeError(key, start=start, length=length, size_bytes=None)
        if length == 0:
            return b""
        deadline = self.deadline_s(length) if timeout_s is None else timeout_s
        try:
            async with _guard("read_range", key, deadline, self._location):
                data = await self._op.read(key, offset=start, size=length)
        except StorageError as exc:
            if isinstance(exc, ObjectNotFoundError | StorageTimeoutError):
                raise
            # Backends report an overrun differently (fs: RangeNotSatisfied; S3, when the range
            # starts inside the object: "reader got too little data", which OpenDAL even
            # retries). Ask the size to tell an overrun from a real failure.
            try:
                size = await self.stat(key)
            except StorageError:
                raise exc  # noqa: B904 - the read's error says more than the stat's
            if start + length > size:
                raise ObjectRangeError(key, start=start, length=length, size_bytes=size) from exc
            raise
        if len(data) != length:
            raise ObjectRangeError(key, start=start, length=length, size_bytes=None)
        return data

    async def stat(self, key: str, *, timeout_s: float | None = None) -> int:
        """The size of an object in bytes; :class:`ObjectNotFoundError` if there is none."""
        _check_key(key)
        deadline = self._timeout_s if timeout_s is None else timeout_s
        async with _guard("stat", key, deadline, self._location):
            meta = await self._op.stat(key)
        if not meta.is_file:  # fs answers a stat of a directory
            raise ObjectNotFoundError(key, op="stat", location=self._location)
        return meta.content_length

    async def exists(self, key: str, *, timeout_s: float | None = None) -> bool:
        """Whether an object of that key exists."""
        try:
            await self.stat(key, timeout_s=timeout_s)
        except ObjectNotFoundError:
            return False
        return True

    async def list(
        self,
        prefix: str = "",
        *,
        max_keys: int = DEFAULT_MAX_LIST_KEYS,
        timeout_s: float | None = None,
    ) -> list[str]:
        """Every object key under the directory ``prefix`` (recursively), sorted.

        ``prefix`` is a directory, with or without its trailing ``/``: ``"a/b"`` lists
        ``a/b/...`` but not ``a/bc``. ``""`` lists the whole root. Raises
        :class:`ListingTooLargeError` past ``max_keys`` rather than hold an unbounded list.
        """
        directory = prefix.strip("/")
        if directory:
            _check_key(directory)
            directory += "/"
        keys: list[str] = []
        deadline = self._timeout_s if timeout_s is None else timeout_s
        async with _guard("list", directory or None, deadline):
            entries = await self._op.list(directory, recursive=True)
            async for entry in entries:
                path = entry.path
                # fs lists directories too, and the temporary files of writes in progress.
                if path.endswith("/") or path.startswith(f"{PARTIAL_DIR}/"):
                    continue
                if len(keys) == max_keys:
                    raise ListingTooLargeError(prefix=directory, max_keys=max_keys)
                keys.append(path)
        keys.sort()
        return keys

    async def delete(self, key: str, *, timeout_s: float | None = None) -> None:
        """Delete an object; deleting a missing object is not an error (it is already gone)."""
        _check_key(key)
        async with _guard("delete", key, self._timeout_s if timeout_s is None else timeout_s):
            await self._op.delete(key)

    def writer(self, key: str) -> ObjectWriter:
        """A streaming writer for a large object: ``async with store.writer(key) as w: ...``.

        The object appears only when the block exits without an exception; see ObjectWriter.
        """
        _check_key(key)
        return ObjectWriter(
            self._op,
            key,
            chunk_bytes=self._chunk_bytes,
            concurrency=self._concurrency,
            deadline_s=self.deadline_s,
        )


class ObjectWriter:
    """Streams one object in chunks (a multipart upload on object stores).

    Use it as an async context manager. A clean exit closes the upload, which is when the object
    appears. An exception (or a deadline) aborts instead: the upload is dropped without being
    closed, so no object appears under ``key``. What remains depends on the backend: on S3 an
    incomplete multipart upload, whose parts a bucket lifecycle rule
    (AbortIncompleteMultipartUpload) removes; on fs a temporary file under ``.partial/``; on
    memory nothing. OpenDAL's Python binding has no abort call, and its own ``AsyncFile``
    context manager closes, i.e. commits, even on an exception, so this class does not use it.
    """

    def __init__(
        self,
        operator: Operator,
        key: str,
        *,
        chunk_bytes: int,
        concurrency: int,
        deadline_s: Callable[[int], float],
    ) -> None:
        self._op = operator
        self._key = key
        self._chunk_bytes = chunk_bytes
        self._concurrency = concurrency
        self._deadline_s = deadline_s
        # Up to `concurrency` chunks may be buffered or in flight when a write or close returns.
        self._pending_bytes = chunk_bytes * concurrency
        self._file: WriteFile | None = None
        self._bytes_written = 0
        self._done = False

    @property
    def key(self) -> str:
        """The key the object will have."""
        return self._key

    @property
    def bytes_written(self) -> int:
        """How many bytes were handed to ``write`` so far."""
        return self._bytes_written

    async def __aenter__(self) -> ObjectWriter:
        if self._file is not None or self._done:
            raise RuntimeError("an ObjectWriter is used once")
        async with _guard("writer_open", self._key, self._deadline_s(0)):
            self._file = await self._op.open(
                self._key, "wb", chunk=self._chunk_bytes, concurrent=self._concurrency
            )
        return self

    async def write(self, data: BytesLike) -> None:
        """Append bytes; full chunks are uploaded as part of this call."""
        if self._file is None or self._done:
            raise RuntimeError("write outside the writer's async with block")
        deadline = self._deadline_s(len(data) + self._pending_bytes)
        async with _guard("write", self._key, deadline):
            await self._file.write(bytes(data))
        self._bytes_written += len(data)

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        file, self._file, self._done = self._file, None, True
        if file is None:
            return
        if exc_type is not None:
            log.warning(
                "object upload aborted",
                extra={
                    "key": self._key,
                    "bytes_written": self._bytes_written,
                    "error": exc_type.__name__,
                },
            )
            return  # dropped unclosed: OpenDAL never completes the upload
        async with _guard("writer_close", self._key, self._deadline_s(self._pending_bytes)):
            await file.close()


@asynccontextmanager
async def _guard(
    op: str, key: str | None, timeout_s: float, location: str | None = None
) -> AsyncIterator[None]:
    """Run the block under a deadline; turn a timeout and OpenDAL's errors into StorageErrors
    (a missing object's names ``location``, where the store looked)."""
    try:
        async with asyncio.timeout(timeout_s):
            yield
    except TimeoutError as exc:
        raise StorageTimeoutError(op=op, key=key, timeout_s=timeout_s) from exc
    except Exception as exc:
        if type(exc).__module__ != opendal.exceptions.__name__:
            raise
        raise _storage_error(exc, op=op, key=key, location=location) from exc


def _storage_error(
    exc: Exception, *, op: str, key: str | None, location: str | None = None
) -> StorageError:
    """The one place OpenDAL's exception classes map to ours."""
    kind = type(exc).__name__
    text = str(exc)
    first_line = text.splitlines()[0] if text else kind
    if kind == "NotFound" and op in ("read", "read_range", "stat") and key is not None:
        return ObjectNotFoundError(key, op=op, location=location)
    if kind == "RangeNotSatisfied":
        return StorageError(f"storage {op}: {first_line}", op=op, key=key, code="object_range")
    if kind == "PermissionDenied":
        return StoragePermissionError(f"storage {op}: {first_line}", op=op, key=key)
    if kind in ("ConfigInvalid", "Unsupported"):
        return StorageConfigError("backend", f"{op}: {first_line}")
    # OpenDAL marks each error "(temporary)", "(persistent)" (temporary, but its retries ran
    # out) or "(permanent)". Only a permanent one cannot get better by itself.
    if kind == "RateLimited" or "(temporary)" in first_line or "(persistent)" in first_line:
        return StorageUnavailableError(f"storage {op}: {first_line}", op=op, key=key)
    return StorageError(f"storage {op}: {first_line}", op=op, key=key)


def _check_key(key: str) -> None:
    if not key or key.startswith("/") or key.endswith("/"):
        raise InvalidObjectKeyError(key, "a key is non-empty and neither starts nor ends with /")
    if _BAD_KEY_CHARS.search(key):
        raise InvalidObjectKeyError(key, "a key has no control characters")
    if any(segment in ("", ".", "..") for segment in key.split("/")):
        raise InvalidObjectKeyError(key, "a key has no empty, '.' or '..' segments")

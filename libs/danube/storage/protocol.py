"""The part of OpenDAL's ``AsyncOperator`` that ``ObjectStore`` uses: the seam for test fakes.

``opendal.AsyncOperator`` satisfies :class:`Operator` as is; a unit test hands in a small fake
(one that stalls, or raises an OpenDAL exception) instead of patching the library.
"""

from __future__ import annotations

from collections.abc import AsyncIterable, Awaitable
from typing import Protocol


class ObjectMeta(Protocol):
    """What a stat answers (``opendal.types.Metadata``)."""

    @property
    def is_file(self) -> bool: ...

    @property
    def content_length(self) -> int: ...


class ListedEntry(Protocol):
    """One listed path (``opendal.types.Entry``); directories end in ``/``."""

    @property
    def path(self) -> str: ...


class WriteFile(Protocol):
    """An open streaming write (``opendal.file.AsyncFile`` opened ``"wb"``)."""

    def write(self, bs: bytes, /) -> Awaitable[int]: ...

    def close(self) -> Awaitable[None]: ...


class Operator(Protocol):
    """The calls of ``opendal.AsyncOperator`` the store makes."""

    def write(self, path: str, bs: bytes, /) -> Awaitable[None]: ...

    def read(
        self, path: str, /, *, offset: int | None = None, size: int | None = None
    ) -> Awaitable[bytes]: ...

    def stat(self, path: str, /) -> Awaitable[ObjectMeta]: ...

    def list(
        self, path: str, /, *, recursive: bool | None = None
    ) -> Awaitable[AsyncIterable[ListedEntry]]: ...

    def delete(self, path: str, /) -> Awaitable[None]: ...

    def open(
        self, path: str, mode: str, /, *, chunk: int, concurrent: int
    ) -> Awaitable[WriteFile]: ...

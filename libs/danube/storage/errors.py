"""Errors of ``danube.storage``: object storage calls, object names and descriptors.

::

    DanubeError
    └── StorageError                       "storage_error": a permanent backend failure; op, key
        ├── ObjectNotFoundError            "object_not_found": key, location
        ├── ObjectRangeError               "object_range": key, start, length, size_bytes
        ├── StorageUnavailableError        "storage_unavailable" (retriable): op, key
        │   └── StorageTimeoutError        "timeout" (retriable): op, key, timeout_s
        ├── StoragePermissionError         "storage_permission_denied": op, key
        ├── StorageConfigError             "storage_config": field, reason
        ├── ListingTooLargeError           "listing_too_large": prefix, max_keys
        ├── InvalidObjectKeyError          "invalid_object_key": key, reason
        ├── CorruptObjectError             "object_corrupt": key, position, offset (a bad frame)
        └── InvalidDescriptorError         "invalid_descriptor": field, reason  (build side)
            └── CorruptDescriptorError     "corrupt_descriptor": field, reason  (load side)
                └── UnsupportedDescriptorVersionError  "unsupported_descriptor_version"

Only :class:`StorageUnavailableError` and its subclass are retriable: the backend was
unreachable, rate-limited, returned a temporary error, or the call ran out of time. Everything
else cannot get better without a change (a missing object, a bad key, a bad credential).
"""

from __future__ import annotations

from danube.errors import DanubeError, ErrorKind


class StorageError(DanubeError):
    """Root of the storage errors; raised as is for a permanent backend failure.

    ``op`` names the call (``"read"``, ``"write"``...) and ``key`` the object, when known.
    """

    code = "storage_error"

    def __init__(
        self,
        message: str,
        *,
        op: str | None = None,
        key: str | None = None,
        code: str | None = None,
        retriable: bool | None = None,
    ) -> None:
        super().__init__(message, code=code, retriable=retriable)
        self.op = op
        self.key = key


class ObjectNotFoundError(StorageError):
    """The object does not exist (or the key names a directory, not an object).

    ``location`` is where the store looked (``danube.storage.location.describe``: backend,
    root, endpoint), when the store knows it: a wrong root or bucket shows in the message."""

    code = "object_not_found"

    def __init__(self, key: str, *, op: str | None = None, location: str | None = None) -> None:
        where = "" if location is None else f" in {location}"
        super().__init__(f"object not found: {key!r}{where}", op=op, key=key)
        self.location = location


class ObjectRangeError(StorageError):
    """A range read asked for bytes beyond the end of the object.

    ``size_bytes`` is the object's size when it could be learned, else ``None``.
    """

    code = "object_range"

    def __init__(self, key: str, *, start: int, length: int, size_bytes: int | None) -> None:
        size = "unknown size" if size_bytes is None else f"{size_bytes} bytes"
        super().__init__(
            f"range [{start}, {start + length}) is outside object {key!r} ({size})",
            op="read_range",
            key=key,
        )
        self.start = start
        self.length = length
        self.size_bytes = size_bytes


class StorageUnavailableError(StorageError):
    """The backend could not be reached or answered with a temporary error: try again later."""

    code = "storage_unavailable"
    kind = ErrorKind.UNAVAILABLE
    retriable = True


class StorageTimeoutError(StorageUnavailableError):
    """A storage call did not finish within its deadline."""

    code = "timeout"

    def __init__(self, *, op: str, key: str | None, timeout_s: float) -> None:
        target = "" if key is None else f" on {key!r}"
        super().__init__(f"storage {op}{target} timed out after {timeout_s:.3f} s", op=op, key=key)
        self.timeout_s = timeout_s


class StoragePermissionError(StorageError):
    """The backend refused the call: a wrong or missing credential, or a missing permission."""

    code = "storage_permission_denied"


class StorageConfigError(StorageError):
    """A cloud setting OpenDAL cannot use; ``field`` is the key under ``wal_cloud.cloud``."""

    code = "storage_config"

    def __init__(self, field: str, reason: str) -> None:
        super().__init__(f"bad storage setting wal_cloud.cloud.{field}: {reason}")
        self.field = field
        self.reason = reason


class ListingTooLargeError(StorageError):
    """A listing found more keys than the caller allowed; list a narrower prefix."""

    code = "listing_too_large"

    def __init__(self, *, prefix: str, max_keys: int) -> None:
        super().__init__(f"listing {prefix!r} found more than {max_keys} keys", op="list")
        self.prefix = prefix
        self.max_keys = max_keys


class InvalidObjectKeyError(StorageError):
    """An object key (or a part of one) that breaks the naming rules of ``danube.storage``."""

    code = "invalid_object_key"

    def __init__(self, key: str, reason: str) -> None:
        super().__init__(f"invalid object key {key!r}: {reason}", key=key)
        self.reason = reason


class CorruptObjectError(StorageError):
    """An object holds a frame that fails its check (CRC, length, offset order or range, or
    an end that is not the descriptor's): nothing from it at or past that frame is served.

    ``position`` is the frame's byte position in the object (``None`` when not known) and
    ``offset`` the offset its header claims (``None`` when no header could be read).
    """

    code = "object_corrupt"

    def __init__(self, key: str, position: int | None, offset: int | None, reason: str) -> None:
        at = "" if position is None else f" at byte {position}"
        of = "" if offset is None else f" (offset {offset})"
        super().__init__(f"object {key}: bad frame{at}{of}: {reason}", op="read", key=key)
        self.position = position
        self.offset = offset
        self.reason = reason


class InvalidDescriptorError(StorageError):
    """Descriptor or sparse-index fields that contradict each other, found while building one."""

    code = "invalid_descriptor"

    def __init__(self, field: str, reason: str) -> None:
        super().__init__(f"invalid descriptor field {field!r}: {reason}")
        self.field = field
        self.reason = reason


class CorruptDescriptorError(InvalidDescriptorError):
    """Stored descriptor bytes that do not decode to a consistent descriptor."""

    code = "corrupt_descriptor"


class UnsupportedDescriptorVersionError(CorruptDescriptorError):
    """A descriptor in a format version this reader does not know (written by a newer writer?)."""

    code = "unsupported_descriptor_version"

    def __init__(self, version: object) -> None:
        super().__init__("v", f"unsupported descriptor format version {version!r}")
        self.version = version

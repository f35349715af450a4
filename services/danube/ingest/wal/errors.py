"""Errors of ``danube.ingest.wal``: the write-ahead log of one topic partition.

::

    DanubeError
    └── WalError                     "wal_error": root; raised as is for a misuse of the API
        ├── WalClosedError           "wal_closed" (retriable): the WAL was closed (partition moving)
        ├── WalFailedError           "wal_failed" (retriable): a write or fsync failed; reopen it
        ├── DiskFullError            "disk_full" (retriable): wal_dir, free_bytes, needed_bytes
        ├── WalCorruptionError       "wal_corrupt": segment, offset, position
        ├── BelowWalStartError       "below_wal_start": start_offset (read object storage instead)
        ├── PayloadTooLargeError     "payload_too_large": index, size_bytes, limit_bytes
        ├── AppendTooLargeError      "append_too_large": size_bytes, limit_bytes
        └── WalIoError               "wal_io" (retriable): op, path  (a read failed)
            └── WalTimeoutError      "timeout" (retriable): op, timeout_s

``retriable`` says whether the same request may succeed later unchanged: a closed or failed WAL
comes back (here after a restart, or at the partition's next owner), a full disk once space is
freed; corruption, an offset below the WAL start and an oversize payload do not get better by
retrying.
"""

from __future__ import annotations

from typing import Any

from danube.errors import DanubeError, ErrorKind
from danube.wire import codes


class WalError(DanubeError):
    """Root of the WAL errors; raised as is for a misuse of the API (a bad argument)."""

    code = "wal_error"


class WalClosedError(WalError):
    """The WAL is closed or closing: no append is accepted any more."""

    code = "wal_closed"
    kind = ErrorKind.UNAVAILABLE
    retriable = True

    def __init__(self, message: str = "the WAL is closed") -> None:
        super().__init__(message)


class WalFailedError(WalError):
    """A write or fsync failed: the state of the file (and of the page cache) is unknown.

    After a failed fsync the kernel may have dropped the dirty pages and cleared the error
    ("fsyncgate"), so a retried fsync proves nothing; the only safe move is to stop writing and
    let the owner reopen the WAL, whose recovery trusts only what it can read back.
    """

    code = "wal_failed"
    kind = ErrorKind.UNAVAILABLE
    retriable = True

    def __init__(self, reason: str) -> None:
        super().__init__(f"the WAL failed and accepts no more appends: {reason}")
        self.reason = reason


class DiskFullError(WalError):
    """The WAL's filesystem has no room for an append (below its free-space floor, or ENOSPC).

    Nothing of the append was written (a partial write is cut back), the WAL stays open and
    its offsets are not consumed: the same append succeeds once space is freed. Retriable, but
    not within one request's deadline: a full disk does not empty itself in seconds.
    """

    code = "disk_full"
    kind = ErrorKind.UNAVAILABLE
    retriable = True

    def __init__(self, *, wal_dir: str, free_bytes: int, needed_bytes: int) -> None:
        super().__init__(
            f"no room for {needed_bytes} bytes in the WAL directory {wal_dir}"
            f" ({free_bytes} bytes free); free some space"
        )
        self.wal_dir = wal_dir
        self.free_bytes = free_bytes
        self.needed_bytes = needed_bytes

    def fields(self) -> dict[str, Any]:
        """The keyword arguments that make a copy of this error."""
        return {
            "wal_dir": self.wal_dir,
            "free_bytes": self.free_bytes,
            "needed_bytes": self.needed_bytes,
        }


class WalCorruptionError(WalError):
    """Bytes on disk that do not decode: a CRC mismatch, a bad length, an offset out of order.

    ``segment`` is the file name (``00000000000000000042.wal``, or ``checkpoint.json``);
    ``offset`` the message offset expected at ``position`` (the byte where the bad frame
    starts), ``None`` when not applicable. Nothing at or past that point is served.
    """

    code = "wal_corrupt"

    def __init__(self, *, segment: str, offset: int | None, position: int, reason: str) -> None:
        at = f"byte {position}" + ("" if offset is None else f" (offset {offset})")
        super().__init__(f"corrupt WAL file {segment} at {at}: {reason}")
        self.segment = segment
        self.offset = offset
        self.position = position
        self.reason = reason
        # Where this copy has intact frames again (the next segment's first offset), when a
        # read knows it: the damaged range is [offset, resume_offset).
        self.resume_offset: int | None = None


class BelowWalStartError(WalError):
    """The offset asked for was dropped from the WAL (or never cached, in memory mode)."""

    code = "below_wal_start"

    def __init__(self, *, offset: int, start_offset: int) -> None:
        super().__init__(f"offset {offset} is below the WAL start {start_offset}")
        self.offset = offset
        self.start_offset = start_offset


class PayloadTooLargeError(WalError):
    """One payload of an append is over the frame limit; nothing of the append was written."""

    code = codes.PAYLOAD_TOO_LARGE
    kind = ErrorKind.TOO_LARGE

    def __init__(self, *, index: int, size_bytes: int, limit_bytes: int) -> None:
        super().__init__(
            f"payload {index} of {size_bytes} bytes exceeds the limit of {limit_bytes} bytes"
        )
        self.index = index
        self.size_bytes = size_bytes
        self.limit_bytes = limit_bytes


class AppendTooLargeError(WalError):
    """One append (all its frames) is larger than the WAL lets be pending at once.

    Pending bytes never exceed ``max_pending_bytes``, so such an append could never be admitted;
    the caller must split it. Nothing was written.
    """

    code = "append_too_large"
    kind = ErrorKind.TOO_LARGE

    def __init__(self, *, size_bytes: int, limit_bytes: int) -> None:
        super().__init__(
            f"append of {size_bytes} frame bytes exceeds max_pending_bytes ({limit_bytes});"
            " split it"
        )
        self.size_bytes = size_bytes
        self.limit_bytes = limit_bytes


class WalIoError(WalError):
    """A read of a WAL file failed (the WAL itself stays usable; appends are unaffected)."""

    code = "wal_io"
    kind = ErrorKind.UNAVAILABLE
    retriable = True

    def __init__(self, message: str, *, op: str, path: str | None = None) -> None:
        super().__init__(message)
        self.op = op
        self.path = path


class WalTimeoutError(WalIoError):
    """A disk operation did not finish within its deadline."""

    code = "timeout"
    kind = ErrorKind.UNAVAILABLE

    def __init__(self, *, op: str, timeout_s: float, path: str | None = None) -> None:
        super().__init__(f"WAL {op} timed out after {timeout_s:.3f} s", op=op, path=path)
        self.timeout_s = timeout_s

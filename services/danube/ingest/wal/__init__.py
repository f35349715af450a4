"""The write-ahead log of one topic partition: group-committed appends, reads, recovery.

::

    wal = await Wal.open(directory, WalOptions.from_config(settings.wal_cloud.wal, "fsync"))
    first = await wal.append([record_1, record_2])     # durable when it returns
    result = await wal.fetch(first, max_bytes=1 << 20, max_count=100)
    await wal.close()

docs/wal.md describes the files on disk, the durability modes, recovery and the limits.
"""

from danube.ingest.wal.bounded import BoundedFileOps
from danube.ingest.wal.checkpoint import CHECKPOINT_NAME, Checkpoint, atomic_write
from danube.ingest.wal.errors import (
    AppendTooLargeError,
    BelowWalStartError,
    DiskFullError,
    PayloadTooLargeError,
    WalClosedError,
    WalCorruptionError,
    WalError,
    WalFailedError,
    WalIoError,
    WalTimeoutError,
)
from danube.ingest.wal.feed import DurableListener, DurableRun
from danube.ingest.wal.fileops import FileOps, OsFileOps
from danube.ingest.wal.options import Durability, WalOptions
from danube.ingest.wal.recovery import TailCut
from danube.ingest.wal.repair import RepairRefusedError, SegmentDamage
from danube.ingest.wal.results import FetchResult, SegmentInfo, WalStats
from danube.ingest.wal.segment import INDEX_EVERY_BYTES, parse_segment_name, segment_name
from danube.ingest.wal.wal import MAX_FETCH_BYTES, MAX_FETCH_COUNT, Wal

__all__ = [
    "CHECKPOINT_NAME",
    "INDEX_EVERY_BYTES",
    "MAX_FETCH_BYTES",
    "MAX_FETCH_COUNT",
    "AppendTooLargeError",
    "BelowWalStartError",
    "BoundedFileOps",
    "Checkpoint",
    "DiskFullError",
    "Durability",
    "DurableListener",
    "DurableRun",
    "FetchResult",
    "FileOps",
    "OsFileOps",
    "PayloadTooLargeError",
    "RepairRefusedError",
    "SegmentDamage",
    "SegmentInfo",
    "TailCut",
    "Wal",
    "WalClosedError",
    "WalCorruptionError",
    "WalError",
    "WalFailedError",
    "WalIoError",
    "WalOptions",
    "WalStats",
    "WalTimeoutError",
    "atomic_write",
    "parse_segment_name",
    "segment_name",
]

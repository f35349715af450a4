"""``checkpoint.json``: the WAL's start offset and its next-offset floor, written atomically.

The log itself is the truth for offsets; the checkpoint only records what the log cannot show
after a restart: that offsets were skipped (``advance_to``) or that segments were dropped.
So it is written on rotation, ``advance_to``, ``drop_below`` and close, never per append.

Atomic write: a temp file, fdatasync, rename over the old file, fsync of the directory. A crash
at any point leaves the old or the new checkpoint whole (and maybe a temp file, removed at
open). Values only move forward: a write never lowers what an earlier one recorded.
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from danube.ingest.wal.errors import WalCorruptionError
from danube.ingest.wal.fileops import FileOps, OsFileOps

CHECKPOINT_NAME = "checkpoint.json"
CHECKPOINT_VERSION = 1
TEMP_SUFFIX = ".tmp"
_MAX_OFFSET = 2**64 - 1


def atomic_write(path: Path, data: bytes, *, ops: FileOps | None = None) -> None:
    """Replace ``path`` with ``data`` whole or not at all, durably. Blocking.

    Temp file next to it, fdatasync, rename over ``path``, fsync of the directory: after a
    crash the file holds the old or the new bytes, never a mix (a temp file may be left).
    """
    ops = ops or OsFileOps()
    temp = path.with_name(path.name + TEMP_SUFFIX)
    fd = ops.create(temp, exclusive=False)
    try:
        ops.write(fd, data)
        ops.fdatasync(fd)
    finally:
        ops.close(fd)
    ops.replace(temp, path)
    ops.fsync_dir(path.parent)


@dataclass(frozen=True, slots=True)
class Checkpoint:
    """What the checkpoint records (``next_offset`` is a floor: a restart never goes below it)."""

    start_offset: int
    next_offset: int
    updated_ms: int


def encode_checkpoint(checkpoint: Checkpoint) -> bytes:
    """The file's bytes: one JSON object, keys sorted so equal checkpoints are equal bytes."""
    body = {
        "version": CHECKPOINT_VERSION,
        "start_offset": checkpoint.start_offset,
        "next_offset": checkpoint.next_offset,
        "updated_ms": checkpoint.updated_ms,
    }
    return json.dumps(body, sort_keys=True).encode() + b"\n"


def decode_checkpoint(data: bytes) -> Checkpoint:
    """Parse and check the file's bytes; raises :class:`WalCorruptionError` if they are bad."""

    def bad(reason: str) -> WalCorruptionError:
        return WalCorruptionError(segment=CHECKPOINT_NAME, offset=None, position=0, reason=reason)

    try:
        body = json.loads(data)
    except ValueError as exc:
        raise bad(f"not JSON: {exc}") from exc
    if not isinstance(body, dict):
        raise bad("not a JSON object")
    if body.get("version") != CHECKPOINT_VERSION:
        raise bad(f"unsupported checkpoint version {body.get('version')!r}")
    fields = {}
    for key in ("start_offset", "next_offset", "updated_ms"):
        value = body.get(key)
        # bool is an int subclass: reject it explicitly, it is never a valid offset.
        if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= _MAX_OFFSET:
            raise bad(f"{key} is {value!r}, not an integer in [0, 2**64)")
        fields[key] = value
    if fields["start_offset"] > fields["next_offset"]:
        raise bad("start_offset is past next_offset")
    return Checkpoint(**fields)


class CheckpointStore:
    """Reads and writes one WAL directory's checkpoint; safe to call from several threads."""

    def __init__(self, ops: FileOps, directory: Path) -> None:
        self._ops = ops
        self._path = directory / CHECKPOINT_NAME
        self._lock = threading.Lock()  # the writer thread and fetch/drop threads all write
        self._last: Checkpoint | None = None
        self.writes = 0

    @property
    def last(self) -> Checkpoint | None:
        """The checkpoint as last loaded or written."""
        return self._last

    def load(self) -> Checkpoint | None:
        """The checkpoint on disk, or ``None`` if there is none (a new WAL). Blocking."""
        try:
            data = self._ops.read_file(self._path)
        except FileNotFoundError:
            return None
        with self._lock:
            self._last = decode_checkpoint(data)
            return self._last

    def write(self, *, start_offset: int, next_offset: int) -> Checkpoint:
        """Record these values (merged with the last ones: nothing moves back). Blocking."""
        with self._lock:
            last = self._last
            if last is not None:
                start_offset = max(start_offset, last.start_offset)
                next_offset = max(next_offset, last.next_offset)
                if (start_offset, next_offset) == (last.start_offset, last.next_offset):
                    return last  # nothing new to make durable
            checkpoint = Checkpoint(
                start_offset, max(next_offset, start_offset), int(time.time() * 1000)
            )
            atomic_write(self._path, encode_checkpoint(checkpoint), ops=self._ops)
            self._last = checkpoint
            self.writes += 1
            return checkpoint

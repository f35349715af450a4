"""``owner.json``: the ownership epoch this node last claimed a partition under.

Read before a claim, written (atomically) right after one and before anything is
acknowledged under the new epoch; ownership.start_offset explains why it matters.
"""

from __future__ import annotations

import logging
from pathlib import Path

import orjson

from danube.ingest.wal import atomic_write

log = logging.getLogger(__name__)


def read_epoch(path: Path) -> int | None:
    """The recorded epoch, or None when absent or unreadable (then no exact resume)."""
    try:
        epoch = orjson.loads(path.read_bytes())["epoch"]
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError) as exc:
        log.warning("ignoring unreadable %s: %s", path, exc)
        return None
    return epoch if isinstance(epoch, int) and epoch >= 1 else None


def write_epoch(path: Path, epoch: int) -> None:
    """Record ``epoch`` durably (temp file, fsync, rename, fsync of the directory)."""
    atomic_write(path, orjson.dumps({"epoch": epoch}))

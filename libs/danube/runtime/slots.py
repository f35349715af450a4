"""Node slots: stable node ids for replicas that share nothing but a directory.

``docker compose up --scale ingest=3`` starts three identical containers; none is told
"you are the second". Yet an ingest node's id must be stable across restarts (it takes its
partitions back by id) and its WAL directory must be its own. A slot gives both: each
process takes the lowest free ``<dir>/<kind>-<n>.lock`` by an exclusive ``flock`` it holds
for its whole life, and is ``<kind>-<n>``. The kernel releases the lock when the process
dies however it dies, so a restarted replica takes a free slot again, and whichever process
holds slot ``n`` also owns everything named after ``<kind>-<n>`` (its WAL directory
``…/wal/ingest-1``): the id and the data always travel together.

The directory must be shared by every replica of the kind (a volume mounted into each
container) and be on a filesystem where ``flock`` works across processes (any local one;
not every network filesystem).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import socket
from dataclasses import dataclass
from pathlib import Path

from danube.errors import DanubeError

SLOTS_ENV = "DANUBE_NODE_SLOTS"
# A kind never runs more replicas than this on one slot directory; the limit keeps a
# misconfigured directory (not shared, not writable) from being searched forever.
SLOTS_MAX = 256


class SlotError(DanubeError):
    """No slot could be taken: every one is held, or the directory is unusable."""

    code = "no_slot"


@dataclass
class Slot:
    """A held slot: ``node_id`` is this process's while ``fd`` stays open."""

    node_id: str
    path: Path
    fd: int

    def release(self) -> None:
        """Give the slot up (closing the descriptor drops the lock); idempotent."""
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


def claim_slot(directory: Path, kind: str, *, slots_max: int = SLOTS_MAX) -> Slot:
    """Take the lowest free slot of ``kind`` under ``directory`` (created if missing)."""
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise SlotError(f"slot directory {directory}: {exc}") from exc
    for number in range(slots_max):
        path = directory / f"{kind}-{number}.lock"
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            raise SlotError(f"slot file {path}: {exc}") from exc
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            continue
        except OSError as exc:
            os.close(fd)
            raise SlotError(f"cannot lock {path}: {exc}") from exc
        _note_holder(fd)
        return Slot(node_id=f"{kind}-{number}", path=path, fd=fd)
    raise SlotError(f"all {slots_max} slots of {kind} under {directory} are held")


def _note_holder(fd: int) -> None:
    # For an operator looking at the directory: who holds the slot. Never read back; the
    # lock alone decides.
    note = f"{socket.gethostname()} pid {os.getpid()}\n".encode()
    with contextlib.suppress(OSError):
        os.ftruncate(fd, 0)
        os.pwrite(fd, note, 0)

"""The leader-epoch history of one replica's log, and where two logs diverge.

Each leader writes offsets under its epoch, and never writes an offset twice; so two replicas
hold the same message at an offset exactly when they attribute that offset to the same epoch.
A replica records, beside its WAL, at which offset each epoch's messages begin::

    epochs.json   {"version": 1, "epochs": [[epoch, start_offset], ...]}

epochs strictly increasing, start offsets non-decreasing. A leader appends ``(epoch, its end)``
before it writes anything under a new epoch; a follower copies the leader's entries that
cover what it has fetched (it writes them before the frames, so a crash never leaves frames
the file does not explain). Offsets below the first entry are epoch 0 on every replica.

:func:`divergence` compares a follower's history with its leader's (Kafka's KIP-101/279 do
the same one request at a time): the follower keeps the longest prefix on which both agree
and truncates the rest before it follows. Pure logic except :func:`load` and :func:`store`.
"""

from __future__ import annotations

import json
from bisect import bisect_right
from dataclasses import dataclass
from pathlib import Path

from danube.errors import DanubeError
from danube.ingest.wal.checkpoint import atomic_write
from danube.ingest.wal.fileops import OsFileOps

EPOCHS_FILE = "epochs.json"
_VERSION = 1
EPOCHS_MAX = 100_000  # one entry per leader change: a bound that is never near in practice


class EpochHistoryError(DanubeError):
    """An epochs file or a leader's history that breaks the rules above."""

    code = "bad_epoch_history"


@dataclass(frozen=True)
class EpochHistory:
    """``(epoch, start_offset)`` entries, in order. Immutable: methods return new histories."""

    entries: tuple[tuple[int, int], ...] = ()

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Raise EpochHistoryError unless epochs rise strictly and starts never fall."""
        if len(self.entries) > EPOCHS_MAX:
            raise EpochHistoryError(f"{len(self.entries)} epochs is over {EPOCHS_MAX}")
        previous: tuple[int, int] | None = None
        for epoch, start in self.entries:
            if epoch < 1 or start < 0:
                raise EpochHistoryError(f"bad entry ({epoch}, {start})")
            if previous is not None and (epoch <= previous[0] or start < previous[1]):
                raise EpochHistoryError(f"entry ({epoch}, {start}) after {previous}")
            previous = (epoch, start)

    @property
    def latest(self) -> int:
        """The newest epoch, 0 when the history is empty."""
        return self.entries[-1][0] if self.entries else 0

    def epoch_at(self, offset: int) -> int:
        """The epoch the message at ``offset`` was written under (0 before the first entry)."""
        index = bisect_right(self._starts(), offset)
        return 0 if index == 0 else self.entries[index - 1][0]

    def _starts(self) -> list[int]:
        return [start for _, start in self.entries]

    def with_epoch(self, epoch: int, start_offset: int) -> EpochHistory:
        """This history with a new leader epoch starting at ``start_offset``."""
        return EpochHistory((*self.entries, (epoch, start_offset)))

    def truncated(self, end: int) -> EpochHistory:
        """The entries that still describe a log cut to end before ``end``."""
        return EpochHistory(tuple(e for e in self.entries if e[1] < end))

    def until(self, end: int) -> EpochHistory:
        """The entries that begin at or before ``end``: a follower's history once its log is
        this (leader's) log up to ``end`` (an entry at ``end`` begins the epoch the next
        fetched message belongs to)."""
        return EpochHistory(tuple(e for e in self.entries if e[1] <= end))

    def to_json(self) -> list[list[int]]:
        return [[epoch, start] for epoch, start in self.entries]

    @classmethod
    def from_json(cls, raw: object) -> EpochHistory:
        """Parse ``[[epoch, start], ...]``; EpochHistoryError if it is anything else."""
        if not isinstance(raw, list):
            raise EpochHistoryError("epoch history is not a list")
        entries = []
        for item in raw:
            if (
                not isinstance(item, list)
                or len(item) != 2
                or not all(isinstance(v, int) and not isinstance(v, bool) for v in item)
            ):
                raise EpochHistoryError(f"bad epoch entry {item!r}")
            entries.append((int(item[0]), int(item[1])))
        return cls(tuple(entries))


def divergence(
    follower: EpochHistory, follower_end: int, leader: EpochHistory, leader_end: int
) -> int:
    """The end of the longest prefix both logs share: the follower keeps offsets below it.

    Two offsets agree when both histories attribute them to the same epoch; the answer is
    the first offset below ``min(follower_end, leader_end)`` where they do not, else that
    minimum. The attributions only change at entry starts, so only those are compared.
    """
    limit = min(follower_end, leader_end)
    points = sorted({0, *follower._starts(), *leader._starts()})
    for point in points:
        if point >= limit:
            break
        if follower.epoch_at(point) != leader.epoch_at(point):
            return point
    return limit


def load(directory: Path) -> EpochHistory | None:
    """The history in ``directory``, or ``None`` when there is no file (a new or wiped
    replica: it may not lead a partition that already had a leader)."""
    try:
        data = (directory / EPOCHS_FILE).read_bytes()
    except FileNotFoundError:
        return None
    try:
        body = json.loads(data)
    except ValueError as exc:
        raise EpochHistoryError(f"{directory / EPOCHS_FILE}: not JSON: {exc}") from exc
    if not isinstance(body, dict) or body.get("version") != _VERSION:
        raise EpochHistoryError(f"{directory / EPOCHS_FILE}: unsupported content")
    return EpochHistory.from_json(body.get("epochs"))


def store(directory: Path, history: EpochHistory) -> None:
    """Write the history atomically and durably (temp file, fsync, rename). Blocking."""
    body = {"version": _VERSION, "epochs": history.to_json()}
    atomic_write(directory / EPOCHS_FILE, json.dumps(body).encode() + b"\n")


def remove(directory: Path) -> None:
    """Forget the history (an unclean restart of the log); durable. Blocking."""
    try:
        (directory / EPOCHS_FILE).unlink()
    except FileNotFoundError:
        return
    OsFileOps().fsync_dir(directory)

"""The file layer an ingest node's WALs share (danube.ingest.wal.bounded): at most
``open_max`` descriptors, the least recently used one synced and closed for room and reopened
at its next use; free space checked against the floor, the last look trusted only far above
it; allocating ahead refused where it would pass the floor. Real files, real fdatasync."""

from __future__ import annotations

import errno
import os
import threading
from pathlib import Path

import pytest

from danube.ingest.wal import BoundedFileOps, DiskFullError
from danube.ingest.wal import bounded as bounded_module


def _ops(tmp_path: Path, *, open_max: int = 1, free_min_bytes: int = 0) -> BoundedFileOps:
    return BoundedFileOps(open_max=open_max, free_min_bytes=free_min_bytes, wal_root=tmp_path)


def test_the_least_recently_used_file_is_closed_for_room_and_reopened_to_write(
    tmp_path: Path,
) -> None:
    ops = _ops(tmp_path, open_max=1)
    first = ops.create(tmp_path / "a", exclusive=True)
    ops.write_at(first, b"a1", 0)
    second = ops.create(tmp_path / "b", exclusive=True)  # closes `a` for room
    assert ops.open_count == 1
    ops.write_at(second, b"b1", 0)
    ops.write_at(first, b"a2", 2)  # reopened; `b` closed for room
    ops.fdatasync(first)
    ops.write_at(second, b"b2", 2)
    ops.fdatasync(second)
    assert ops.reopens == 2
    assert ops.open_count == 1
    assert (tmp_path / "a").read_bytes() == b"a1a2"
    assert (tmp_path / "b").read_bytes() == b"b1b2"
    ops.close(first)
    ops.close(second)
    assert ops.open_count == 0


def test_a_call_that_fails_still_closes_the_files_taken_for_room(tmp_path: Path) -> None:
    ops = _ops(tmp_path, open_max=1)
    first = ops.create(tmp_path / "a", exclusive=True)
    second = ops.create(tmp_path / "b", exclusive=True)  # `a` closed for room
    ops.write(second, b"b1")
    (tmp_path / "a").unlink()  # reopening `a` fails: nothing is taken for room
    with pytest.raises(FileNotFoundError):
        ops.write(first, b"a1")
    ops.write(second, b"b2")  # `b` is not left locked
    assert (tmp_path / "b").read_bytes() == b"b1b2"

    ops = _ops(tmp_path, open_max=1)
    c = ops.create(tmp_path / "c", exclusive=True)
    d = ops.create(tmp_path / "d", exclusive=True)  # `c` closed for room
    # Writing `c` reopens it and takes `d` for room; the write itself fails (not bytes), and
    # `d` is closed anyway: its next use reopens it instead of waiting on a lock held forever.
    with pytest.raises(TypeError):
        ops.write(c, "not bytes")  # type: ignore[arg-type]
    done = threading.Thread(target=ops.write, args=(d, b"d1"), daemon=True)
    done.start()
    done.join(timeout=5)
    assert not done.is_alive(), "the file taken for room was left locked"
    assert (tmp_path / "d").read_bytes() == b"d1"


def test_free_space_far_above_the_floor_is_trusted_for_a_moment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    looks: list[int] = []
    free = [bounded_module.ROOM_TRUSTED_BYTES * 4]

    def free_bytes(self: BoundedFileOps, path: Path) -> int:
        looks.append(free[0])
        return free[0]

    monkeypatch.setattr(BoundedFileOps, "free_bytes", free_bytes)
    ops = _ops(tmp_path, free_min_bytes=1 << 20)
    for _ in range(5):
        ops.check_room(tmp_path, 1 << 20)
    assert len(looks) == 1  # far above the floor: the first look answers the rest

    # Close to the floor the filesystem is asked every time, and a full disk is refused.
    free[0] = bounded_module.ROOM_TRUSTED_BYTES // 2
    ops = _ops(tmp_path, free_min_bytes=1 << 20)
    looks.clear()
    for _ in range(3):
        ops.check_room(tmp_path, 1 << 20)
    assert len(looks) == 3
    free[0] = (1 << 20) + 10
    with pytest.raises(DiskFullError):
        ops.check_room(tmp_path, 1 << 20)
    assert ops.disk_full


def test_trusted_room_runs_out_with_what_was_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    looks: list[int] = []
    spare = bounded_module.ROOM_TRUSTED_BYTES

    def free_bytes(self: BoundedFileOps, path: Path) -> int:
        looks.append(1)
        return spare * 2

    monkeypatch.setattr(BoundedFileOps, "free_bytes", free_bytes)
    ops = _ops(tmp_path)
    ops.check_room(tmp_path, 0)
    ops.check_room(tmp_path, spare // 2)  # trusted: spare * 1.5 left above the trust line
    assert len(looks) == 1
    ops.check_room(tmp_path, spare)  # would leave less than the trusted margin: look again
    assert len(looks) == 2


def test_allocating_ahead_stops_at_the_floor(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    free = 3 << 20
    monkeypatch.setattr(
        os,
        "fstatvfs",
        lambda fd: type("Stats", (), {"f_bavail": free, "f_frsize": 1})(),
    )
    ops = _ops(tmp_path, free_min_bytes=1 << 20)
    handle = ops.create(tmp_path / "a", exclusive=True)
    ops.allocate(handle, 0, 1 << 20)  # 2 MiB left: above the floor
    assert (tmp_path / "a").stat().st_size == 1 << 20
    assert (tmp_path / "a").read_bytes() == bytes(1 << 20)
    free = (2 << 20) - 1  # the next MiB would leave less than the floor
    with pytest.raises(OSError, match="floor") as refused:
        ops.allocate(handle, 1 << 20, 1 << 20)
    assert refused.value.errno == errno.ENOSPC
    assert (tmp_path / "a").stat().st_size == 1 << 20  # nothing allocated
    ops.write_at(handle, b"x", 5)  # the file is still usable
    ops.close(handle)
    assert (tmp_path / "a").read_bytes()[:6] == b"\0" * 5 + b"x"

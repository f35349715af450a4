"""A lone append written and synced on the event loop's thread (danube.ingest.wal.commit,
``inline_lone_appends``), on real files: each is durable once its append returns and is
read back after a restart; appends that come together keep their group commit; a slow
sync sends the next appends through the writer thread; no room and a failed sync end as
they do through the thread."""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path

import pytest

from danube.ingest.wal import DiskFullError, Durability, Wal, WalFailedError
from danube.ingest.wal import commit as commit_module
from danube.ingest.wal.fileops import OsFileOps
from tests.integration.test_wal import GatedOps, fetch_all, options, payload

pytestmark = pytest.mark.integration

INLINE = {"inline_lone_appends": True}


@pytest.fixture(autouse=True)
def a_steady_disk(monkeypatch: pytest.MonkeyPatch) -> None:
    """These tests count which appends were written on the loop; a real fdatasync past
    INLINE_SLOW_S (20 ms: common on a disk shared with a loaded test run) would send the
    next ones through the thread and change the count. The slow-sync rule has its own test,
    which sets its own threshold."""
    monkeypatch.setattr(commit_module, "INLINE_SLOW_S", 5.0)


async def test_lone_appends_are_written_on_the_loop_and_are_durable(tmp_path: Path) -> None:
    ops = GatedOps()
    wal = await Wal.open(tmp_path / "p", options(**INLINE), file_ops=ops)
    for n in range(20):
        assert await wal.append([payload(n)]) == n
        assert wal.durable_next == n + 1  # durable when the append returns
        await asyncio.sleep(0)  # the next in a later loop step, as a next request comes
    stats = wal.stats()
    assert stats.inline_appends == 20
    assert ops.fdatasyncs_entered == stats.fsyncs == 20  # each synced before it returned
    assert await fetch_all(wal, 0) == [(n, payload(n)) for n in range(20)]
    await wal.close()
    reopened = await Wal.open(tmp_path / "p", options())
    assert await fetch_all(reopened, 0) == [(n, payload(n)) for n in range(20)]
    await reopened.close()


async def test_appends_that_come_together_keep_their_group_commit(tmp_path: Path) -> None:
    ops = GatedOps()
    wal = await Wal.open(tmp_path / "p", options(**INLINE), file_ops=ops)
    offsets = await asyncio.gather(*(wal.append([payload(n)]) for n in range(40)))
    assert sorted(offsets) == list(range(40))
    stats = wal.stats()
    assert stats.inline_appends <= 1  # one loop step: the first at most
    assert ops.fdatasyncs_entered < 10  # the rest grouped by the writer thread
    assert await fetch_all(wal, 0) == [(n, payload(n)) for n in range(40)]
    await wal.close()


async def test_a_slow_sync_on_the_loop_sends_the_next_appends_to_the_thread(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    slow_s = 0.02  # its own threshold: the fixture's is for the tests that count
    monkeypatch.setattr(commit_module, "INLINE_SLOW_S", slow_s)

    class SlowOps(OsFileOps):
        def fdatasync(self, fd: int) -> None:
            time.sleep(slow_s * 1.5)
            super().fdatasync(fd)

    wal = await Wal.open(tmp_path / "p", options(**INLINE), file_ops=SlowOps())
    assert await wal.append([payload(0)]) == 0
    assert wal.stats().inline_appends == 1  # it took past INLINE_SLOW_S: no more for a while
    for n in range(1, 4):
        assert await wal.append([payload(n)]) == n
        await asyncio.sleep(0)
    assert wal.stats().inline_appends == 1
    assert await fetch_all(wal, 0) == [(n, payload(n)) for n in range(4)]
    await wal.close()


async def test_no_room_refuses_the_append_on_the_loop_and_the_wal_goes_on(
    tmp_path: Path,
) -> None:
    class FullOps(OsFileOps):
        full = False

        def check_room(self, path: Path, size_bytes: int) -> None:
            if self.full:
                raise DiskFullError(wal_dir=str(path), free_bytes=0, needed_bytes=size_bytes)

    ops = FullOps()
    wal = await Wal.open(tmp_path / "p", options(**INLINE), file_ops=ops)
    assert await wal.append([payload(0)]) == 0
    ops.full = True
    await asyncio.sleep(0)
    with pytest.raises(DiskFullError):
        await wal.append([payload(1)])
    assert (wal.next_offset, wal.durable_next) == (1, 1)  # its offset given back
    ops.full = False
    await asyncio.sleep(0)
    assert await wal.append([payload(1)]) == 1  # no gap
    assert wal.stats().inline_appends == 3
    assert await fetch_all(wal, 0) == [(0, payload(0)), (1, payload(1))]
    await wal.close()


async def test_a_failed_sync_on_the_loop_fails_the_wal(tmp_path: Path) -> None:
    ops = GatedOps()
    wal = await Wal.open(tmp_path / "p", options(**INLINE), file_ops=ops)
    assert await wal.append([payload(0)]) == 0
    ops.fail_fdatasync = True
    await asyncio.sleep(0)
    with pytest.raises(WalFailedError):
        await wal.append([payload(1)])
    assert wal.stats().inline_appends == 2
    assert wal.stats().failed
    assert wal.durable_next == 1
    ops.fail_fdatasync = False
    with pytest.raises(WalFailedError):
        await wal.append([payload(2)])
    await wal.close()


async def test_a_bug_under_the_append_on_the_loop_fails_the_wal_and_frees_its_writer(
    tmp_path: Path,
) -> None:
    class BrokenOps(OsFileOps):
        broken = False

        def write_at(self, fd: int, data: bytes | bytearray | memoryview, position: int) -> None:
            if self.broken:
                raise RuntimeError("a bug under the writer")
            super().write_at(fd, data, position)

    ops = BrokenOps()
    wal = await Wal.open(tmp_path / "p", options(**INLINE), file_ops=ops)
    assert await wal.append([payload(0)]) == 0
    ops.broken = True
    await asyncio.sleep(0)
    with pytest.raises(WalFailedError, match="crashed"):
        await wal.append([payload(1)])
    assert wal.stats().failed
    async with asyncio.timeout(5):  # the writer thread was not left waiting for its turn
        await wal.close()


async def test_the_thread_and_the_loop_never_write_at_once(tmp_path: Path) -> None:
    """Interval mode: the writer thread syncs on its own cadence while the loop writes lone
    appends; the one segment writer is never in both threads' hands at once."""

    class WatchingOps(OsFileOps):
        def __init__(self) -> None:
            self.lock = threading.Lock()
            self.active = 0
            self.most = 0
            self.threads: set[str] = set()

        def _enter(self, hold_s: float) -> None:
            with self.lock:
                self.active += 1
                self.most = max(self.most, self.active)
                self.threads.add(threading.current_thread().name)
            time.sleep(hold_s)  # long enough for an overlap to show

        def _leave(self) -> None:
            with self.lock:
                self.active -= 1

        def write_at(self, fd: int, data: bytes | bytearray | memoryview, position: int) -> None:
            self._enter(0.003)  # most of the thread's 5 ms cadence: it comes due meanwhile
            try:
                super().write_at(fd, data, position)
            finally:
                self._leave()

        def fdatasync(self, fd: int) -> None:
            self._enter(0.0002)
            try:
                super().fdatasync(fd)
            finally:
                self._leave()

    ops = WatchingOps()
    interval = options(durability=Durability.INTERVAL, sync_interval_ms=5, **INLINE)
    wal = await Wal.open(tmp_path / "p", interval, file_ops=ops)
    for n in range(100):
        assert await wal.append([payload(n)]) == n
        await asyncio.sleep(0.0005)
    assert wal.stats().inline_appends > 20  # the rest while the thread synced
    assert len(ops.threads) == 2  # the loop's (its writes) and the writer's (its syncs)
    assert ops.most == 1
    assert await fetch_all(wal, 0) == [(n, payload(n)) for n in range(100)]
    await wal.close()


async def test_lone_appends_leave_the_writer_thread_asleep(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Always mode: a lone append on the loop brings no sync or rotation sooner, so the
    thread is not woken for it (each wake would take the GIL from the answer's way)."""
    wakes = 0
    idle_timeout_s = commit_module.GroupCommit._idle_timeout_s

    def counted(self: commit_module.GroupCommit, writer: object) -> float | None:
        nonlocal wakes
        wakes += 1
        return idle_timeout_s(self, writer)  # type: ignore[arg-type]

    monkeypatch.setattr(commit_module.GroupCommit, "_idle_timeout_s", counted)
    wal = await Wal.open(tmp_path / "p", options(**INLINE), file_ops=GatedOps())
    await asyncio.sleep(0.05)  # the thread waits for its first work
    before = wakes
    for n in range(30):
        assert await wal.append([payload(n)]) == n
        await asyncio.sleep(0.001)  # the next in a later loop step, and time for a wake
    assert wal.stats().inline_appends == 30
    assert wakes - before <= 2
    await wal.close()


async def test_an_interval_sync_owed_by_an_append_on_the_loop_is_kept(tmp_path: Path) -> None:
    """Interval mode: the thread slept with nothing owed; a lone append on the loop leaves
    its bytes unsynced, and the thread is woken to sync them on cadence."""
    ops = GatedOps()
    interval = options(durability=Durability.INTERVAL, sync_interval_ms=20, **INLINE)
    wal = await Wal.open(tmp_path / "p", interval, file_ops=ops)
    await asyncio.sleep(0.1)  # synced, nothing owed: the thread waits without a deadline
    synced = ops.fdatasyncs_entered
    assert await wal.append([payload(0)]) == 0
    assert wal.stats().inline_appends == 1
    async with asyncio.timeout(2):
        while ops.fdatasyncs_entered == synced:  # noqa: ASYNC110 - the writer thread syncs
            await asyncio.sleep(0.005)
    await wal.close()

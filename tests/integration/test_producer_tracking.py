"""Idempotent producers' states over a real WAL's lives (files, fsync, no servers): rebuilt
from the log alone, from a snapshot and the records after it, after a truncation that cut
below the newest snapshot (which is then deleted), and past a snapshot that fails its CRC."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from danube.frame import Record, encode_record
from danube.ingest.producer_tracking import ProducerTracking
from danube.ingest.producers import ProducerStates
from danube.ingest.wal import Wal
from danube.ingest.wal.fileops import OsFileOps
from danube.ingest.wal.truncate import truncate_dir
from tests.integration.test_wal import options

pytestmark = pytest.mark.integration


def rec(producer: str, sequence: int) -> bytes:
    return encode_record(
        Record(payload=b"x", publish_time_ms=1, producer=producer, sequence=sequence)
    )


async def opened(directory: Path) -> tuple[Wal, ProducerTracking]:
    wal = await Wal.open(directory, options())
    tracking = ProducerTracking(directory, ProducerStates())
    await tracking.opened(wal)
    return wal, tracking


def next_sequence(tracking: ProducerTracking, producer: str) -> int | None:
    state = tracking.states.get(producer.encode())
    return None if state is None else state.next_sequence


def snapshots(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.glob("producers-*.snap"))


async def test_states_survive_reopens_snapshots_and_truncations(tmp_path: Path) -> None:
    directory = tmp_path / "p"
    wal, tracking = await opened(directory)
    await wal.append([rec("a", s) for s in range(5)])  # offsets 0..4
    await wal.append([rec("b", 0), rec("b", 1)])  # 5..6
    await wal.close()

    wal, tracking = await opened(directory)  # no snapshot: the log is read
    assert next_sequence(tracking, "a") == 5
    assert next_sequence(tracking, "b") == 2
    await tracking.snapshot(wal)  # at 7
    await wal.append([rec("a", 5), rec("a", 6)])  # 7..8
    await tracking.snapshot(wal)  # at 9
    assert snapshots(directory) == [
        "producers-00000000000000000007.snap",
        "producers-00000000000000000009.snap",
    ]
    await wal.close()

    wal, tracking = await opened(directory)  # the snapshot at 9, nothing after it
    assert next_sequence(tracking, "a") == 7
    assert tracking.states.get(b"a") is not None
    await wal.close()

    # A truncation to 8 cuts below the newest snapshot: it is deleted, the older one used.
    removed = await asyncio.to_thread(
        truncate_dir, OsFileOps(), directory, 8, max_payload_bytes=64 * 1024
    )
    assert removed == 1
    wal, tracking = await opened(directory)
    assert snapshots(directory) == ["producers-00000000000000000007.snap"]
    assert next_sequence(tracking, "a") == 6  # 5 at offset 7 (read after the snapshot)
    state = tracking.states.get(b"a")
    assert state is not None
    assert state.offset_of(5, 1) == 7
    await wal.close()

    # A damaged snapshot is skipped: the log is read from its start.
    snapshot = directory / "producers-00000000000000000007.snap"
    data = bytearray(snapshot.read_bytes())
    data[-3] ^= 0xFF
    snapshot.write_bytes(bytes(data))
    wal, tracking = await opened(directory)
    assert next_sequence(tracking, "a") == 6
    assert next_sequence(tracking, "b") == 2
    await wal.close()


async def test_a_retention_drop_snapshots_the_states_of_the_records_it_removes(
    tmp_path: Path,
) -> None:
    # Without a snapshot past the new start, a restart would rebuild from what is left and
    # forget producer "a", whose batches lay only in the dropped segments: a resend of its
    # last batch would be stored again.
    directory = tmp_path / "p"
    small = options(rotation_max_bytes=256)  # a segment or so per append
    wal = await Wal.open(directory, small)
    tracking = ProducerTracking(directory, ProducerStates())
    await tracking.opened(wal)
    await wal.append([rec("a", s) for s in range(4)])  # offsets 0..3
    for index in range(6):
        await wal.append([rec("b", index)])  # 4..9, rolling segments
    assert snapshots(directory) == []
    assert await wal.drop_below(9) > 0
    assert wal.start_offset > 3  # every record of "a" is gone from the log
    assert snapshots(directory) == ["producers-00000000000000000010.snap"]
    await wal.close()

    wal = await Wal.open(directory, small)
    tracking = ProducerTracking(directory, ProducerStates())
    await tracking.opened(wal)
    state = tracking.states.get(b"a")
    assert state is not None
    assert state.offset_of(0, 4) == 0  # the resend of a's batch is still recognised
    assert next_sequence(tracking, "b") == 6
    # A drop the newest snapshot covers writes none.
    for index in range(6, 10):
        await wal.append([rec("b", index)])  # 10..13
    await wal.drop_below(10)
    assert snapshots(directory) == ["producers-00000000000000000010.snap"]
    await wal.close()

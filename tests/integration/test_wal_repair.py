"""Repairing a damaged sealed segment on real files from another copy's frames: the file
ends byte for byte the other copy's, reads go through again, and a repair that does not fit
or is cut short leaves the damaged file as it was (its temp file gone at the next open)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from danube.frame import FRAME_HEADER_BYTES
from danube.ingest.wal import (
    Durability,
    RepairRefusedError,
    Wal,
    WalCorruptionError,
    WalOptions,
    segment_name,
)
from danube.ingest.wal.repair import REPAIR_SUFFIX

pytestmark = pytest.mark.integration

PAYLOAD_BYTES = 100
PER_SEGMENT = 10
COUNT = 45  # segments of 0..9, 10..19, ... 40..44 (the newest)


def _options() -> WalOptions:
    return WalOptions(
        durability=Durability.FSYNC,
        max_batch_bytes=1024 * 1024,
        sync_interval_ms=50,
        rotation_max_bytes=(FRAME_HEADER_BYTES + PAYLOAD_BYTES) * PER_SEGMENT,
        rotation_max_age_s=None,
        cache_capacity=0,  # every read from the files
        max_pending_bytes=4 * 1024 * 1024,
        max_frame_payload_bytes=64 * 1024,
    )


def _payload(offset: int) -> bytes:
    return f"{offset:05d}".encode().ljust(PAYLOAD_BYTES, b"x")


async def _two_copies(tmp_path: Path) -> tuple[Wal, Wal]:
    copies = []
    for name in ("damaged", "intact"):
        wal = await Wal.open(tmp_path / name, _options())
        for offset in range(COUNT):
            await wal.append([_payload(offset)])
        copies.append(wal)
    return copies[0], copies[1]


def _flip(path: Path, frame_index: int) -> None:
    position = frame_index * (FRAME_HEADER_BYTES + PAYLOAD_BYTES) + FRAME_HEADER_BYTES + 7
    data = bytearray(path.read_bytes())
    data[position] ^= 0xFF
    path.write_bytes(bytes(data))


async def _range(wal: Wal, start: int, end: int) -> bytes:
    """The whole frames of ``[start, end)`` as ``wal`` holds them."""
    result = await wal.fetch(start, max_bytes=1 << 20, max_count=end - start, limit_offset=end)
    return b"".join(bytes(frame) for _, frame in result.frames)


async def test_a_damaged_segment_is_rewritten_to_the_other_copys_bytes(tmp_path: Path) -> None:
    damaged, intact = await _two_copies(tmp_path)
    name = segment_name(20)
    path = tmp_path / "damaged" / name
    assert path.read_bytes() == (tmp_path / "intact" / name).read_bytes()
    _flip(path, 4)  # offset 24
    before = await damaged.fetch(22, max_bytes=1 << 20, max_count=100)
    assert [offset for offset, _ in before.frames] == [22, 23]  # reads stop at the damage
    with pytest.raises(WalCorruptionError) as raised:
        await damaged.fetch(24, max_bytes=1 << 20, max_count=100)
    assert raised.value.offset == 24
    assert await damaged.find_damage(0) is None  # another segment, intact
    assert await damaged.find_damage(40) is None  # the newest is never repaired
    damage = await damaged.find_damage(24)
    assert damage is not None
    assert (damage.segment, damage.bad_offset, damage.end_offset) == (name, 24, 30)
    assert damage.good_end == 4 * (FRAME_HEADER_BYTES + PAYLOAD_BYTES)

    await damaged.repair_segment(damage, await _range(intact, 24, 30))
    assert path.read_bytes() == (tmp_path / "intact" / name).read_bytes()
    assert not list((tmp_path / "damaged").glob("*.tmp"))
    result = await damaged.fetch(0, max_bytes=1 << 20, max_count=100)
    assert [offset for offset, _ in result.frames] == list(range(COUNT))
    assert await damaged.find_damage(24) is None
    await damaged.close()
    await intact.close()
    reopened = await Wal.open(tmp_path / "damaged", _options())
    result = await reopened.fetch(20, max_bytes=1 << 20, max_count=10)
    assert [bytes(frame[FRAME_HEADER_BYTES:]) for _, frame in result.frames] == [
        _payload(offset) for offset in range(20, 30)
    ]
    await reopened.close()


async def test_frames_that_do_not_fit_leave_the_damaged_file_alone(tmp_path: Path) -> None:
    damaged, intact = await _two_copies(tmp_path)
    path = tmp_path / "damaged" / segment_name(10)
    _flip(path, 2)  # offset 12
    before = path.read_bytes()
    damage = await damaged.find_damage(15)
    assert damage is not None
    assert damage.bad_offset == 12
    for wrong in (await _range(intact, 13, 20), await _range(intact, 12, 21)):
        with pytest.raises(RepairRefusedError):
            await damaged.repair_segment(damage, wrong)
    stale = replace(damage, good_end=damage.good_end - 1)  # the file is not what was found
    with pytest.raises(RepairRefusedError):
        await damaged.repair_segment(stale, await _range(intact, 12, 20))
    assert path.read_bytes() == before
    assert not list((tmp_path / "damaged").glob("*.tmp"))
    await damaged.close()
    await intact.close()


async def test_a_repair_cut_short_by_a_crash_leaves_the_old_file(tmp_path: Path) -> None:
    damaged, intact = await _two_copies(tmp_path)
    path = tmp_path / "damaged" / segment_name(30)
    _flip(path, 0)
    before = path.read_bytes()
    await damaged.close()
    await intact.close()
    # What a crash before the rename leaves: a partial temp file beside the segment.
    temp = path.with_name(path.name + REPAIR_SUFFIX)
    temp.write_bytes(before[:50])
    reopened = await Wal.open(tmp_path / "damaged", _options())
    assert not temp.exists()
    assert path.read_bytes() == before
    damage = await reopened.find_damage(30)
    assert damage is not None
    assert damage.bad_offset == 30
    await reopened.close()

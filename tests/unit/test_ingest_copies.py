"""Reading other replicas' copies and repairing from them, the pure parts: the repl.read
and repl.fetch bodies, the checks on frames another copy sends, and the damaged-offsets file."""

from __future__ import annotations

from pathlib import Path

import pytest

from danube.frame import append_frame, encode_frame
from danube.ingest.copies import checked_frames
from danube.ingest.repairs import DAMAGED_FILE, _load, _save
from danube.ingest.wal import RepairRefusedError, SegmentDamage
from danube.ingest.wal.repair import check_frames
from danube.wire.ingest import protocol, replication


def _frames(first: int, count: int) -> bytes:
    body = bytearray()
    for offset in range(first, first + count):
        append_frame(body, offset, f"m{offset}".encode())
    return bytes(body)


def test_a_replica_read_round_trips_and_refuses_empty_ranges() -> None:
    read = replication.ReplReadRequest(100, 130, 4096)
    assert replication.ReplReadRequest.decode(read.encode()) == read
    with pytest.raises(protocol.BadRequestError):
        replication.ReplReadRequest.decode(replication.ReplReadRequest(5, 5, 1).encode())
    with pytest.raises(protocol.BadRequestError):
        replication.ReplReadRequest.decode(read.encode()[:-1])


def test_a_follower_fetch_says_whether_its_copy_is_damaged() -> None:
    damaged = replication.ReplFetchRequest(3, 10, 1024, 500, "ingest-1", damaged=True)
    assert replication.ReplFetchRequest.decode(damaged.encode()) == damaged
    intact = replication.ReplFetchRequest(3, 10, 1024, 500, "ingest-1")
    assert replication.ReplFetchRequest.decode(intact.encode()).damaged is False
    # A body without the flags byte (as sent before it existed) reads as intact.
    assert replication.ReplFetchRequest.decode(intact.encode()[:-1]) == intact
    with pytest.raises(protocol.BadRequestError):
        replication.ReplFetchRequest.decode(intact.encode() + b"\x00")


def test_frames_from_another_copy_are_checked_before_use() -> None:
    body = _frames(10, 3)
    frames = checked_frames(memoryview(body), 10, 20, source="b")
    assert [frame.offset for frame in frames] == [10, 11, 12]
    assert b"".join(bytes(frame.data) for frame in frames) == body
    flipped = bytearray(body)
    flipped[-1] ^= 0xFF
    with pytest.raises(protocol.BadRequestError, match="bad frame"):
        checked_frames(memoryview(bytes(flipped)), 10, 20, source="b")
    with pytest.raises(protocol.BadRequestError, match="outside"):
        checked_frames(memoryview(body), 11, 20, source="b")  # starts before the range
    with pytest.raises(protocol.BadRequestError, match="outside"):
        checked_frames(memoryview(body), 10, 12, source="b")  # runs past it
    with pytest.raises(protocol.BadRequestError, match="partial"):
        checked_frames(memoryview(body[:-2]), 10, 20, source="b")


def test_a_repair_takes_only_the_frames_of_the_damaged_range() -> None:
    damage = SegmentDamage("x.wal", 0, 5, 8, 100, "crc")
    assert check_frames(_frames(5, 3), damage, max_payload_bytes=1024) == 8
    assert check_frames(_frames(5, 2), damage, max_payload_bytes=1024) == 7  # a gap to 8
    for wrong in (_frames(4, 4), _frames(6, 2), _frames(5, 4), b"", _frames(5, 3)[:-1]):
        with pytest.raises(RepairRefusedError):
            check_frames(wrong, damage, max_payload_bytes=1024)
    bad = bytearray(encode_frame(5, b"abc"))
    bad[-1] ^= 1
    with pytest.raises(RepairRefusedError):
        check_frames(bytes(bad), damage, max_payload_bytes=1024)


def test_damaged_offsets_are_kept_until_repaired(tmp_path: Path) -> None:
    path = tmp_path / DAMAGED_FILE
    assert _load(path) == []
    _save(path, [1500, 2900])
    assert _load(path) == [1500, 2900]
    _save(path, [])
    assert not path.exists()
    path.write_text("not json")
    assert _load(path) == []  # unreadable: the next read of the damage finds it again

"""The pure rules behind "no traps" (issue 31, item 5): a WAL volume judged against the disk
reserve, the disk_full readiness reason, the /readyz body, and the per-client counts and
client addresses of the listeners."""

from __future__ import annotations

from pathlib import Path

import pytest

from danube.config import DanubeSettings
from danube.frame import FRAME_HEADER_BYTES
from danube.ingest.disk import DiskRoom, VolumeSpace, judge_volume, room_min_bytes
from danube.runtime.http import NotReady, readiness
from danube.runtime.peers import PerClient, address_of_grpc_peer, address_of_peername

pytestmark = pytest.mark.unit

MiB = 1024 * 1024
RESERVE = 64 * MiB
ROOM = 1 * MiB
SEGMENT = 512 * MiB


def _judge(total: int, free: int, *, segment: int = SEGMENT) -> tuple[str | None, list[str]]:
    verdict = judge_volume(
        VolumeSpace(total, free), reserve_bytes=RESERVE, room_min_bytes=ROOM, segment_bytes=segment
    )
    return verdict.error, list(verdict.warnings)


def test_a_volume_smaller_than_the_reserve_plus_room_is_an_error_with_the_numbers() -> None:
    error, warnings = _judge(30 * MiB, 30 * MiB)
    assert error is not None
    assert warnings == []
    assert "31457280 B (30.0 MiB) total" in error
    assert "ingest.disk_free_min_bytes=67108864 B (64.0 MiB)" in error
    assert "at least 68157440 B (65.0 MiB)" in error
    # One byte short of the reserve plus the room is still an error; at it, not.
    assert _judge(RESERVE + ROOM - 1, RESERVE + ROOM - 1)[0] is not None
    assert _judge(RESERVE + ROOM, RESERVE + ROOM, segment=ROOM)[0] is None


def test_free_space_below_the_reserve_at_start_is_a_warning() -> None:
    error, warnings = _judge(128 * MiB, 32 * MiB, segment=4 * MiB)
    assert error is None
    (warning,) = warnings
    assert "less free space than the reserve" in warning
    assert "33554432 B (32.0 MiB) free" in warning
    assert "134217728 B (128.0 MiB) total" in warning


def test_a_volume_without_room_for_one_segment_above_the_reserve_is_a_warning() -> None:
    error, warnings = _judge(500 * MiB, 500 * MiB)  # 64 MiB + 512 MiB do not fit
    assert error is None
    (warning,) = warnings
    assert "rotation.max_bytes=536870912 B (512.0 MiB)" in warning
    assert _judge(RESERVE + SEGMENT, RESERVE + SEGMENT) == (None, [])


def test_the_room_is_never_less_than_two_of_the_largest_messages() -> None:
    settings = DanubeSettings()
    assert room_min_bytes(settings) == max(MiB, 2 * settings.ingest.max_message_bytes)
    big = DanubeSettings.model_validate({"ingest": {"max_message_bytes": 4 * MiB}})
    assert room_min_bytes(big) == 8 * MiB


def test_disk_full_is_a_readiness_reason_while_no_append_fits_above_the_reserve() -> None:
    room = DiskRoom(Path("/wal"), RESERVE)
    assert room.not_ready() is None  # nothing read yet: no claim either way
    room.space = VolumeSpace(128 * MiB, RESERVE + FRAME_HEADER_BYTES)
    assert room.not_ready() is None  # the smallest frame still fits
    room.space = VolumeSpace(128 * MiB, RESERVE + FRAME_HEADER_BYTES - 1)
    reason = room.not_ready()
    assert reason is not None
    assert reason.body() == {
        "code": "disk_full",
        "message": reason.message,
        "wal_dir": "/wal",
        "free_bytes": RESERVE + FRAME_HEADER_BYTES - 1,
        "total_bytes": 128 * MiB,
        "free_min_bytes": RESERVE,
    }
    assert "67108879 B" in reason.message


def test_readyz_bodies() -> None:
    assert readiness(lambda: True) == (200, {"ready": True})
    assert readiness(lambda: []) == (200, {"ready": True})
    assert readiness(lambda: False) == (503, {"ready": False, "reasons": []})
    reason = NotReady("disk_full", "full", {"free_bytes": 1})
    assert readiness(lambda: [reason]) == (
        503,
        {"ready": False, "reasons": [{"code": "disk_full", "message": "full", "free_bytes": 1}]},
    )


def test_per_client_counts_each_address_apart() -> None:
    counts = PerClient(2)
    assert counts.acquire("127.0.0.1")
    assert counts.acquire("127.0.0.1")
    assert not counts.acquire("127.0.0.1")
    assert counts.held("127.0.0.1") == 2  # a refusal counts nothing
    assert counts.acquire("127.0.0.2")
    counts.release("127.0.0.1")
    assert counts.acquire("127.0.0.1")
    for _ in range(2):
        counts.release("127.0.0.1")
    counts.release("127.0.0.2")
    assert len(counts) == 0  # addresses with nothing open are forgotten
    with pytest.raises(ValueError, match="at least 1"):
        PerClient(0)


@pytest.mark.parametrize(
    ("peer", "address"),
    [
        ("ipv4:127.0.0.2:5000", "127.0.0.2"),
        ("ipv6:[::1]:5000", "::1"),
        ("ipv6:%5B::1%5D:5000", "::1"),
        ("unix:/tmp/socket", None),
        ("", None),
    ],
)
def test_grpc_peer_addresses(peer: str, address: str | None) -> None:
    assert address_of_grpc_peer(peer) == address


def test_socket_peer_addresses() -> None:
    assert address_of_peername(("127.0.0.2", 5000)) == "127.0.0.2"
    assert address_of_peername(("::1", 5000, 0, 0)) == "::1"
    assert address_of_peername("/tmp/socket") is None
    assert address_of_peername(None) is None

"""WAL options from config, the WAL error hierarchy, segment names and the checkpoint codec."""

from __future__ import annotations

import json

import pytest

from danube.config.wal_cloud import WalConfig
from danube.errors import DanubeError
from danube.ingest.wal import (
    AppendTooLargeError,
    BelowWalStartError,
    Checkpoint,
    Durability,
    PayloadTooLargeError,
    WalClosedError,
    WalCorruptionError,
    WalError,
    WalFailedError,
    WalIoError,
    WalOptions,
    WalTimeoutError,
    parse_segment_name,
    segment_name,
)
from danube.ingest.wal.checkpoint import decode_checkpoint, encode_checkpoint

pytestmark = pytest.mark.unit


def test_options_map_danube_wal_keys() -> None:
    config = WalConfig.model_validate(
        {
            "cache_capacity": 77,
            "file_sync": {"interval_ms": 250, "max_batch_bytes": 65536},
            "rotation": {"max_bytes": 1 << 20, "max_hours": 2},
        }
    )
    options = WalOptions.from_config(config, "interval", max_frame_payload_bytes=1000)
    assert options.durability is Durability.INTERVAL
    assert (options.sync_interval_ms, options.max_batch_bytes) == (250, 65536)
    assert (options.rotation_max_bytes, options.rotation_max_age_s) == (1 << 20, 7200.0)
    assert (options.cache_capacity, options.max_frame_payload_bytes) == (77, 1000)
    assert WalOptions.from_config(WalConfig(), Durability.FSYNC).rotation_max_age_s is None


@pytest.mark.parametrize(
    "changes",
    [
        {"max_batch_bytes": 0},
        {"sync_interval_ms": 0},
        {"rotation_max_bytes": 0},
        {"rotation_max_age_s": 0.0},
        {"cache_capacity": -1},
        {"max_frame_payload_bytes": 2**32},
        {"max_pending_bytes": 100, "max_frame_payload_bytes": 100},  # one frame must fit
        {"io_timeout_s": 0.0},
    ],
)
def test_bad_options_are_refused(changes: dict[str, object]) -> None:
    fields: dict[str, object] = {
        "durability": Durability.FSYNC,
        "max_batch_bytes": 4096,
        "sync_interval_ms": 10,
        "rotation_max_bytes": 4096,
        "rotation_max_age_s": None,
        "cache_capacity": 0,
    }
    with pytest.raises(WalError) as caught:
        WalOptions(**{**fields, **changes})  # type: ignore[arg-type]
    assert caught.value.code == "invalid_wal_options"


def test_an_unknown_durability_is_refused() -> None:
    with pytest.raises(WalError, match="durability"):
        WalOptions.from_config(WalConfig(), "sometimes")


def test_errors_carry_codes_fields_and_retriability() -> None:
    cases: list[tuple[WalError, str, bool]] = [
        (WalClosedError(), "wal_closed", True),
        (WalFailedError("fsync failed"), "wal_failed", True),
        (
            WalCorruptionError(segment="s.wal", offset=3, position=48, reason="crc"),
            "wal_corrupt",
            False,
        ),
        (BelowWalStartError(offset=1, start_offset=5), "below_wal_start", False),
        (PayloadTooLargeError(index=2, size_bytes=9, limit_bytes=8), "payload_too_large", False),
        (AppendTooLargeError(size_bytes=9, limit_bytes=8), "append_too_large", False),
        (WalIoError("read failed", op="read"), "wal_io", True),
        (WalTimeoutError(op="fsync", timeout_s=1.5), "timeout", True),
    ]
    for error, code, retriable in cases:
        assert isinstance(error, DanubeError)
        assert (error.code, error.retriable) == (code, retriable)
    corrupt = cases[2][0]
    assert isinstance(corrupt, WalCorruptionError)
    assert (corrupt.segment, corrupt.offset, corrupt.position) == ("s.wal", 3, 48)
    assert "s.wal" in str(corrupt)


def test_segment_names_carry_the_offset_and_sort_by_it() -> None:
    offsets = [0, 9, 10, 99, 12345, 2**64 - 1]
    names = [segment_name(offset) for offset in offsets]
    assert names[0] == "00000000000000000000.wal"
    assert sorted(names) == names
    assert [parse_segment_name(name) for name in names] == offsets
    for other in [
        "checkpoint.json",
        "1.wal",
        "0000000000000000000a.wal",
        "x.tmp",
        "99999999999999999999.wal",
    ]:
        assert parse_segment_name(other) is None


def test_checkpoint_round_trip_and_refusals() -> None:
    checkpoint = Checkpoint(start_offset=10, next_offset=42, updated_ms=1_700_000_000_000)
    data = encode_checkpoint(checkpoint)
    assert json.loads(data)["version"] == 1
    assert decode_checkpoint(data) == checkpoint
    bad = [
        b"not json",
        b"[]",
        b'{"version": 2, "start_offset": 0, "next_offset": 0, "updated_ms": 0}',
        b'{"version": 1, "start_offset": -1, "next_offset": 0, "updated_ms": 0}',
        b'{"version": 1, "start_offset": true, "next_offset": 0, "updated_ms": 0}',
        b'{"version": 1, "start_offset": 5, "next_offset": 4, "updated_ms": 0}',
        b'{"version": 1, "start_offset": 0, "updated_ms": 0}',
    ]
    for data in bad:
        with pytest.raises(WalCorruptionError) as caught:
            decode_checkpoint(data)
        assert caught.value.segment == "checkpoint.json"

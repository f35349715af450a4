"""The wal.stats segment listing on the wire: the request body and the checks on the reply."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from danube.wire.ingest import control, protocol
from danube.wire.ingest.client import WalListing
from danube.wire.ingest.control import SegmentInfo

pytestmark = pytest.mark.unit


def _reply(**changes: Any) -> dict[str, Any]:
    reply: dict[str, Any] = {
        "partition": "/ns/t",
        "node_id": "ingest-0",
        "epoch": 3,
        "reserved_end": 100_000,
        "fenced": False,
        "wal": {"start_offset": 0, "durable_next": 30, "disk_bytes": 900, "segments": 3},
        "segments": [
            SegmentInfo(0, 10, 300, True, 1000).as_dict(),
            SegmentInfo(10, 20, 300, True, 2000).as_dict(),
        ],
        "now_ms": 5000,
    }
    reply.update(changes)
    return reply


def test_stats_request_is_empty_or_a_segment_count() -> None:
    assert control.encode_stats_request() == b""
    assert control.decode_stats_request(b"") == 0
    assert control.decode_stats_request(control.encode_stats_request(17)) == 17
    for bad in (b"\x00\x00\x00\x00", (control.STATS_SEGMENTS_MAX + 1).to_bytes(4, "little"), b"x"):
        with pytest.raises(protocol.BadRequestError):
            control.decode_stats_request(bad)


def test_a_listing_decodes_with_its_segments() -> None:
    listing = WalListing.decode(orjson.dumps(_reply()))
    assert listing.segment_count == 3
    assert listing.disk_bytes == 900
    assert listing.now_ms == 5000
    assert listing.segments == [
        SegmentInfo(0, 10, 300, True, 1000),
        SegmentInfo(10, 20, 300, True, 2000),
    ]


@pytest.mark.parametrize(
    "changes",
    [
        {"segments": [{"first_offset": 0}]},  # a field missing
        {"segments": [{**SegmentInfo(0, 10, 1, True, 1).as_dict(), "sealed": 1}]},  # 1 is no bool
        {"segments": [{**SegmentInfo(0, 10, 1, True, 1).as_dict(), "size_bytes": -1}]},
        {
            "segments": [
                SegmentInfo(10, 20, 1, True, 1).as_dict(),
                SegmentInfo(0, 10, 1, True, 1).as_dict(),
            ]
        },
        {"wal": {"start_offset": 0, "durable_next": 0, "disk_bytes": 0, "segments": 1}},
        {"now_ms": 1.5},
    ],
)
def test_a_wrong_listing_is_refused(changes: dict[str, Any]) -> None:
    with pytest.raises(protocol.BadRequestError):
        WalListing.decode(orjson.dumps(_reply(**changes)))


def test_a_reply_that_is_not_json_is_refused() -> None:
    with pytest.raises(protocol.BadRequestError):
        WalListing.decode(b"\xff")

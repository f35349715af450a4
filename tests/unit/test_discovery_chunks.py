"""The front door's max_chunked_message_bytes check of a binary produce body: a chunk over
the limit is found among small and large records alike (whole-body or per-record search),
a payload that merely contains the attribute's name is not taken for a chunk."""

from __future__ import annotations

import pytest

from danube.admission.chunks import check_chunked_frames
from danube.client._chunking import chunk_attributes, new_uuid
from danube.client._records import encode_frame
from danube.discovery.errors import BadRequestError, TooLargeError
from danube.frame.produce import scan_frames_for_produce
from danube.wire.chunks import TOTAL_BYTES_ATTRIBUTE, TOTAL_BYTES_NEEDLE

pytestmark = pytest.mark.unit


def _frame(payload: bytes, attributes: dict[str, str] | None = None) -> bytes:
    return encode_frame(
        payload, None, attributes, producer=b"p", max_payload_bytes=1 << 20, sequenced=False
    )


@pytest.mark.parametrize("size", [10, 100_000])  # the whole body searched; each record's head
@pytest.mark.parametrize("at", [0, 5, 9])
def test_a_chunk_over_the_limit_is_found_wherever_it_is(size: int, at: int) -> None:
    frames = [_frame(b"x" * size, {"a": "1"}) for _ in range(10)]
    frames[at] = _frame(b"y" * size, chunk_attributes({}, new_uuid(), 0, 2, 5000))
    scanned = scan_frames_for_produce(b"".join(frames), max_count=100)
    check_chunked_frames(scanned, 5000)  # at the limit
    with pytest.raises(TooLargeError) as refused:
        check_chunked_frames(scanned, 4999)
    assert refused.value.code == "chunked_message_too_large"
    assert f"messages[{at}]" in refused.value.message


@pytest.mark.parametrize("size", [10, 100_000])
def test_the_name_in_a_payload_is_no_chunk_and_a_bad_total_is_refused(size: int) -> None:
    frames = [_frame(TOTAL_BYTES_NEEDLE + b"z" * size) for _ in range(3)]
    check_chunked_frames(scan_frames_for_produce(b"".join(frames), max_count=10), 1)
    bad = _frame(b"x" * size, {TOTAL_BYTES_ATTRIBUTE: "lots"})
    with pytest.raises(BadRequestError) as refused:
        check_chunked_frames(scan_frames_for_produce(bad, max_count=10), 1)
    assert refused.value.code == "invalid_chunk"

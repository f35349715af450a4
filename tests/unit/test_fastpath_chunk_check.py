"""The binary body's chunk check (check_chunked_frames: records decoded only when the body
holds the attribute's name, searched whole or record by record up to each payload) against
its slow twin, check_chunked over every record's decoded attributes: the same answer."""

from __future__ import annotations

import random
from collections.abc import Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from danube.admission.chunks import check_chunked, check_chunked_frames
from danube.errors import DanubeError
from danube.frame import decode_record_fields
from danube.frame.compression import CODEC_IDS, CODEC_NONE
from danube.frame.produce import encode_produce_frame, scan_frames_for_produce
from danube.wire.chunks import TOTAL_BYTES_ATTRIBUTE

pytestmark = pytest.mark.unit

LIMIT = 5000
_NAME = TOTAL_BYTES_ATTRIBUTE
# Small and large payloads (the search is per record past ~2.5 KiB a record), the name in them;
# a large one that compresses (its record is small: a compressed payload's size is not its
# stored size) beside one that does not.
_NOISE = random.Random(7).randbytes(3000)
_PAYLOADS = st.sampled_from(
    [b"", b"x" * 10, b"x" * 3000, b"x" * 3000, _NOISE, _NOISE, _NAME.encode() + b"y" * 1500]
)
_TOTALS = st.sampled_from([str(LIMIT), str(LIMIT + 1), "lots", "", "0", "9" * 11])
# Where the name may be besides its own attribute: another's name or value, or the key.
_DECOYS = st.sampled_from(["none", "value", "name prefix", "key"])


@st.composite
def _frame(draw: st.DrawFn) -> bytes:
    attributes = draw(st.dictionaries(st.sampled_from(["a", "b"]), st.just("1"), max_size=2))
    if draw(st.booleans()):
        attributes[_NAME] = draw(_TOTALS)
    key = None
    decoy = draw(_DECOYS)
    if decoy == "value":
        attributes["c"] = _NAME
    elif decoy == "name prefix":
        attributes[_NAME + "x"] = str(LIMIT + 1)
    elif decoy == "key":
        key = _NAME.encode()
    compression = draw(st.sampled_from([None, "zstd", "lz4"]))
    return encode_produce_frame(
        draw(_PAYLOADS),
        producer=b"p",
        publish_time_ms=0,
        key=key,
        attributes=[(k.encode(), v.encode()) for k, v in attributes.items()],
        codec=CODEC_IDS[compression] if compression else CODEC_NONE,
    )


def _answer(check: Callable[[], None]) -> tuple[str, str] | None:
    try:
        check()
    except DanubeError as exc:
        return exc.code, exc.message
    return None


@settings(max_examples=150, deadline=None)
@given(st.lists(_frame(), min_size=1, max_size=4))
def test_the_fast_check_answers_as_every_record_decoded(frames: list[bytes]) -> None:
    scanned = scan_frames_for_produce(b"".join(frames), max_count=len(frames))
    attributes = [decode_record_fields(scanned.record(i)).attributes for i in range(len(frames))]
    assert _answer(lambda: check_chunked_frames(scanned, LIMIT)) == _answer(
        lambda: check_chunked(attributes, LIMIT)
    )


def test_a_compressed_chunk_after_a_large_record_is_found() -> None:
    # What random bodies seldom hold: the record search alone (records over ~1 KiB on
    # average), the only chunk stored compressed, its message larger than its record.
    large = encode_produce_frame(_NOISE, producer=b"p", publish_time_ms=0)
    chunk = encode_produce_frame(
        b"x" * 3000,
        producer=b"p",
        publish_time_ms=0,
        attributes=[(_NAME.encode(), str(LIMIT + 1).encode())],
        codec=CODEC_IDS["zstd"],
    )
    assert len(chunk) < 3000
    scanned = scan_frames_for_produce(large + chunk, max_count=2)
    with pytest.raises(DanubeError) as refused:
        check_chunked_frames(scanned, LIMIT)
    assert refused.value.code == "chunked_message_too_large"

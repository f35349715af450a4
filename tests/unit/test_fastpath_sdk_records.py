"""The SDK producer's own record paths against danube.frame: its check of a message's fields
against encode_record's (a message the server would refuse fails alone, and only such a
one), and an idempotent producer's stamp and key_of against the encoder and the scan."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from danube.client._records import checked_fields, encode_checked
from danube.client._sequencing import is_sequenced, key_of, stamp
from danube.client.errors import InvalidMessageError
from danube.frame import (
    FRAME_HEADER_BYTES,
    MAX_ATTRIBUTE_NAME_BYTES,
    MAX_ATTRIBUTE_VALUE_BYTES,
    MAX_ATTRIBUTES,
    MAX_KEY_BYTES,
    SEQUENCED_HEADER_BYTES,
    InvalidRecordError,
    Record,
    decode_record_fields,
    encode_record,
)
from danube.frame.compression import CODEC_IDS, CODEC_NONE
from danube.frame.produce import encode_produce_frame, scan_frames_for_produce
from tests.fastpath import records

pytestmark = pytest.mark.unit

_PAYLOAD_BYTES_MAX = 1 << 20  # the payload's own limit is the topic's: not the twins' concern


def _text_at(limit: int) -> st.SearchStrategy[str]:
    """Text at ``limit`` UTF-8 bytes or one past it, in 1-, 2- and 4-byte letters."""
    return st.sampled_from(
        [
            text + extra
            for text in ("t" * limit, "\u00e9" * (limit // 2), "\U0001f600" * (limit // 4))
            for extra in ("", "t")
        ]
    )


# Text of every kind, a lone surrogate (no UTF-8 for it) and values of other types among it.
_TEXT = st.one_of(st.text(max_size=4), st.sampled_from(["\ud800", "a\udfff"]))
_ODD: st.SearchStrategy[Any] = st.sampled_from([5, b"k", None])
_KEYS = st.one_of(st.none(), _TEXT, _text_at(MAX_KEY_BYTES), _ODD)
_ATTRIBUTES = st.one_of(
    st.none(),
    st.dictionaries(
        st.one_of(_TEXT, _text_at(MAX_ATTRIBUTE_NAME_BYTES)),
        st.one_of(_TEXT, _text_at(MAX_ATTRIBUTE_VALUE_BYTES), _ODD),
        max_size=3,
    ),
    st.sampled_from([MAX_ATTRIBUTES, MAX_ATTRIBUTES + 1]).map(
        lambda count: {f"a{i}": "" for i in range(count)}
    ),
)


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=32), _KEYS, _ATTRIBUTES, st.sampled_from([None, "zstd", "lz4"]))
def test_the_sdk_refuses_what_the_encoder_refuses_and_sends_what_it_writes(
    payload: bytes, key: Any, attributes: Any, compression: Any
) -> None:
    record = Record(
        payload=payload,
        publish_time_ms=0,
        producer="p",
        key=key,
        attributes=attributes or {},
        compression=compression,
    )
    try:
        encode_record(record)
    except InvalidRecordError:
        with pytest.raises(InvalidMessageError):
            checked_fields(payload, key, attributes, max_payload_bytes=_PAYLOAD_BYTES_MAX)
        return
    fields = checked_fields(payload, key, attributes, max_payload_bytes=_PAYLOAD_BYTES_MAX)
    codec = CODEC_IDS[compression] if compression else CODEC_NONE
    frame = encode_checked(fields, producer=b"p", codec=codec)
    (sent,) = [scan_frames_for_produce(frame, max_count=1).record(0)]  # the server's check
    read = decode_record_fields(sent)
    assert (read.payload, read.key, read.attributes, read.producer) == (
        payload,
        key,
        dict(attributes or {}),
        "p",
    )


def _produced(record: Record, sequence: int | None, epoch: int) -> bytes:
    return encode_produce_frame(
        record.payload,
        producer=record.producer.encode(),
        publish_time_ms=record.publish_time_ms,
        key=None if record.key is None else record.key.encode(),
        attributes=[(k.encode(), v.encode()) for k, v in record.attributes.items()],
        sequence=sequence,
        producer_epoch=epoch,
        codec=CODEC_IDS[record.compression] if record.compression else CODEC_NONE,
    )


@settings(max_examples=150, deadline=None)
@given(records(schema=False), st.integers(0, 2**32 - 1), st.integers(0, 2**64 - 1))
def test_a_stamped_frame_is_the_frame_encoded_with_its_epoch_and_sequence(
    record: Record, epoch: int, sequence: int
) -> None:
    unstamped = _produced(record, 0, 0)
    head, rest = stamp(unstamped, epoch, sequence)
    assert head + bytes(rest) == _produced(record, sequence, epoch)
    assert is_sequenced(unstamped)
    assert not is_sequenced(_produced(record, None, 0))
    (scanned,) = [scan_frames_for_produce(unstamped, max_count=1).keys[0]]
    assert key_of(unstamped) == (None if scanned is None else scanned.encode())


@settings(max_examples=100, deadline=None)
@given(records(schema=False), st.integers(0, 64))
def test_is_sequenced_reads_the_record_version_of_any_prefix(record: Record, cut: int) -> None:
    # A frame shorter than a sequenced head is not one (stamp would write past it).
    frame = _produced(record, 0, 0)[:cut]
    assert is_sequenced(frame) == (len(frame) >= FRAME_HEADER_BYTES + SEQUENCED_HEADER_BYTES)

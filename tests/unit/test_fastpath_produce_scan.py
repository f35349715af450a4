"""The produce body's one-pass scan (danube.frame.produce) against its slow twin, the frame
codec and the record decoder: the same records, keys, sizes and runs, or the same error."""

from __future__ import annotations

import dataclasses
import re
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from danube.frame import (
    CorruptFrameError,
    CorruptRecordError,
    FrameError,
    Record,
    TruncatedFramesError,
    decode_frames,
    decode_record_fields,
    encode_record,
    scan_frames,
)
from danube.frame.compression import CODEC_IDS, decompress
from danube.frame.errors import DecompressedTooLargeError
from danube.frame.produce import frame_for_produce, scan_frames_for_produce
from danube.frame.record import MAX_DECOMPRESSED_PAYLOAD_BYTES, sequence_runs
from tests.fastpath import damaged, hand_records, records

pytestmark = pytest.mark.unit

_ANY_LENGTH = 2**32 - 1  # the scan has no frame limit of its own: the body's is the caller's
_RECORD_INDEX = re.compile(r"record (\d+): ")

Outcome = tuple[Any, ...]


def fast(body: bytes, max_count: int, stamped: bool, bound: int) -> Outcome:
    """What the scan makes of ``body``: its reading, or its error's code and where."""
    try:
        frames = scan_frames_for_produce(
            body, max_count=max_count, stamped=stamped, payload_bytes_max=bound
        )
    except (CorruptFrameError, TruncatedFramesError) as exc:
        return (exc.code, exc.position)
    except DecompressedTooLargeError as exc:
        return (exc.code, exc.size_bytes)
    except CorruptRecordError as exc:
        index = _RECORD_INDEX.match(exc.reason)  # a record's error names the record
        return (exc.code, exc.reason if index is None else int(index[1]))
    read = [
        (bytes(frames.record(i)), frames.keys[i], frames.payload_sizes[i], bytes(frames.payload(i)))
        for i in range(len(frames))
    ]
    assert b"".join(frames.frames(range(len(frames)))) == body[: frames.ends[-1]]
    return ("ok", read, frames.runs)


def slow(body: bytes, max_count: int, stamped: bool, bound: int) -> Outcome:
    """The same from the codec's parts: where the good frames end (scan_frames), the frames
    (decode_frames), each record decoded whole (decode_record_fields), checked in order."""
    if not body:
        return ("truncated_frames", 0)
    scan = scan_frames(body, max_payload_bytes=_ANY_LENGTH)
    frames, _ = decode_frames(body[: scan.good_end], max_payload_bytes=_ANY_LENGTH)
    read = []
    position = 0
    for index, frame in enumerate(frames[: max_count + 1]):  # the scan stops past max_count
        if frame.offset != 0:
            return ("corrupt_frame", position)
        try:
            fields = decode_record_fields(frame.payload, decompress=False)
            payload = fields.payload
            if fields.compression is not None:
                codec = CODEC_IDS[fields.compression]
                payload = decompress(codec, payload, size_bytes_max=bound)
        except DecompressedTooLargeError as exc:
            return (exc.code, exc.size_bytes)
        except CorruptRecordError:  # an unknown version too: a produced record is corrupt
            return ("corrupt_record", index)
        if not stamped and (fields.schema_id is not None or fields.schema_version is not None):
            return ("corrupt_record", index)
        read.append((bytes(frame.payload), fields.key, len(payload), payload))
        position += frame.size_bytes
    if len(frames) <= max_count and scan.tail_bytes:
        return ("corrupt_frame" if scan.error else "truncated_frames", scan.good_end)
    return ("ok", read, sequence_runs([r[0] for r in read]))


def _body(batch: list[Record]) -> bytes:
    return b"".join(frame_for_produce(encode_record(record)) for record in batch)


# Records as the encoder writes them, and written by hand (text past a limit or not UTF-8,
# too many or repeated attributes, a schema field without its flag).
_RECORDS = st.one_of(records().map(encode_record), hand_records())


@st.composite
def bodies(draw: st.DrawFn) -> bytes:
    batch = draw(st.lists(_RECORDS, max_size=4))
    return draw(damaged(b"".join(frame_for_produce(record) for record in batch)))


@settings(max_examples=200, deadline=None)
@given(
    bodies(),
    st.integers(0, 5),
    st.booleans(),
    st.sampled_from([MAX_DECOMPRESSED_PAYLOAD_BYTES, 64, 0]),
)
def test_the_scan_reads_what_the_codec_reads_and_refuses_what_it_refuses(
    body: bytes, max_count: int, stamped: bool, bound: int
) -> None:
    assert fast(body, max_count, stamped, bound) == slow(body, max_count, stamped, bound)


def test_the_slow_twin_tells_every_kind_apart() -> None:
    # The property above compares outcomes; these pin that each kind is one of them.
    good = _body([Record(payload=b"x" * 100, publish_time_ms=1, producer="p", compression="zstd")])
    assert fast(good, 1, False, 1000)[0] == slow(good, 1, False, 1000)[0] == "ok"
    empty = Record(payload=b"", publish_time_ms=0, producer="")
    for body, code in [
        (good[:-1], "truncated_frames"),
        (good[:-1] + b"\x00", "corrupt_frame"),
        (frame_for_produce(b"\x09" + encode_record(empty)[1:]), "corrupt_record"),  # a version
        (_body([dataclasses.replace(empty, schema_id=1)]), "corrupt_record"),  # not stamped
    ]:
        assert fast(body, 1, False, 1000)[0] == slow(body, 1, False, 1000)[0] == code
    assert fast(good, 1, False, 99) == slow(good, 1, False, 99) == ("payload_too_large", 100)
    with pytest.raises(FrameError):
        scan_frames_for_produce(b"", max_count=1)

"""ObjectScan, the one checked reader of objects: every frame from an offset through another,
for any chunk size; seeks with the sparse index and stops reading once done; a flipped byte,
an offset out of order or out of range, a short or overlong object each fail naming the
object, the byte position and the offset."""

from __future__ import annotations

import pytest

from danube.frame import FRAME_HEADER_BYTES, encode_frame
from danube.storage import (
    CorruptObjectError,
    IndexEntry,
    ObjectDescriptor,
    ObjectScan,
    SparseIndexBuilder,
    object_key,
)

pytestmark = pytest.mark.unit

PAYLOAD_BYTES = 100
FRAME_BYTES = FRAME_HEADER_BYTES + PAYLOAD_BYTES


def _object(first: int, last: int, *, every_bytes: int = 1000) -> tuple[bytes, ObjectDescriptor]:
    builder = SparseIndexBuilder(every_bytes)
    body = bytearray()
    for offset in range(first, last + 1):
        frame = encode_frame(offset, b"%010d" % offset + b"." * (PAYLOAD_BYTES - 10))
        builder.add(offset, len(body), len(frame))
        body += frame
    key = object_key("root", "ns", "t", first, last)
    return bytes(body), ObjectDescriptor.from_builder(key, builder, created_ms=1)


def _scan(
    body: bytes, scan: ObjectScan, chunk_bytes: int
) -> tuple[list[int], list[tuple[int, int]]]:
    """Run the scan protocol over ``body``; the offsets yielded and the ranges read."""
    offsets: list[int] = []
    ranges: list[tuple[int, int]] = []
    while True:
        for frame in scan.frames():
            assert bytes(frame.payload[:10]) == b"%010d" % frame.offset
            offsets.append(frame.offset)
        wanted = scan.next_range(chunk_bytes)
        if wanted is None:
            break
        start, length = wanted
        ranges.append(wanted)
        scan.feed(body[start : start + length])
    scan.finish()
    return offsets, ranges


@pytest.mark.parametrize("chunk_bytes", [1, 7, FRAME_BYTES, 1000, 1 << 20])
def test_every_frame_from_the_first_for_any_chunk_size(chunk_bytes: int) -> None:
    body, descriptor = _object(100, 299)
    offsets, ranges = _scan(body, ObjectScan(descriptor, 0), chunk_bytes)
    assert offsets == list(range(100, 300))
    assert ranges[0][0] == 0
    assert sum(length for _, length in ranges) == len(body)


@pytest.mark.parametrize(("start", "stop"), [(100, 100), (150, 151), (163, 250), (299, 299)])
@pytest.mark.parametrize("chunk_bytes", [13, 1000])
def test_a_range_seeks_with_the_index_and_stops_after_its_last_offset(
    start: int, stop: int, chunk_bytes: int
) -> None:
    body, descriptor = _object(100, 299)
    scan = ObjectScan(descriptor, start, to_offset=stop)
    offsets, ranges = _scan(body, scan, chunk_bytes)
    assert offsets == list(range(start, stop + 1))
    assert ranges[0][0] == descriptor.seek(start)
    assert ranges[0][0] > (start - 100) * FRAME_BYTES - 1000  # less than one index step early
    end_read = ranges[-1][0] + ranges[-1][1]
    # Never past the index entry after the last wanted frame: no wanted frame is beyond it.
    bound = next((p for o, p in descriptor.index if o > stop), len(body))
    assert end_read <= bound == scan.read_end
    if stop < 299:
        assert bound <= (stop - 100 + 1) * FRAME_BYTES + 1000
    assert scan.done


def test_an_empty_range_reads_nothing() -> None:
    body, descriptor = _object(0, 9)
    scan = ObjectScan(descriptor, 5, to_offset=4)
    assert _scan(body, scan, 100) == ([], [])


def test_stopping_early_loses_no_frame() -> None:
    body, descriptor = _object(0, 49)
    scan = ObjectScan(descriptor, 0)
    scan.feed(body)
    taken = []
    for frame in scan.frames():
        taken.append(frame.offset)
        if len(taken) == 10:
            break
    taken += [frame.offset for frame in scan.frames()]
    scan.finish()
    assert taken == list(range(50))


def test_a_flipped_byte_fails_at_its_frame_after_the_good_ones() -> None:
    body, descriptor = _object(0, 99)
    bad = bytearray(body)
    bad[40 * FRAME_BYTES + 16 + 5] ^= 0x01  # a payload byte of offset 40
    scan = ObjectScan(descriptor, 0)
    scan.feed(bytes(bad))
    offsets: list[int] = []
    with pytest.raises(CorruptObjectError) as failed:
        offsets.extend(frame.offset for frame in scan.frames())  # the good ones stay
    assert offsets == list(range(40))
    error = failed.value
    assert (error.key, error.position, error.offset) == (descriptor.key, 40 * FRAME_BYTES, 40)
    assert error.code == "object_corrupt"
    assert f"object {descriptor.key}: bad frame at byte {40 * FRAME_BYTES} (offset 40)" in str(
        error
    )
    assert "crc mismatch" in error.reason


def test_whole_frames_are_the_objects_bytes_with_the_same_checks() -> None:
    """The cloud reader's mode: the wanted frames whole, as they lie in the object (sent on
    unchanged), from the same seek and through the same checks as :meth:`frames`."""
    body, descriptor = _object(100, 299)
    scan = ObjectScan(descriptor, 163, to_offset=250)
    start = descriptor.seek(163)
    scan.feed(body[start : scan.read_end])
    frames = list(scan.whole_frames())
    scan.finish()
    assert [f.offset for f in frames] == list(range(163, 251))
    assert b"".join(bytes(f.data) for f in frames) == body[63 * FRAME_BYTES : 151 * FRAME_BYTES]
    bad = bytearray(body)
    bad[40 * FRAME_BYTES + 16 + 5] ^= 0x01  # a payload byte of offset 140
    scan = ObjectScan(descriptor, 100)
    scan.feed(bytes(bad))
    taken: list[int] = []
    with pytest.raises(CorruptObjectError) as failed:
        taken.extend(frame.offset for frame in scan.whole_frames())
    assert taken == list(range(100, 140))
    assert (failed.value.position, failed.value.offset) == (40 * FRAME_BYTES, 140)


def _raw(offsets: list[int]) -> bytes:
    return b"".join(encode_frame(o, b"%010d" % o + b"." * (PAYLOAD_BYTES - 10)) for o in offsets)


def _descriptor(first: int, last: int, size: int) -> ObjectDescriptor:
    return ObjectDescriptor(
        key=object_key("root", "ns", "t", first, last),
        first_offset=first,
        last_offset=last,
        size_bytes=size,
        message_count=last - first + 1,
        created_ms=1,
        index=(IndexEntry(first, 0),),
    )


@pytest.mark.parametrize(
    ("offsets", "extra", "bad_offset", "reason"),
    [
        ([0, 1, 2, 2, 4], b"", 2, "offset does not follow 2"),
        ([0, 1, 2, 3, 20], b"", 20, "offset outside 0..4"),
        ([0, 1, 2, 3], b"", 3, "the object ends early"),
        ([0, 1, 2, 3, 4], b"\x00" * 5, 4, "the object ends inside a frame"),
    ],
)
def test_objects_that_contradict_their_descriptor_are_corrupt(
    offsets: list[int], extra: bytes, bad_offset: int, reason: str
) -> None:
    body = _raw(offsets) + extra
    descriptor = _descriptor(0, 4, len(body))
    with pytest.raises(CorruptObjectError) as failed:
        _scan(body, ObjectScan(descriptor, 0), 64)
    assert failed.value.offset == bad_offset
    assert failed.value.reason == reason


def test_a_partial_range_ignores_what_follows_it() -> None:
    # The bad frame after the wanted range is never reached, so never reported.
    body = _raw([0, 1, 2, 3]) + b"\x00" * 16
    descriptor = _descriptor(0, 4, len(body))
    offsets, _ = _scan(body, ObjectScan(descriptor, 1, to_offset=2), FRAME_BYTES)
    assert offsets == [1, 2]

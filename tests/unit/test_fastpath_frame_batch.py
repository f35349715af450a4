"""The WAL's frames given their offsets in place (danube.frame.batch) against their slow twin,
the codec framing each record: the same bytes, whether the records came framed in a produce
body or were framed here; and the writer's segments byte for byte what the codec makes."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from danube.frame import (
    FRAME_HEADER_BYTES,
    FrameTooLargeError,
    Record,
    decode_frames,
    encode_frame,
    encode_record,
)
from danube.frame.batch import FrameBatch
from danube.frame.produce import frame_for_produce, scan_frames_for_produce
from danube.ingest.wal.checkpoint import CheckpointStore
from danube.ingest.wal.fileops import OsFileOps
from danube.ingest.wal.options import Durability, WalOptions
from danube.ingest.wal.segment import SegmentSet
from danube.ingest.wal.writer import SegmentWriter
from tests.fastpath import records

pytestmark = pytest.mark.unit

offsets = st.integers(min_value=0, max_value=2**40)


def twin(first: int, payloads: list[bytes]) -> bytes:
    """What the codec makes of the records at offsets ``first, first + 1, ...``."""
    return b"".join(encode_frame(first + i, p) for i, p in enumerate(payloads))


@settings(max_examples=200, deadline=None)
@given(st.lists(st.binary(max_size=300), min_size=1, max_size=20), offsets)
def test_framed_here_then_sealed_is_the_codecs_framing(payloads: list[bytes], first: int) -> None:
    batch = FrameBatch.of_records(payloads)
    assert [bytes(r) for r in batch] == payloads
    assert batch.nbytes == len(twin(0, payloads))
    batch.seal(first)
    assert bytes(batch.buf) == twin(first, payloads)
    assert b"".join(batch.runs()) == twin(first, payloads)
    assert len(batch.runs()) == 1  # framed end to end


@settings(max_examples=100, deadline=None)
@given(st.lists(records(), min_size=1, max_size=12), offsets)
def test_a_produce_bodys_frames_sealed_in_place_are_the_codecs_framing(
    drawn: list[Record], first: int
) -> None:
    encoded = [encode_record(r) for r in drawn]
    body = b"".join(frame_for_produce(r) for r in encoded)
    scanned = scan_frames_for_produce(body, max_count=len(encoded), stamped=True)
    batch = FrameBatch.of_frames(scanned.body, scanned.starts, scanned.ends)
    assert [bytes(r) for r in batch] == encoded
    batch.seal(first)
    assert bytes(batch.buf) == twin(first, encoded)
    # A writable body is sealed where it lies, not copied.
    writable = bytearray(body)
    in_place = FrameBatch.of_frames(writable, scanned.starts, scanned.ends)
    in_place.seal(first)
    assert in_place.buf is writable
    assert writable == twin(first, encoded)


def test_a_subset_seals_only_its_frames_and_runs_join_adjacent_ones() -> None:
    batch = FrameBatch.of_records([b"a", b"bb", b"ccc", b"dddd"])
    odd = FrameBatch(batch.buf, [batch.starts[1], batch.starts[3]], [batch.ends[1], batch.ends[3]])
    odd.seal(7)
    assert [bytes(v) for v in odd.runs()] == [encode_frame(7, b"bb"), encode_frame(8, b"dddd")]
    tail = FrameBatch(batch.buf, batch.starts[2:], batch.ends[2:])
    tail.seal(100)
    assert b"".join(tail.runs()) == twin(100, [b"ccc", b"dddd"])


def test_a_record_over_the_limit_is_refused_before_anything_is_written() -> None:
    batch = FrameBatch.of_records([b"x", b"y" * 11])
    before = bytes(batch.buf)
    with pytest.raises(FrameTooLargeError):
        batch.seal(5, max_payload_bytes=10)
    assert bytes(batch.buf) == before
    assert batch.largest_record() == (1, 11)
    assert batch.record_bytes() == 12


def test_the_writer_writes_the_bodys_frames_with_their_offsets(tmp_path: Path) -> None:
    """Two appends in one batch, the second after a gap: the segments hold the codec's
    frames, and what the writer hands on (the cache, the live stream) is those bytes."""
    ops = OsFileOps()
    options = WalOptions(
        durability=Durability.FSYNC,
        max_batch_bytes=1 << 20,
        sync_interval_ms=5,
        rotation_max_bytes=10_000,
        rotation_max_age_s=None,
        cache_capacity=0,
    )
    writer = SegmentWriter(
        ops, tmp_path, options, SegmentSet([]), CheckpointStore(ops, tmp_path), lambda: 0.0
    )
    one, two, three = (
        encode_record(Record(payload=p, publish_time_ms=1, producer="p"))
        for p in (b"one", b"two", b"three")
    )
    body = frame_for_produce(one) + frame_for_produce(two)
    scanned = scan_frames_for_produce(body, max_count=2)
    produced = FrameBatch.of_frames(scanned.body, scanned.starts, scanned.ends)
    result = writer.write_batch([(0, produced), (5, FrameBatch.of_records([three]))])
    written = b"".join(result.frames)
    expected = twin(0, [one, two]) + encode_frame(5, three)
    assert written == expected
    writer.close()  # the open segment is allocated ahead of its frames until then
    on_disk = b"".join(p.read_bytes() for p in sorted(tmp_path.glob("*.wal")))
    assert on_disk == expected
    frames = decode_frames(on_disk)[0]
    assert [f.offset for f in frames] == [0, 1, 5]
    assert len(on_disk) == 3 * FRAME_HEADER_BYTES + len(one + two + three)
    assert len(result.touched) == 2  # the gap sealed the first segment

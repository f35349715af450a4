"""Damaged data, decided without I/O: the WAL reader names where intact frames resume, the
cloud reader serves frames before a bad one and says where the object resumes, the tier
table (tiers.after_wal / after_cloud), the damage book (reported once, the poll's error)
and where an operator's skip goes."""

from __future__ import annotations

from pathlib import Path

import pytest

from danube.cloud_reader.reader import resume_after
from danube.dispatcher import tiers
from danube.dispatcher.damage import DamageBook, skip_target
from danube.frame import (
    FRAME_HEADER_BYTES,
    RawFrame,
    append_frame,
    encode_frame,
    verify_frame,
)
from danube.ingest.wal import WalCorruptionError
from danube.ingest.wal.fileops import OsFileOps
from danube.ingest.wal.reader import read_messages
from danube.ingest.wal.segment import Segment, segment_name
from danube.storage import ObjectDescriptor, SparseIndexBuilder, object_key
from danube.wire.cloud.client import CloudFetchReply
from danube.wire.dispatcher.errors import DataDamagedError
from danube.wire.dispatcher.protocol import BadRequestError
from danube.wire.ingest import protocol
from danube.wire.ingest.client import FetchReply
from danube.wire.ingest.protocol import Damaged

pytestmark = pytest.mark.unit

P = "/default/t"


class MemoryFiles(OsFileOps):
    """Read-only segment files held in a dict."""

    def __init__(self, files: dict[Path, bytes]) -> None:
        self.files = files

    def size(self, path: Path) -> int:
        return len(self.files[path])

    def read_at(self, path: Path, position: int, size: int) -> bytes:
        return self.files[path][position : position + size]


def segment_bytes(first: int, payloads: list[bytes]) -> bytes:
    buf = bytearray()
    for offset, payload in enumerate(payloads, start=first):
        append_frame(buf, offset, payload)
    return bytes(buf)


def read(
    files: MemoryFiles, segments: list[Segment], from_offset: int, *, limit: int
) -> tuple[list[tuple[int, bytes]], int]:
    plan = [(segment, segment.size_bytes) for segment in segments]
    frames, next_offset = read_messages(
        files,
        plan,
        from_offset,
        limit_offset=limit,
        max_bytes=1 << 30,
        max_count=10**6,
        max_payload_bytes=1 << 16,
    )
    return [(offset, bytes(verify_frame(frame))) for offset, frame in frames], next_offset


def _flip(data: bytes, position: int) -> bytes:
    return data[:position] + bytes([data[position] ^ 0xFF]) + data[position + 1 :]


def test_a_wal_read_at_a_bad_frame_names_the_next_segment_as_where_it_resumes() -> None:
    first = segment_bytes(0, [b"a" * 10] * 10)
    second = segment_bytes(10, [b"b" * 10] * 10)
    bad = _flip(first, 5 * (FRAME_HEADER_BYTES + 10) + FRAME_HEADER_BYTES + 1)  # offset 5
    files = MemoryFiles({Path(segment_name(0)): bad, Path(segment_name(10)): second})
    segments = [
        Segment(0, Path(segment_name(0)), len(bad)),
        Segment(10, Path(segment_name(10)), len(second)),
    ]
    messages, next_offset = read(files, segments, 0, limit=20)
    assert [o for o, _ in messages] == [0, 1, 2, 3, 4]
    assert next_offset == 5
    with pytest.raises(WalCorruptionError) as caught:
        read(files, segments, 5, limit=20)
    assert (caught.value.offset, caught.value.resume_offset) == (5, 10)
    # The WAL plans a read from the segment holding the offset on: the next one reads.
    assert [o for o, _ in read(files, segments[1:], 10, limit=20)[0]] == list(range(10, 20))


def test_a_damaged_reply_round_trips_with_its_file() -> None:
    body = protocol.encode_damaged_reply(7, 42, "00000000000000000010.wal")
    status, wal_start, next_offset, rest = protocol.decode_fetch_reply_head(body)
    assert (status, wal_start, next_offset) == (protocol.FetchStatus.DAMAGED, 7, 42)
    assert protocol.decode_damaged_file(rest) == "00000000000000000010.wal"


def _descriptor(entries: list[tuple[int, int]]) -> ObjectDescriptor:
    builder = SparseIndexBuilder(every_bytes=100)
    for offset in range(0, 10):
        builder.add(offset, offset * 50, 50)
    key = object_key("r", "default", "t", 0, 9)
    descriptor = ObjectDescriptor.from_builder(key, builder, created_ms=0)
    assert [(e.offset, e.position) for e in descriptor.index] == entries
    return descriptor


def test_an_object_resumes_at_its_next_index_entry_after_a_bad_frame() -> None:
    descriptor = _descriptor([(0, 0), (2, 100), (4, 200), (6, 300), (8, 400)])
    assert resume_after(descriptor, 150) == 4  # bad frame 3 at byte 150: next mark
    assert resume_after(descriptor, 400) == 10  # in the last step: past the object


def _frame(offset: int) -> RawFrame:
    return RawFrame(offset, memoryview(encode_frame(offset, b"x")))


def _fed(step: object) -> list[tuple[int, bytes]]:
    """The ``(offset, record)`` a Feed hands to the machine, each frame checked here."""
    assert isinstance(step, tiers.Feed)
    return [(offset, bytes(verify_frame(frame.data))) for offset, frame in step.messages]


def test_the_tier_table() -> None:
    ok = FetchReply(False, 0, 12, [_frame(10), _frame(11)])
    fed = tiers.after_wal(10, ok)
    assert isinstance(fed, tiers.Feed)
    assert _fed(fed) == [(10, b"x"), (11, b"x")]
    assert fed == tiers.Feed(fed.messages, 10, 12, "wal")
    wal_bad: FetchReply[RawFrame] = FetchReply(False, 0, 10, [], Damaged(10, 50, "seg.wal"))
    ask = tiers.after_wal(10, wal_bad)
    assert ask == tiers.AskCloud(10, 0, Damaged(10, 50, "seg.wal"))
    assert isinstance(ask, tiers.AskCloud)
    # The object has it: read from the cloud tier.
    cloud_ok = CloudFetchReply(True, 11, [_frame(10)])
    from_cloud = tiers.after_cloud(P, ask, cloud_ok)
    assert isinstance(from_cloud, tiers.Feed)
    assert _fed(from_cloud) == [(10, b"x")]
    assert from_cloud == tiers.Feed(from_cloud.messages, 10, 11, "cloud")
    # Not uploaded, or damaged too: blocked, naming both files, up to the nearer resume.
    blocked = tiers.after_cloud(P, ask, CloudFetchReply(False, 10, []))
    assert blocked == tiers.Blocked(tiers.Damage(P, 10, 50, ("seg.wal",)))
    both = CloudFetchReply(True, 10, [], Damaged(10, 30, "obj.dnb"))
    assert tiers.after_cloud(P, ask, both) == tiers.Blocked(
        tiers.Damage(P, 10, 30, ("seg.wal", "obj.dnb"))
    )
    # Below the WAL's start: a damaged object blocks only up to the WAL's start.
    below = tiers.after_wal(10, FetchReply(True, 20, 10, []))
    assert below == tiers.AskCloud(10, 20, None)
    assert isinstance(below, tiers.AskCloud)
    assert tiers.after_cloud(P, below, CloudFetchReply(True, 10, [], Damaged(10, 90, "o"))) == (
        tiers.Blocked(tiers.Damage(P, 10, 20, ("o",)))
    )
    gone = tiers.after_cloud(P, below, CloudFetchReply(False, 10, []))
    assert gone == tiers.Feed([], 10, 20, "cloud", gone=True)


def test_the_damage_book_reports_once_and_answers_polls() -> None:
    book = DamageBook()
    assert book.error() is None
    damage = tiers.Damage(P, 10, 30, ("seg.wal", "obj.dnb"))
    assert book.report(damage) is True
    assert book.report(damage) is False  # the same range again: no second log line
    error = book.error()
    assert isinstance(error, DataDamagedError)
    assert error.code == "data_damaged"
    assert (error.partition, error.from_offset, error.to_offset) == (P, 10, 30)
    assert "offsets 10..29" in error.message
    assert "obj.dnb" in error.message
    assert book.clear(P) == damage
    assert book.error() is None


def test_a_skip_goes_past_the_damage_or_to_an_offset_and_only_forward() -> None:
    damage = tiers.Damage(P, 10, 30, ("seg.wal",))
    assert skip_target(P, 10, None, damage) == 30
    assert skip_target(P, 10, 25, damage) == 25
    with pytest.raises(BadRequestError) as nothing:
        skip_target(P, 10, None, None)
    assert nothing.value.code == "nothing_to_skip"
    with pytest.raises(BadRequestError) as back:
        skip_target(P, 10, 5, damage)
    assert back.value.code == "skip_backwards"

"""Segment scans and segment reads over bytes in memory: indexes, gaps, and that no single-byte
flip or cut anywhere ever yields a wrong message."""

from __future__ import annotations

from pathlib import Path

import pytest

from danube.frame import FRAME_HEADER_BYTES, append_frame, verify_frame
from danube.ingest.wal import WalCorruptionError
from danube.ingest.wal.fileops import OsFileOps
from danube.ingest.wal.reader import read_messages
from danube.ingest.wal.segment import INDEX_EVERY_BYTES, Segment, scan_segment, segment_name

pytestmark = pytest.mark.unit

LIMIT = 64 * 1024


class MemoryFiles(OsFileOps):
    """Read-only files held in a dict: what scans and reads need, without a disk."""

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


def on_disk(first: int, data: bytes) -> tuple[MemoryFiles, Segment]:
    path = Path(segment_name(first))
    return MemoryFiles({path: data}), Segment(first, path, len(data))


def read(
    files: MemoryFiles, segments: list[Segment], from_offset: int, **limits: int
) -> tuple[list[tuple[int, bytes]], int]:
    plan = [(segment, segment.size_bytes) for segment in segments]
    frames, next_offset = read_messages(
        files,
        plan,
        from_offset,
        limit_offset=limits["limit"],
        max_bytes=limits.get("max_bytes", 1 << 30),
        max_count=limits.get("max_count", 10**6),
        max_payload_bytes=LIMIT,
    )
    # The reader hands out whole frames as the segment holds them: check and open them here.
    messages = []
    for offset, frame in frames:
        assert int.from_bytes(frame[:8], "little") == offset
        messages.append((offset, bytes(verify_frame(frame))))
    return messages, next_offset


def read_or_error(
    files: MemoryFiles, segment: Segment, from_offset: int, *, limit: int
) -> tuple[list[tuple[int, bytes]], WalCorruptionError | None]:
    """The messages read, or the corruption error the read raised."""
    try:
        return read(files, [segment], from_offset, limit=limit)[0], None
    except WalCorruptionError as exc:
        return [], exc


def test_scan_builds_a_sparse_index_and_finds_the_end() -> None:
    payloads = [bytes([n % 256]) * 1000 for n in range(300)]  # ~300 KB: several marks
    files, segment = on_disk(50, segment_bytes(50, payloads))
    scan = scan_segment(files, segment.path, 50, max_payload_bytes=LIMIT)
    assert (scan.problem, scan.frame_count, scan.next_offset) == (None, 300, 350)
    assert scan.good_end == scan.file_bytes == 300 * (FRAME_HEADER_BYTES + 1000)
    assert scan.index[0] == (50, 0)
    gaps = [b[1] - a[1] for a, b in zip(scan.index, scan.index[1:], strict=False)]
    assert all(INDEX_EVERY_BYTES <= gap < INDEX_EVERY_BYTES + 1016 for gap in gaps)
    # Reads seek through the index and return the exact messages.
    messages, next_offset = read(files, [segment], 290, limit=350, max_count=5)
    assert messages == [(o, payloads[o - 50]) for o in range(290, 295)]
    assert next_offset == 295


def test_reads_skip_gaps_between_segments_and_stop_at_the_limit() -> None:
    first = segment_bytes(0, [b"a", b"b"])
    second = segment_bytes(10, [b"k", b"l", b"m"])
    files = MemoryFiles({Path(segment_name(0)): first, Path(segment_name(10)): second})
    segments = [
        Segment(0, Path(segment_name(0)), len(first)),
        Segment(10, Path(segment_name(10)), len(second)),
    ]
    assert read(files, segments, 0, limit=13) == (
        [(0, b"a"), (1, b"b"), (10, b"k"), (11, b"l"), (12, b"m")],
        13,
    )
    assert read(files, segments, 2, limit=13) == ([(10, b"k"), (11, b"l"), (12, b"m")], 13)
    assert read(files, segments, 1, limit=11) == ([(1, b"b"), (10, b"k")], 11)
    assert read(files, segments, 0, limit=13, max_bytes=2) == ([(0, b"a"), (1, b"b")], 2)


def test_a_frame_larger_than_one_read_is_read_whole() -> None:
    big = b"z" * (5 * 1024 * 1024)  # over MAX_READ_BYTES
    data = segment_bytes(0, [b"a", big, b"c"])
    files = MemoryFiles({Path(segment_name(0)): data})
    segment = Segment(0, Path(segment_name(0)), len(data))
    messages, next_offset = read_messages(
        files,
        [(segment, len(data))],
        1,
        limit_offset=3,
        max_bytes=10,
        max_count=10,
        max_payload_bytes=len(big),
    )
    assert [(o, bytes(verify_frame(f))) for o, f in messages] == [(1, big)]
    assert next_offset == 2


def test_no_flip_of_any_byte_yields_a_wrong_message() -> None:
    payloads = [b"alpha", b"", b"gamma-gamma", b"d" * 40]
    data = segment_bytes(7, payloads)
    truth = dict(enumerate(payloads, start=7))
    for position in range(len(data)):
        for mask in (0x01, 0x80):
            flipped = bytearray(data)
            flipped[position] ^= mask
            files, segment = on_disk(7, bytes(flipped))
            messages, error = read_or_error(files, segment, 7, limit=11)
            if error is not None:
                assert error.segment == segment.name
                assert error.offset in truth
            else:
                assert all(truth[offset] == payload for offset, payload in messages)
                assert len(messages) < len(payloads)  # the flip was noticed: the read stopped


def test_every_cut_of_a_segment_serves_exactly_the_whole_frames() -> None:
    payloads = [b"one", b"two-two", b"", b"four"]
    data = segment_bytes(0, payloads)
    ends = [0]
    for payload in payloads:
        ends.append(ends[-1] + FRAME_HEADER_BYTES + len(payload))
    for cut in range(len(data) + 1):
        files, segment = on_disk(0, data[:cut])
        scan = scan_segment(files, segment.path, 0, max_payload_bytes=LIMIT)
        whole = max(n for n, end in enumerate(ends) if end <= cut)
        assert (scan.good_end, scan.frame_count) == (ends[whole], whole)
        assert scan.torn == (cut != ends[whole])
        # The WAL reads below its durable offset only: here, the whole frames.
        if whole:
            assert read(files, [segment], 0, limit=whole)[0] == list(enumerate(payloads))[:whole]
        # Reading the torn frame itself (as if it were durable) raises, never serves it.
        if scan.torn:
            assert read_or_error(files, segment, whole, limit=whole + 1)[1] is not None


def test_a_lazily_scanned_segment_remembers_its_corruption() -> None:
    data = bytearray(segment_bytes(0, [b"a", b"b", b"c", b"d"]))
    data[2 * (FRAME_HEADER_BYTES + 1) + FRAME_HEADER_BYTES] ^= 0xFF  # the payload of offset 2
    files, segment = on_disk(0, bytes(data))
    assert read(files, [segment], 0, limit=4) == ([(0, b"a"), (1, b"b")], 2)
    assert segment.indexed
    assert segment.corruption is not None
    for start in (2, 3):
        with pytest.raises(WalCorruptionError) as caught:
            read(files, [segment], start, limit=4)
        assert (caught.value.offset, caught.value.position) == (2, 2 * (FRAME_HEADER_BYTES + 1))

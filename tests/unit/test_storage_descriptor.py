"""Sparse index building and seeking, and object descriptors: round trips (with and without
publish times) and rejected forms."""

from __future__ import annotations

import itertools
from dataclasses import replace

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from danube.frame import FRAME_HEADER_BYTES, append_frame, decode_frames
from danube.storage import (
    DESCRIPTOR_VERSION,
    MAX_INDEX_ENTRIES,
    CorruptDescriptorError,
    IndexEntry,
    InvalidDescriptorError,
    ObjectDescriptor,
    SparseIndexBuilder,
    StorageError,
    UnsupportedDescriptorVersionError,
    object_key,
    seek,
)

pytestmark = pytest.mark.unit

payload_sizes = st.lists(st.integers(min_value=0, max_value=300), min_size=1, max_size=200)


def build_object(
    first_offset: int, sizes: list[int], every_bytes: int, max_entries: int = MAX_INDEX_ENTRIES
) -> tuple[bytes, SparseIndexBuilder]:
    """Frames of the given payload sizes laid end to end, fed to a builder as an uploader does."""
    buf = bytearray()
    builder = SparseIndexBuilder(every_bytes, max_entries=max_entries)
    for i, size in enumerate(sizes):
        position = len(buf)
        frame_size = append_frame(buf, first_offset + i, bytes([i % 251]) * size)
        builder.add(first_offset + i, position, frame_size)
    return bytes(buf), builder


def make_descriptor(**changes: object) -> ObjectDescriptor:
    fields: dict[str, object] = {
        "key": object_key("/danube-data", "ns", "t", 100, 199),
        "first_offset": 100,
        "last_offset": 199,
        "size_bytes": 100 * 64,
        "message_count": 100,
        "created_ms": 1_700_000_000_000,
        "index": [(100, 0), (150, 50 * 64), (190, 90 * 64)],
    }
    fields.update(changes)
    return ObjectDescriptor(**fields)  # type: ignore[arg-type]


# --- sparse index ------------------------------------------------------------------------


def test_builder_marks_first_frame_then_every_n_bytes() -> None:
    builder = SparseIndexBuilder(every_bytes=100)
    # 40-byte frames at 0, 40, 80, ...: marks where >= 100 bytes passed since the last mark.
    for i in range(10):
        builder.add(7 + i, i * 40, 40)
    assert builder.entries == ((7, 0), (10, 120), (13, 240), (16, 360))
    assert (builder.first_offset, builder.last_offset) == (7, 16)
    assert builder.message_count == 10
    assert builder.size_bytes == 400


def test_builder_refuses_out_of_order_or_gapped_frames() -> None:
    builder = SparseIndexBuilder(every_bytes=100)
    builder.add(5, 0, 20)
    with pytest.raises(InvalidDescriptorError, match="does not follow"):
        builder.add(5, 20, 20)
    with pytest.raises(InvalidDescriptorError, match="does not start where"):
        builder.add(6, 21, 20)
    with pytest.raises(InvalidDescriptorError, match="smaller than a frame header"):
        builder.add(6, 20, FRAME_HEADER_BYTES - 1)
    assert builder.message_count == 1  # the refused frames left no trace


def test_builder_thins_at_the_entry_cap() -> None:
    builder = SparseIndexBuilder(every_bytes=16, max_entries=4)
    for i in range(40):
        builder.add(i, i * 16, 16)
    entries = builder.entries
    assert len(entries) <= 4
    assert entries[0] == (0, 0)
    assert builder.every_bytes > 16
    positions = [entry.position for entry in entries]
    assert all(b - a >= 16 for a, b in itertools.pairwise(positions))


@given(
    sizes=payload_sizes,
    first=st.integers(min_value=0, max_value=2**40),
    every=st.integers(min_value=1, max_value=2000),
    cap=st.integers(min_value=2, max_value=8),
    data=st.data(),
)
def test_seek_then_scan_finds_every_offset(
    sizes: list[int], first: int, every: int, cap: int, data: st.DataObject
) -> None:
    obj, builder = build_object(first, sizes, every, cap)
    index = builder.entries
    target = data.draw(st.integers(min_value=first, max_value=first + len(sizes) - 1))
    position = seek(index, target)
    frames, end = decode_frames(obj, position)
    assert end == len(obj)
    # The scan starts at a frame boundary at or before the target ...
    assert frames[0].offset <= target
    assert any(frame.offset == target for frame in frames)
    # ... and at the last mark that qualifies: the next mark is already past the target.
    later = [entry for entry in index if entry.position > position]
    assert not later or later[0].offset > target


@given(
    offsets=st.lists(
        st.integers(min_value=0, max_value=10**6), min_size=1, max_size=50, unique=True
    ),
    probe=st.integers(min_value=-10, max_value=10**6 + 10),
)
def test_seek_is_the_last_entry_at_or_before(offsets: list[int], probe: int) -> None:
    index = [IndexEntry(offset, 1000 + offset * 3) for offset in sorted(offsets)]
    at_or_before = [entry for entry in index if entry.offset <= probe]
    expected = at_or_before[-1].position if at_or_before else index[0].position
    assert seek(index, probe) == expected


def test_seek_on_an_empty_index_starts_at_zero() -> None:
    assert seek([], 42) == 0


# --- descriptors ---------------------------------------------------------------------------


@given(
    sizes=payload_sizes,
    first=st.integers(min_value=0, max_value=2**63),
    every=st.integers(min_value=16, max_value=4096),
)
def test_descriptor_round_trips_through_bytes(sizes: list[int], first: int, every: int) -> None:
    obj, builder = build_object(first, sizes, every)
    key = object_key("/danube-data", "ns", "t", first, first + len(sizes) - 1)
    descriptor = ObjectDescriptor.from_builder(key, builder, created_ms=1_700_000_000_123)
    assert descriptor.size_bytes == len(obj)
    assert descriptor.message_count == len(sizes)
    loaded = ObjectDescriptor.from_bytes(descriptor.to_bytes())
    assert loaded == descriptor
    assert loaded.index == builder.entries
    assert loaded.version == DESCRIPTOR_VERSION


def test_stored_form_is_compact_delta_json() -> None:
    descriptor = make_descriptor()
    stored = orjson.loads(descriptor.to_bytes())
    assert stored == {
        "v": 1,
        "k": "danube-data/topics/ns/t/00000000000000000100-00000000000000000199.dnb",
        "f": 100,
        "l": 199,
        "s": 6400,
        "n": 100,
        "c": True,
        "t": 1_700_000_000_000,
        "x": [0, 0, 50, 3200, 40, 2560],
    }
    assert descriptor.seek(160) == 3200
    assert descriptor.seek(100) == 0


def test_a_full_index_fits_the_stored_limit() -> None:
    sizes = [0] * (MAX_INDEX_ENTRIES * 5)
    first = 10**15
    _, builder = build_object(first, sizes, every_bytes=16 * 5)
    key = object_key("r", "ns", "t", first, first + len(sizes) - 1)
    descriptor = ObjectDescriptor.from_builder(key, builder, created_ms=1)
    assert len(descriptor.index) == MAX_INDEX_ENTRIES
    assert len(descriptor.to_bytes()) < 400_000


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"first_offset": 200, "last_offset": 199}, "last_offset"),
        ({"key": object_key("r", "ns", "t", 100, 198)}, "key"),
        ({"key": "not/an/object/key"}, "key"),
        ({"message_count": 99}, "message_count"),
        ({"message_count": 101, "contiguous": False}, "message_count"),
        ({"message_count": 0, "contiguous": False}, "message_count"),
        ({"size_bytes": 100 * FRAME_HEADER_BYTES - 1}, "size_bytes"),
        ({"created_ms": -1}, "created_ms"),
        ({"index": []}, "index"),
        ({"index": [(101, 0)]}, "index"),
        ({"index": [(100, 5)]}, "index"),
        ({"index": [(100, 0), (150, 3200), (140, 3300)]}, "index"),
        ({"index": [(100, 0), (150, 3200), (160, 3100)]}, "index"),
        ({"index": [(100, 0), (200, 6000)]}, "index"),
        ({"index": [(100, 0), (199, 6400)]}, "index"),
        ({"index": [(100, 0), (150, 10)]}, "index"),
        ({"first_offset": True}, "first_offset"),
        ({"version": 2}, "version"),
    ],
)
def test_inconsistent_descriptors_are_refused(changes: dict[str, object], field: str) -> None:
    with pytest.raises(InvalidDescriptorError) as info:
        make_descriptor(**changes)
    assert info.value.field == field
    assert info.value.code == "invalid_descriptor"
    assert isinstance(info.value, StorageError)
    assert not info.value.retriable


def test_gapped_offsets_are_allowed_when_not_contiguous() -> None:
    descriptor = make_descriptor(message_count=60, contiguous=False)
    assert ObjectDescriptor.from_bytes(descriptor.to_bytes()) == descriptor


def _stored(**changes: object) -> bytes:
    stored = orjson.loads(make_descriptor().to_bytes())
    stored.update(changes)
    return orjson.dumps(stored)


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"not json",
        b"[1, 2]",
        _stored(f=200),
        _stored(n=99),
        _stored(x=[0, 0, 50]),
        _stored(x=[0, 0, -10, 3200]),
        _stored(x=[0, 0, 50, "3200"]),
        _stored(x=[1, 0]),
        _stored(s=True),
        _stored(f=100.0),
        _stored(k=7),
        _stored(extra=1),
        orjson.dumps({k: v for k, v in orjson.loads(_stored()).items() if k != "t"}),
        _stored(p=[5]),
        _stored(p=[9, 5]),
        _stored(p=[1, "2"]),
        _stored(p=[1, True]),
        _stored(p=None),
        b"{" + b" " * (2 * 1024 * 1024) + b"}",
    ],
)
def test_corrupt_stored_descriptors_are_refused(data: bytes) -> None:
    with pytest.raises(CorruptDescriptorError) as info:
        ObjectDescriptor.from_bytes(data)
    assert info.value.code == "corrupt_descriptor"


def test_publish_times_are_optional_and_round_trip() -> None:
    old = ObjectDescriptor.from_bytes(make_descriptor().to_bytes())  # written before "p"
    assert (old.publish_ms_min, old.publish_ms_max) == (None, None)
    assert old.may_hold_time(2**63)  # unknown times: any time may be in it
    timed = make_descriptor(publish_ms_min=1_000, publish_ms_max=2_000)
    assert orjson.loads(timed.to_bytes())["p"] == [1_000, 2_000]
    assert ObjectDescriptor.from_bytes(timed.to_bytes()) == timed
    assert [timed.may_hold_time(t) for t in (0, 1_500, 2_000, 2_001)] == [True, True, True, False]
    _, builder = build_object(100, [10] * 100, 3200)
    built = ObjectDescriptor.from_builder(
        make_descriptor().key, builder, created_ms=1, publish_ms=(7, 9)
    )
    assert (built.publish_ms_min, built.publish_ms_max) == (7, 9)
    for bad in ({"publish_ms_min": 1}, {"publish_ms_min": 3, "publish_ms_max": 2}):
        with pytest.raises(InvalidDescriptorError) as info:
            make_descriptor(**bad)
        assert info.value.field == "publish_ms"


def test_unknown_version_is_its_own_error() -> None:
    with pytest.raises(UnsupportedDescriptorVersionError) as info:
        ObjectDescriptor.from_bytes(_stored(v=2))
    assert info.value.version == 2
    assert info.value.code == "unsupported_descriptor_version"


def test_from_builder_needs_a_frame() -> None:
    with pytest.raises(InvalidDescriptorError, match="at least one frame"):
        ObjectDescriptor.from_builder("k", SparseIndexBuilder(), created_ms=0)


def test_descriptor_is_immutable() -> None:
    descriptor = make_descriptor()
    with pytest.raises(AttributeError):
        descriptor.size_bytes = 1  # type: ignore[misc]
    assert replace(descriptor, created_ms=5).created_ms == 5

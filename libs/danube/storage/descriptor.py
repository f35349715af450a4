"""Object descriptors: what etcd knows about one uploaded object, and their stored form.

A descriptor exists only once its object is written whole, so a reader that finds one can read
the object. It carries the object's key, its inclusive offset range, its size, its message count,
its creation time and its sparse index (see :mod:`danube.storage.index`).

Stored form (etcd value): one compact JSON object, UTF-8, made by orjson::

    {"v": 1,              format version
     "k": "<key>",        object key, as naming.object_key makes it
     "f": 100, "l": 199,  first and last offset, inclusive
     "s": 40960,          size in bytes
     "n": 100,            message count
     "c": true,           offsets contiguous: n == l - f + 1
     "t": 1700000000000,  created, ms since the epoch
     "x": [0, 0, 52, 65600, ...],
                          sparse index, flattened, delta-coded: each entry is (offset delta,
                          position delta) from the previous entry, the first from (f, 0)
     "p": [1699999990000, 1699999999000]}
                          optional: the lowest and highest publish_time_ms of the object's
                          records (its first and last when producers' clocks agree); absent
                          in descriptors written before it existed, or when unknown

Deltas keep a full index (16384 entries) well under a megabyte. Every descriptor is checked when
built and again when loaded: a contradiction (first after last, an index out of order or outside
the object, a count that does not fit the range) raises an error instead of misleading a reader.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, TypeVar

import orjson

from danube.frame import FRAME_HEADER_BYTES
from danube.storage.errors import (
    CorruptDescriptorError,
    InvalidDescriptorError,
    InvalidObjectKeyError,
    UnsupportedDescriptorVersionError,
)
from danube.storage.index import MAX_INDEX_ENTRIES, IndexEntry, SparseIndexBuilder, seek
from danube.storage.naming import MAX_OFFSET, parse_object_key

DESCRIPTOR_VERSION = 1
MAX_DESCRIPTOR_BYTES = 1024 * 1024
"""Refuse to store or parse more than this: etcd's default request limit is 1.5 MiB."""

_MAX_MS = 2**63 - 1
_FIELDS = frozenset("vkflsnctx")
_OPTIONAL_FIELDS = frozenset("p")
_T = TypeVar("_T")


@dataclass(frozen=True, slots=True)
class ObjectDescriptor:
    """One uploaded object: key, inclusive offset range, size, count, time and sparse index.

    Construction validates every field against the others (see the module docstring) and
    raises :class:`InvalidDescriptorError`; ``index`` may be given as any iterable of pairs and
    is kept as a tuple of :class:`IndexEntry`. ``publish_ms_min`` / ``publish_ms_max`` (both
    or neither) bound the records' ``publish_time_ms``: a search by time skips an object whose
    max is below the time, and scans one without them.
    """

    key: str
    first_offset: int
    last_offset: int
    size_bytes: int
    message_count: int
    created_ms: int
    index: tuple[IndexEntry, ...]
    contiguous: bool = True
    version: int = DESCRIPTOR_VERSION
    publish_ms_min: int | None = None
    publish_ms_max: int | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "index", _as_index(self.index))
        _validate(self)

    @classmethod
    def from_builder(
        cls,
        key: str,
        builder: SparseIndexBuilder,
        *,
        created_ms: int,
        contiguous: bool = True,
        publish_ms: tuple[int, int] | None = None,
    ) -> ObjectDescriptor:
        """The descriptor of an object whose every frame went through ``builder``;
        ``publish_ms``: the lowest and highest publish time of its records, if known."""
        if builder.first_offset is None or builder.last_offset is None:
            raise InvalidDescriptorError("message_count", "an object holds at least one frame")
        return cls(
            key=key,
            first_offset=builder.first_offset,
            last_offset=builder.last_offset,
            size_bytes=builder.size_bytes,
            message_count=builder.message_count,
            created_ms=created_ms,
            index=builder.entries,
            contiguous=contiguous,
            publish_ms_min=None if publish_ms is None else publish_ms[0],
            publish_ms_max=None if publish_ms is None else publish_ms[1],
        )

    def may_hold_time(self, timestamp_ms: int) -> bool:
        """Whether a record published at or after ``timestamp_ms`` may be in the object
        (always, when the descriptor does not know its publish times)."""
        return self.publish_ms_max is None or self.publish_ms_max >= timestamp_ms

    def seek(self, offset: int) -> int:
        """The byte position to start scanning at for ``offset`` (see :func:`index.seek`)."""
        return seek(self.index, offset)

    def to_bytes(self) -> bytes:
        """The stored form: compact JSON (see the module docstring)."""
        deltas: list[int] = []
        prev_offset, prev_position = self.first_offset, 0
        for offset, position in self.index:
            deltas += (offset - prev_offset, position - prev_position)
            prev_offset, prev_position = offset, position
        stored: dict[str, Any] = {
            "v": self.version,
            "k": self.key,
            "f": self.first_offset,
            "l": self.last_offset,
            "s": self.size_bytes,
            "n": self.message_count,
            "c": self.contiguous,
            "t": self.created_ms,
            "x": deltas,
        }
        if self.publish_ms_min is not None:
            stored["p"] = [self.publish_ms_min, self.publish_ms_max]
        data = orjson.dumps(stored)
        if len(data) > MAX_DESCRIPTOR_BYTES:
            raise InvalidDescriptorError("index", f"{len(data)} bytes stored is over the limit")
        return data

    @classmethod
    def from_bytes(cls, data: bytes) -> ObjectDescriptor:
        """Parse and check a stored descriptor; raises :class:`CorruptDescriptorError`."""
        if len(data) > MAX_DESCRIPTOR_BYTES:
            raise CorruptDescriptorError("", f"{len(data)} bytes is over the limit")
        try:
            raw = orjson.loads(data)
        except orjson.JSONDecodeError as exc:
            raise CorruptDescriptorError("", f"not JSON: {exc}") from exc
        if not isinstance(raw, dict):
            raise CorruptDescriptorError("", "not a JSON object")
        if "v" in raw and raw["v"] != DESCRIPTOR_VERSION:
            raise UnsupportedDescriptorVersionError(raw["v"])
        if not _FIELDS <= set(raw) <= _FIELDS | _OPTIONAL_FIELDS:
            missing = sorted(_FIELDS - set(raw))
            extra = sorted(set(raw) - _FIELDS - _OPTIONAL_FIELDS)
            raise CorruptDescriptorError("", f"missing fields {missing}, unknown fields {extra}")
        publish_ms = _publish_ms(raw)
        deltas = raw["x"]
        if not isinstance(deltas, list) or len(deltas) % 2:
            raise CorruptDescriptorError("x", "the index is not a list of (offset, position) pairs")
        try:
            return cls(
                key=_typed(raw, "k", str),
                first_offset=_typed(raw, "f", int),
                last_offset=_typed(raw, "l", int),
                size_bytes=_typed(raw, "s", int),
                message_count=_typed(raw, "n", int),
                created_ms=_typed(raw, "t", int),
                index=_undelta(_typed(raw, "f", int), deltas),
                contiguous=_typed(raw, "c", bool),
                publish_ms_min=None if publish_ms is None else publish_ms[0],
                publish_ms_max=None if publish_ms is None else publish_ms[1],
            )
        except CorruptDescriptorError:
            raise
        except InvalidDescriptorError as exc:
            raise CorruptDescriptorError(exc.field, exc.reason) from exc


def _typed(raw: dict[str, Any], name: str, kind: type[_T]) -> _T:
    value = raw[name]
    # type() rather than isinstance(): a JSON true must not pass as the integer 1.
    if type(value) is not kind:
        raise CorruptDescriptorError(name, f"expected {kind.__name__}, got {value!r}")
    return value


def _publish_ms(raw: dict[str, Any]) -> tuple[int, int] | None:
    if "p" not in raw:
        return None
    pair = raw["p"]
    if not isinstance(pair, list) or len(pair) != 2 or any(type(v) is not int for v in pair):
        raise CorruptDescriptorError("p", f"expected [min, max] publish times, got {pair!r}")
    return pair[0], pair[1]


def _undelta(first_offset: int, deltas: list[Any]) -> tuple[IndexEntry, ...]:
    entries: list[IndexEntry] = []
    offset, position = first_offset, 0
    for i in range(0, len(deltas), 2):
        d_offset, d_position = deltas[i], deltas[i + 1]
        if type(d_offset) is not int or type(d_position) is not int:
            raise CorruptDescriptorError("x", f"index entry {i // 2} is not two integers")
        offset, position = offset + d_offset, position + d_position
        entries.append(IndexEntry(offset, position))
    return tuple(entries)


def _as_index(index: Iterable[Any]) -> tuple[IndexEntry, ...]:
    try:
        return tuple(IndexEntry(int(entry[0]), int(entry[1])) for entry in index)
    except (TypeError, ValueError, IndexError) as exc:
        raise InvalidDescriptorError("index", "entries must be (offset, position) pairs") from exc


def _validate(d: ObjectDescriptor) -> None:
    """Raise InvalidDescriptorError on the first field that contradicts the others."""
    if d.version != DESCRIPTOR_VERSION:
        raise InvalidDescriptorError("version", f"only version {DESCRIPTOR_VERSION} is known")
    for name in ("first_offset", "last_offset", "size_bytes", "message_count", "created_ms"):
        if type(getattr(d, name)) is not int:
            raise InvalidDescriptorError(name, "must be an integer")
    if type(d.contiguous) is not bool:
        raise InvalidDescriptorError("contiguous", "must be a bool")
    if not 0 <= d.first_offset <= d.last_offset <= MAX_OFFSET:
        raise InvalidDescriptorError(
            "last_offset", f"need 0 <= first ({d.first_offset}) <= last ({d.last_offset}) <= u64"
        )
    try:
        named = parse_object_key(d.key)
    except InvalidObjectKeyError as exc:
        raise InvalidDescriptorError("key", exc.reason) from exc
    if (named.start_offset, named.end_offset) != (d.first_offset, d.last_offset):
        raise InvalidDescriptorError("key", "the key's offset range is not the descriptor's")
    span = d.last_offset - d.first_offset + 1
    if d.contiguous and d.message_count != span:
        raise InvalidDescriptorError(
            "message_count", f"{d.message_count} messages for {span} contiguous offsets"
        )
    if not 1 <= d.message_count <= span:
        raise InvalidDescriptorError("message_count", f"{d.message_count} not in [1, {span}]")
    if d.size_bytes < d.message_count * FRAME_HEADER_BYTES:
        raise InvalidDescriptorError(
            "size_bytes", f"{d.size_bytes} bytes cannot hold {d.message_count} frames"
        )
    if not 0 <= d.created_ms <= _MAX_MS:
        raise InvalidDescriptorError("created_ms", f"{d.created_ms} is out of range")
    _validate_publish_ms(d)
    _validate_index(d)


def _validate_publish_ms(d: ObjectDescriptor) -> None:
    low, high = d.publish_ms_min, d.publish_ms_max
    if low is None and high is None:
        return
    if low is None or high is None:
        raise InvalidDescriptorError("publish_ms", "give both the min and max publish time")
    if type(low) is not int or type(high) is not int or not 0 <= low <= high <= MAX_OFFSET:
        raise InvalidDescriptorError(
            "publish_ms", f"need 0 <= min ({low!r}) <= max ({high!r}) <= u64"
        )


def _validate_index(d: ObjectDescriptor) -> None:
    index = d.index
    if not 1 <= len(index) <= MAX_INDEX_ENTRIES:
        raise InvalidDescriptorError("index", f"{len(index)} entries, need 1..{MAX_INDEX_ENTRIES}")
    if index[0] != (d.first_offset, 0):
        raise InvalidDescriptorError("index", "the first entry must be (first_offset, 0)")
    for prev, entry in itertools.pairwise(index):
        if entry.offset <= prev.offset or entry.position <= prev.position:
            raise InvalidDescriptorError("index", f"entry {entry} does not follow {prev}")
        # Every frame is at least a header long, so n offsets take at least n headers of bytes.
        if d.contiguous and (entry.position - prev.position) < (
            (entry.offset - prev.offset) * FRAME_HEADER_BYTES
        ):
            raise InvalidDescriptorError("index", f"entry {entry} is too close to {prev}")
    last = index[-1]
    if last.offset > d.last_offset:
        raise InvalidDescriptorError("index", f"entry {last} is past the last offset")
    frames_left = d.last_offset - last.offset + 1 if d.contiguous else 1
    if d.size_bytes - last.position < frames_left * FRAME_HEADER_BYTES:
        raise InvalidDescriptorError("index", f"entry {last} is past the end of the object")

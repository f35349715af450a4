"""Object keys: where the frames of one topic partition live in object storage.

One object holds the frames of offsets ``start`` through ``end`` (both inclusive) of one topic
partition, under::

    <root>/topics/<ns>/<topic>/<start:020>-<end:020>.dnb

``<root>`` is ``wal_cloud.uploader.root_prefix`` without its leading and trailing slashes (an
object key is relative to the backend's root, and OpenDAL keys never start with ``/``). Offsets
are zero-padded to 20 digits, the width of the largest u64, so that the keys of one topic sort
as text in offset order: a listing is already a timeline.
"""

from __future__ import annotations

import re
from typing import NamedTuple

from danube.storage.errors import InvalidObjectKeyError

OBJECT_SUFFIX = ".dnb"
MAX_OFFSET = 2**64 - 1  # offsets are u64 in the frame header
_OFFSET_DIGITS = len(str(MAX_OFFSET))  # 20

# Namespace and topic segments, as the HTTP API accepts them.
_NAME = re.compile(r"[A-Za-z0-9_-]{1,255}")
# A root segment: anything printable but a slash; "." and ".." are refused separately.
_ROOT_SEGMENT = re.compile(r"[^/\x00-\x1f\x7f]+")
_OBJECT_NAME = re.compile(
    rf"(\d{{{_OFFSET_DIGITS}}})-(\d{{{_OFFSET_DIGITS}}}){re.escape(OBJECT_SUFFIX)}"
)


class ObjectName(NamedTuple):
    """What an object key says: the topic and the inclusive offset range of its frames."""

    ns: str
    topic: str
    start_offset: int
    end_offset: int


def normalize_root(root_prefix: str) -> str:
    """``"/danube-data/"`` → ``"danube-data"``; ``"/"`` or ``""`` → ``""`` (the backend root).

    Raises :class:`InvalidObjectKeyError` for empty, ``.`` or ``..`` segments (``"a//b"``).
    """
    root = root_prefix.strip("/")
    if not root:
        return ""
    for segment in root.split("/"):
        if segment in (".", "..") or not _ROOT_SEGMENT.fullmatch(segment):
            raise InvalidObjectKeyError(root_prefix, f"bad root segment {segment!r}")
    return root


def topic_prefix(root_prefix: str, ns: str, topic: str) -> str:
    """The directory every object of one topic partition is under, ending in ``/``."""
    _check_name("namespace", ns)
    _check_name("topic", topic)
    root = normalize_root(root_prefix)
    head = f"{root}/" if root else ""
    return f"{head}topics/{ns}/{topic}/"


def object_key(root_prefix: str, ns: str, topic: str, start_offset: int, end_offset: int) -> str:
    """The key of the object holding offsets ``start_offset`` through ``end_offset`` inclusive."""
    _check_offsets(f"{ns}/{topic}", start_offset, end_offset)
    name = f"{start_offset:0{_OFFSET_DIGITS}d}-{end_offset:0{_OFFSET_DIGITS}d}{OBJECT_SUFFIX}"
    return topic_prefix(root_prefix, ns, topic) + name


def parse_object_key(key: str, *, root_prefix: str | None = None) -> ObjectName:
    """Read the topic and offset range back from a key made by :func:`object_key`.

    With ``root_prefix``, the key must also sit under that root. Raises
    :class:`InvalidObjectKeyError` for anything :func:`object_key` could not have made.
    """
    parts = key.split("/")
    if len(parts) < 4 or parts[-4] != "topics":
        raise InvalidObjectKeyError(key, "expected <root>/topics/<ns>/<topic>/<start>-<end>.dnb")
    ns, topic, name = parts[-3], parts[-2], parts[-1]
    match = _OBJECT_NAME.fullmatch(name)
    if match is None:
        raise InvalidObjectKeyError(key, f"object name {name!r} is not <start:020>-<end:020>.dnb")
    start, end = int(match.group(1)), int(match.group(2))
    for what, value in (("namespace", ns), ("topic", topic)):
        if not _NAME.fullmatch(value):
            raise InvalidObjectKeyError(key, f"bad {what} segment {value!r}")
    _check_offsets(key, start, end)
    root = "/".join(parts[:-4])
    # The same rules object_key applies, so that parse accepts exactly what object_key makes.
    try:
        if normalize_root(root) != root:
            raise InvalidObjectKeyError(key, "empty root segment")
    except InvalidObjectKeyError as exc:
        raise InvalidObjectKeyError(key, exc.reason) from exc
    if root_prefix is not None and root != normalize_root(root_prefix):
        raise InvalidObjectKeyError(key, f"not under root prefix {root_prefix!r}")
    return ObjectName(ns, topic, start, end)


def _check_name(what: str, value: str) -> None:
    if not _NAME.fullmatch(value):
        raise InvalidObjectKeyError(value, f"{what} must be 1-255 letters, digits, '_' or '-'")


def _check_offsets(key: str, start: int, end: int) -> None:
    # bool is an int in Python; an offset of True is a caller bug, not offset 1.
    if type(start) is not int or type(end) is not int:
        raise InvalidObjectKeyError(key, "offsets must be integers")
    if not 0 <= start <= MAX_OFFSET or not 0 <= end <= MAX_OFFSET:
        raise InvalidObjectKeyError(key, f"offsets must be within [0, {MAX_OFFSET}]")
    if start > end:
        raise InvalidObjectKeyError(key, f"start offset {start} is after end offset {end}")

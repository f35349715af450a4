"""Chunked messages: one large message stored as several records (docs/client.md, "Large
messages"), described by record attributes under the reserved ``danube.`` prefix, so the
record format does not change. Every chunk of a message carries all four::

    danube.chunk.uuid         32 lowercase hex digits, the same on every chunk of a message
    danube.chunk.index        0 … count - 1, the chunk's place in the payload
    danube.chunk.count        how many chunks the message has (2 … CHUNKS_MAX)
    danube.chunk.total_bytes  the whole payload's size (count - 1 < total_bytes)

plus the message's own key and attributes. The payloads of chunks 0 … count - 1, joined in
index order, are the message's payload; each is at most the producer's chunk size.

The producer SDK splits and sends; the consumer SDK reassembles; the front door
(discovery) refuses a chunk whose ``total_bytes`` is over the topic's
``max_chunked_message_bytes`` policy (:func:`total_bytes_of`), so a client that does not
use the SDK cannot store a chunked message larger than the namespace allows. This module is
that contract: the names, the bounds and one parser, shared by both sides.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

CHUNK_PREFIX = "danube.chunk."
"""Attributes under this prefix are the chunking's: the SDK refuses them from applications."""
UUID_ATTRIBUTE = "danube.chunk.uuid"
INDEX_ATTRIBUTE = "danube.chunk.index"
COUNT_ATTRIBUTE = "danube.chunk.count"
TOTAL_BYTES_ATTRIBUTE = "danube.chunk.total_bytes"
ATTRIBUTES_COUNT = 4  # what chunking adds to a message's attributes

CHUNKS_MAX = 1 << 20  # 100 MiB in 100-byte chunks is ~1 M: no chunk size makes more sense
CHUNKED_BYTES_MAX = 1 << 30  # the bound of the max_chunked_message_bytes policy (1 GiB)
CHUNKED_BYTES_DEFAULT = 100 * 1024 * 1024  # the policy where none is set (100 MiB)
# What the front door looks for in a body before it reads any record's attributes: a body
# without these bytes carries no chunk (a scan at memchr speed on every produce).
TOTAL_BYTES_NEEDLE = TOTAL_BYTES_ATTRIBUTE.encode()

_UUID = re.compile(r"[0-9a-f]{32}")
_NUMBER = re.compile(r"[0-9]{1,10}")


@dataclass(frozen=True, slots=True)
class ChunkHeader:
    """A chunk's four attributes, parsed and checked together."""

    uuid: str
    index: int
    count: int
    total_bytes: int


class BadChunkError(ValueError):
    """Chunk attributes that do not follow the contract above (what is wrong in the text)."""


def is_chunk(attributes: Mapping[str, str]) -> bool:
    """Whether a record's attributes mark it as a chunk (it names a chunk uuid)."""
    return UUID_ATTRIBUTE in attributes


def chunk_header(attributes: Mapping[str, str]) -> ChunkHeader:
    """The chunk attributes of a record that :func:`is_chunk`; :class:`BadChunkError` when
    one is missing, malformed or out of its bounds."""
    uuid = attributes.get(UUID_ATTRIBUTE, "")
    if _UUID.fullmatch(uuid) is None:
        raise BadChunkError(f"{UUID_ATTRIBUTE} {uuid[:40]!r} is not 32 lowercase hex digits")
    index = _number(attributes, INDEX_ATTRIBUTE)
    count = _number(attributes, COUNT_ATTRIBUTE)
    total = _number(attributes, TOTAL_BYTES_ATTRIBUTE)
    if not 2 <= count <= CHUNKS_MAX:
        raise BadChunkError(f"{COUNT_ATTRIBUTE} {count} is not in 2 … {CHUNKS_MAX}")
    if index >= count:
        raise BadChunkError(f"{INDEX_ATTRIBUTE} {index} is not below the count {count}")
    if total < count:
        raise BadChunkError(f"{TOTAL_BYTES_ATTRIBUTE} {total} is below the count {count}")
    return ChunkHeader(uuid, index, count, total)


def total_bytes_of(attributes: Mapping[str, str]) -> int | None:
    """The ``total_bytes`` a record claims for its chunked message (what the policy is
    checked against); None when it claims none. A value that is not a number of at most 10
    digits raises :class:`BadChunkError` (the front door refuses it: a chunk must not pass
    the policy by a malformed size)."""
    if TOTAL_BYTES_ATTRIBUTE not in attributes:
        return None
    return _number(attributes, TOTAL_BYTES_ATTRIBUTE)


def _number(attributes: Mapping[str, str], name: str) -> int:
    value = attributes.get(name)
    if value is None or _NUMBER.fullmatch(value) is None:
        raise BadChunkError(f"{name} {value!r:.40} is not a whole number of at most 10 digits")
    return int(value)

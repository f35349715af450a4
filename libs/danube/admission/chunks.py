"""The ``max_chunked_message_bytes`` policy at every produce door (docs/policies.md): a chunk
(a record with ``danube.chunk.total_bytes``, danube.wire.chunks) claiming a whole message
larger than the topic allows is refused, ``413 chunked_message_too_large``, before
anything of its batch is written; a claim that is not a number, ``400 invalid_chunk``.

Held here rather than by the producer SDK alone, so that a client that splits messages
itself cannot store a larger one than its namespace allows. Every chunk carries the claim,
so the first chunk of such a message is refused, and so is every later one: nothing of it
is stored. Cost on other produces: a search for the attribute's name (the whole body, or
each record's head when records are large); records' attributes are read only in bodies
that hold it. Pure: admission counts the refusal (``policy_refusals``, reason
``chunked_message_too_large``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from danube.errors import BadRequestError, TooLargeError
from danube.frame.produce import ProducedFrames
from danube.frame.record_decode import decode_record_at
from danube.meta.records import Policies
from danube.wire import chunks

REFUSED = "chunked_message_too_large"


def chunked_limit(policies: Policies) -> int:
    """The largest chunked message ``policies`` allow (unset: 100 MiB)."""
    return policies.max_chunked_message_bytes or chunks.CHUNKED_BYTES_DEFAULT


def check_chunked(all_attributes: Iterable[Mapping[str, str]], limit: int) -> None:
    """Refuse the first record whose chunk claims a total over ``limit``."""
    for index, attributes in enumerate(all_attributes):
        if chunks.TOTAL_BYTES_ATTRIBUTE not in attributes:
            continue
        try:
            total = chunks.total_bytes_of(attributes)
        except chunks.BadChunkError as exc:
            raise BadRequestError(f"messages[{index}]: {exc}", code="invalid_chunk") from exc
        if total is not None and total > limit:
            raise TooLargeError(
                f"messages[{index}] is a chunk of a {total}-byte message, over the topic's "
                f"max_chunked_message_bytes of {limit}",
                code=REFUSED,
                limit=limit,
            )


def check_chunked_frames(frames: ProducedFrames, limit: int) -> None:
    """:func:`check_chunked` of a binary body's records (read only when the body names the
    attribute at all: :func:`_names_total_bytes`)."""
    if not _names_total_bytes(frames):
        return
    body = frames.body
    spans = zip(frames.starts, frames.ends, strict=True)
    check_chunked(
        (decode_record_at(body, start, end, decompress=False)[3] for start, end in spans), limit
    )


# Average record size past which the records' heads are searched one by one rather than
# the whole body (measured 2026-11-30, 1 000 records: the whole body ~0.18 ns a byte, the
# heads one by one ~0.4-0.9 us a record; even at 2 KiB records 0.35 against 0.41 us).
_RECORD_BYTES_SEARCHED_ALONE = 2560


def _names_total_bytes(frames: ProducedFrames) -> bool:
    """Whether the body holds the chunk total's attribute name anywhere it could be: in
    the whole body (small records), or in each record before its payload (large ones:
    the payload bytes, most of the body, are not searched)."""
    body = frames.body
    whole = body.obj
    if not isinstance(whole, bytes | bytearray) or len(whole) != len(body):
        whole = bytes(body)  # a view into a larger buffer: its own offsets
    needle = chunks.TOTAL_BYTES_NEEDLE
    if len(whole) <= _RECORD_BYTES_SEARCHED_ALONE * len(frames):
        return whole.find(needle) >= 0
    find = whole.find
    for index, start in enumerate(frames.starts):
        # Up to the stored payload (a compressed one is shorter than its message's size).
        if find(needle, start, frames.payload_start(index)) >= 0:
            return True
    return False

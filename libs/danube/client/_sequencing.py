"""An idempotent producer's decisions, with no I/O (docs/client.md, "Exactly once into the
log"): where each batch goes, which sequences its records carry, and the bytes that say so.

The ingest leader deduplicates per producer name and partition: a batch's records carry the
producer's epoch and consecutive sequence numbers in that partition, and a resend of the
same records is answered with their first offsets instead of being stored again. So the
producer routes its own batches (the server must not spread one over partitions behind its
back): each part of a batch goes to one partition with the next sequences of that
partition, and is resent as the very same bytes until it is answered.

A message is encoded at ``send()`` as a sequenced record (format version 2). Where the
producer knows its epoch and the topic's partitions (every send after the first batch, in
the steady state), the record is encoded with its partition's next sequence at once: a
:class:`Stamp` says which, and planning its batch copies nothing. Otherwise (the first
batch, a new epoch after a failure, ``send_encoded``, ``send_many``) it is encoded with
epoch and sequence 0, and :func:`stamp` writes them once its batch is planned, and the
frame's CRC again. The frame (docs/formats.md)::

    [u64 offset=0][u32 length][u32 crc32c]
    [record header v2: ..., u32 producer_epoch, u64 sequence][producer, key, attributes][payload]

Routing is discovery's (:mod:`danube.routing`): a keyed message goes to
``fnv1a_32(key) mod N``; keyless messages stick to one partition per batch, the next batch's
keyless ones to the next partition (round robin over batches), so a batch of keyless
messages is one request.
"""

from __future__ import annotations

import random
import struct
from collections.abc import Sequence

from crc32c import crc32c

from danube.frame import (
    FRAME_CRC_AT,
    FRAME_HEADER_BYTES,
    RECORD_HEADER_BYTES,
    SEQUENCED_RECORD_VERSION,
)
from danube.frame.record import FLAG_KEY, RECORD_FLAGS_AT, RECORD_PRODUCER_LEN_AT
from danube.names import TopicName
from danube.routing import partition_for_raw_key

# Positions in a produced frame (danube.frame's layouts): the frame header's crc, then the
# record from FRAME_HEADER_BYTES on; a sequenced record's producer_epoch u32 and sequence
# u64 right after version 1's header.
_CRC = struct.Struct("<I")
_CRC_AT = FRAME_CRC_AT
_RECORD_AT = FRAME_HEADER_BYTES
_FLAGS_AT = _RECORD_AT + RECORD_FLAGS_AT
_TEXT_LENGTHS = struct.Struct("<HH")  # producer_len, key_len
_TEXT_LENGTHS_AT = _RECORD_AT + RECORD_PRODUCER_LEN_AT
_EPOCH_SEQUENCE = struct.Struct("<IQ")
_EPOCH_SEQUENCE_AT = _RECORD_AT + RECORD_HEADER_BYTES
_SEQUENCED_HEAD_BYTES = _EPOCH_SEQUENCE_AT + _EPOCH_SEQUENCE.size
_FLAG_KEY = FLAG_KEY

EPOCH_MAX = 0xFFFF_FFFF
SEQUENCE_MAX = 0xFFFF_FFFF_FFFF_FFFF


def is_sequenced(frame: bytes) -> bool:
    """``frame`` holds a sequenced record (what :func:`stamp` can stamp)."""
    return len(frame) >= _SEQUENCED_HEAD_BYTES and frame[_RECORD_AT] == SEQUENCED_RECORD_VERSION


def stamp(frame: bytes, epoch: int, sequence: int) -> tuple[bytes, memoryview]:
    """A sequenced frame with ``epoch`` and ``sequence`` written in, as two pieces to join
    (its head, patched, with the CRC made again; the rest as it was: the payload is not
    copied until the request's body is joined)."""
    head = bytearray(frame[:_SEQUENCED_HEAD_BYTES])
    _EPOCH_SEQUENCE.pack_into(head, _EPOCH_SEQUENCE_AT, epoch, sequence)
    rest = memoryview(frame)[_SEQUENCED_HEAD_BYTES:]
    crc = crc32c(rest, crc32c(memoryview(head)[_RECORD_AT:], crc32c(memoryview(head)[:_CRC_AT])))
    _CRC.pack_into(head, _CRC_AT, crc)
    return bytes(head), rest


def key_of(frame: bytes) -> bytes | None:
    """The routing key of a sequenced frame, as its UTF-8 bytes (None: no key)."""
    if not frame[_FLAGS_AT] & _FLAG_KEY:
        return None
    producer_len, key_len = _TEXT_LENGTHS.unpack_from(frame, _TEXT_LENGTHS_AT)
    start = _SEQUENCED_HEAD_BYTES + producer_len
    return frame[start : start + key_len]


Stamp = tuple[int, TopicName, int]
"""Of a record encoded at ``send()``: the producer's generation (its epoch's: a stamp of an
older generation is stale, its record stamped again when its batch is planned), the
partition the record goes to and the sequence it carries. A plain tuple: one is made per
message."""


class Router:
    """The partition of each message of a batch. ``partitions``: the topic's count (0:
    unpartitioned, every message to the topic itself; None: not known yet, the same)."""

    def __init__(self, topic: TopicName, *, turn: int | None = None) -> None:
        self.topic = topic
        self.partitions: int | None = 0 if topic.partition is not None else None
        # Where keyless messages go next; a random start spreads many producers' first batches.
        self._turn = random.randrange(1024) if turn is None else turn
        self._names: dict[int, TopicName] = {}

    def partition_of(self, key: bytes | None) -> TopicName:
        """Where a message with ``key`` (UTF-8; None: keyless) goes now: keyless ones to the
        partition of the current turn (:meth:`next_turn` moves on, once a batch)."""
        count = self.partitions or 0
        if count == 0:
            return self.topic
        index = partition_for_raw_key(key, count) if key is not None else self._turn % count
        name = self._names.get(index)
        if name is None:
            name = self._names[index] = self.topic.partition_name(index)
        return name

    def next_turn(self) -> None:
        """Keyless messages go to the next partition from now on."""
        self._turn += 1

    def route(self, frames: Sequence[bytes]) -> dict[TopicName, list[int]]:
        """The indexes of ``frames`` per partition they go to, each list in order; keyless
        messages of the batch all go to one partition (the current turn's; then the next)."""
        if not self.partitions:
            return {self.topic: list(range(len(frames)))}
        groups: dict[TopicName, list[int]] = {}
        for index, frame in enumerate(frames):
            groups.setdefault(self.partition_of(key_of(frame)), []).append(index)
        self.next_turn()
        return groups


class Sequences:
    """The next sequence of each partition under one epoch: consecutive from 0, per
    partition (the leader checks that a batch continues where the last one ended)."""

    def __init__(self) -> None:
        self._next: dict[TopicName, int] = {}

    def take(self, partition: TopicName, count: int) -> int:
        """Reserve ``count`` sequences of ``partition``; the first."""
        first = self._next.get(partition, 0)
        if first + count > SEQUENCE_MAX:
            raise OverflowError(f"{partition}: sequences past {SEQUENCE_MAX}")
        self._next[partition] = first + count
        return first

    def next(self, partition: TopicName) -> int:
        """The sequence the next message to ``partition`` gets."""
        return self._next.get(partition, 0)

    def reset(self) -> None:
        """A new epoch: every partition starts again at 0."""
        self._next.clear()

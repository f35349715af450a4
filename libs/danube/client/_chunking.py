"""Large messages as chunks (docs/client.md, "Large messages"; the attributes are
:mod:`danube.wire.chunks`): the producer's split and the consumer's reassembly, pure logic
with no I/O (the producer and consumer call it and act on what it answers).

**Split.** A payload over the producer's ``max_payload_bytes`` becomes ``ceil(size /
chunk_bytes)`` chunks, each a record with the message's key (or, when it has none, the
message's uuid: the chunks then land in one partition and on one key_shared consumer) and
attributes plus the four chunk attributes. The producer queues them back to back, so an
ordered producer stores them in order in one partition.

**Reassembly** (:class:`Reassembler`, a state machine fed one delivered record at a time):
chunks are gathered per message (partition, producer, uuid) into a *partial*; when every
index is there, the payloads are joined into one :class:`ChunkedMessage` whose ``chunks``
are every record it came from (acking it acks them all). A partial is **given up**
(:class:`GivenUp`: its records are acked or nacked by the consumer, per its
``chunk_give_up``, counted and logged) when:

- ``missing_chunk``: a chunk arrives whose earlier chunks are not held (a subscription that
  started in the middle of a message, a shared subscription that gave them to another
  consumer), or a chunk of a *later* message of the same producer arrives in the same
  partition while this one lacks chunks (a producer sends all of a message's chunks before
  the next message's, so the missing ones were never stored, or expired);
- ``expired``: its first chunk came more than ``expiry_s`` ago;
- ``evicted``: room was needed for a newer message (the bytes cap, or the count cap), the
  oldest partial goes first;
- ``too_large``: its ``total_bytes`` alone is over the bytes cap;
- ``corrupt``: its chunks disagree (count, total size, key) or do not add up to the total.

Memory: a partial reserves its whole ``total_bytes`` when its first chunk comes, so the
payload bytes held for partial messages never exceed ``bytes_max`` (and at most
``partials_max`` messages are partial at once).
"""

from __future__ import annotations

import uuid as uuid_module
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Literal

from danube.client.errors import ClientError
from danube.client.messages import MessageRef, ReceivedMessage
from danube.wire import chunks as wire

GiveUpReason = Literal["missing_chunk", "expired", "evicted", "too_large", "corrupt"]
GIVE_UP_REASONS: tuple[GiveUpReason, ...] = (
    "missing_chunk",
    "expired",
    "evicted",
    "too_large",
    "corrupt",
)
# Uuids of messages given up, remembered so that their later chunks are let go at once
# (not held as a new partial): at most this many, the oldest forgotten first.
GIVEN_UP_REMEMBERED = 4096


def new_uuid() -> str:
    """A chunked message's uuid (32 lowercase hex digits)."""
    return uuid_module.uuid4().hex


def split(payload: bytes, chunk_bytes: int) -> list[memoryview]:
    """``payload`` in pieces of ``chunk_bytes`` (the last one shorter), as views (no copy)."""
    if chunk_bytes < 1:
        raise ValueError("chunk_bytes must be at least 1")
    view = memoryview(payload)
    return [view[start : start + chunk_bytes] for start in range(0, len(payload), chunk_bytes)]


def chunk_attributes(
    attributes: dict[str, str], uuid: str, index: int, count: int, total_bytes: int
) -> dict[str, str]:
    """A chunk's attributes: the message's, and the four of :mod:`danube.wire.chunks`."""
    return {
        **attributes,
        wire.UUID_ATTRIBUTE: uuid,
        wire.INDEX_ATTRIBUTE: str(index),
        wire.COUNT_ATTRIBUTE: str(count),
        wire.TOTAL_BYTES_ATTRIBUTE: str(total_bytes),
    }


@dataclass(frozen=True, slots=True)
class ChunkedMessage(ReceivedMessage):
    """A message reassembled from chunks: ``partition`` and ``offset`` are its first
    chunk's, ``redelivery_count`` the highest of its chunks', and ``chunks`` every record
    it came from (an ack or nack of the message is one of each)."""

    chunks: tuple[MessageRef, ...] = ()


class IncompleteMessageError(ClientError):
    """A chunked message given up (docs/client.md, "Large messages"): ``reason`` says why
    (``missing_chunk``, ``expired``, ``evicted``, ``too_large``, ``corrupt``)."""

    code = "incomplete_message"

    def __init__(self, message: str, *, reason: GiveUpReason) -> None:
        super().__init__(message)
        self.reason = reason


@dataclass(frozen=True, slots=True)
class GivenUp:
    """Records of a chunked message let go of: the consumer acks or nacks ``refs``.
    ``first`` is False for a later chunk of a message given up before (counted once)."""

    reason: GiveUpReason
    uuid: str
    partition: str
    producer: str
    refs: tuple[MessageRef, ...]
    received: int  # distinct chunks held when given up
    count: int  # chunks the message has (0 when unknown: corrupt attributes)
    first: bool = True

    def error(self) -> IncompleteMessageError:
        """The error this give-up is, as logged and kept (``consumer.last_chunk_error``)."""
        return IncompleteMessageError(
            f"chunked message {self.uuid} of producer {self.producer!r} in {self.partition} "
            f"given up ({self.reason}): {self.received} of {self.count} chunks received; "
            f"its {len(self.refs)} record(s) let go",
            reason=self.reason,
        )


@dataclass(slots=True)
class _Partial:
    """The chunks of one message received so far."""

    header: wire.ChunkHeader
    key: str | None
    first_s: float  # when its first chunk came (the consumer's clock)
    pieces: list[bytes | None]
    refs: dict[MessageRef, None] = field(default_factory=dict)  # ordered, no duplicates
    received: int = 0
    payload_bytes: int = 0  # of the pieces held: never more than header.total_bytes
    last_offset: int = -1
    redelivery_count: int = 0
    first: ReceivedMessage | None = None  # chunk 0: the message's fields come from it


_PartialKey = tuple[str, str, str]  # partition, producer, uuid


class Reassembler:
    """The consumer's partial chunked messages (see the module docstring); no I/O. Feed
    each delivered chunk to :meth:`offer`, call :meth:`expire` now and then."""

    def __init__(self, *, bytes_max: int, partials_max: int, expiry_s: float) -> None:
        self.bytes_max = bytes_max
        self.partials_max = partials_max
        self.expiry_s = expiry_s
        self.held_bytes = 0  # reserved by partials: the sum of their total_bytes
        self._partials: OrderedDict[_PartialKey, _Partial] = OrderedDict()  # oldest first
        self._given_up: OrderedDict[_PartialKey, GiveUpReason] = OrderedDict()

    def __len__(self) -> int:
        return len(self._partials)

    def validate(self) -> None:
        """Check the invariants (tests call it after every event)."""
        held = sum(p.header.total_bytes for p in self._partials.values())
        assert held == self.held_bytes <= self.bytes_max, (held, self.held_bytes)
        assert len(self._partials) <= self.partials_max
        for partial in self._partials.values():
            assert partial.received == sum(p is not None for p in partial.pieces)
            held = sum(len(p) for p in partial.pieces if p is not None)
            assert held == partial.payload_bytes <= partial.header.total_bytes
            assert 0 < partial.received < partial.header.count

    def offer(
        self, message: ReceivedMessage, now_s: float
    ) -> tuple[ChunkedMessage | None, list[GivenUp]]:
        """Take one chunk (a message whose attributes :func:`~danube.wire.chunks.is_chunk`):
        the message it completes, if any, and what was given up on the way."""
        given_up = self.expire(now_s)
        try:
            header = wire.chunk_header(message.attributes)
        except wire.BadChunkError:
            uuid = message.attributes.get(wire.UUID_ATTRIBUTE, "")[:64]
            refs = (message.ref,)
            given_up.append(
                GivenUp("corrupt", uuid, message.partition, message.producer, refs, 1, 0)
            )
            return None, given_up
        key = (message.partition, message.producer, header.uuid)
        if message.redelivery_count == 0:
            given_up += self._superseded(key, message.offset)
        partial = self._partials.get(key)
        if partial is None and header.index == 0:
            # The message from its start (again: a nacked or redelivered one): a new chance.
            self._given_up.pop(key, None)
        reason = self._given_up.get(key)
        if reason is not None:  # a later chunk of a message let go already
            given_up.append(self._stray(key, header, message, reason))
            return None, given_up
        if partial is None:
            if header.index != 0:
                given_up.append(self._stray(key, header, message, "missing_chunk", first=True))
                return None, given_up
            if header.total_bytes > self.bytes_max:
                given_up.append(self._stray(key, header, message, "too_large", first=True))
                return None, given_up
            given_up += self._make_room(header.total_bytes)
            partial = _Partial(header, message.key, now_s, [None] * header.count)
            self._partials[key] = partial
            self.held_bytes += header.total_bytes
        elif (header.count, header.total_bytes, message.key) != (
            partial.header.count,
            partial.header.total_bytes,
            partial.key,
        ):
            partial.refs[message.ref] = None
            given_up.append(self._give_up(key, "corrupt"))
            return None, given_up
        done = self._add(key, partial, header, message)
        if isinstance(done, GivenUp):
            given_up.append(done)
            return None, given_up
        return done, given_up

    def expire(self, now_s: float) -> list[GivenUp]:
        """Give up the partials whose first chunk came more than ``expiry_s`` ago."""
        given_up = []
        while self._partials:
            key, oldest = next(iter(self._partials.items()))
            if now_s - oldest.first_s <= self.expiry_s:
                break
            given_up.append(self._give_up(key, "expired"))
        return given_up

    def _add(
        self,
        key: _PartialKey,
        partial: _Partial,
        header: wire.ChunkHeader,
        message: ReceivedMessage,
    ) -> ChunkedMessage | GivenUp | None:
        partial.refs[message.ref] = None
        partial.last_offset = max(partial.last_offset, message.offset)
        partial.redelivery_count = max(partial.redelivery_count, message.redelivery_count)
        if partial.pieces[header.index] is not None:
            return None  # a redelivery, or a chunk stored twice: its ref is kept, acked too
        partial.payload_bytes += len(message.payload)
        if partial.payload_bytes > header.total_bytes:
            # More bytes than it claimed (what it reserved): the memory cap holds.
            return self._give_up(key, "corrupt")
        partial.pieces[header.index] = message.payload
        partial.received += 1
        if header.index == 0:
            partial.first = message
        if partial.received < header.count:
            return None
        del self._partials[key]
        self.held_bytes -= header.total_bytes
        payload = b"".join(p for p in partial.pieces if p is not None)
        partial.pieces = []
        if len(payload) != header.total_bytes:
            self._remember(key, "corrupt")
            refs = tuple(partial.refs)
            return GivenUp("corrupt", header.uuid, key[0], key[1], refs, header.count, header.count)
        first = partial.first
        assert first is not None
        attributes = {
            name: value
            for name, value in first.attributes.items()
            if not name.startswith(wire.CHUNK_PREFIX)
        }
        return ChunkedMessage(
            partition=first.partition,
            offset=first.offset,
            payload=payload,
            # A keyless message's chunks carry its uuid as their key (one partition).
            key=None if first.key == header.uuid else first.key,
            attributes=attributes,
            publish_time_ms=first.publish_time_ms,
            producer=first.producer,
            redelivery_count=partial.redelivery_count,
            schema_id=first.schema_id,
            schema_version=first.schema_version,
            _consumer=first._consumer,
            chunks=tuple(partial.refs),
        )

    def _superseded(self, key: _PartialKey, offset: int) -> list[GivenUp]:
        """Partials of the same producer and partition that a first delivery of another
        message's chunk, later in the log, shows will never complete."""
        partition, producer, uuid = key
        stale = [
            other
            for other, partial in self._partials.items()
            if other[0] == partition
            and other[1] == producer
            and other[2] != uuid
            and partial.last_offset < offset
        ]
        return [self._give_up(other, "missing_chunk") for other in stale]

    def _make_room(self, total_bytes: int) -> list[GivenUp]:
        given_up = []
        while self._partials and (
            self.held_bytes + total_bytes > self.bytes_max
            or len(self._partials) >= self.partials_max
        ):
            given_up.append(self._give_up(next(iter(self._partials)), "evicted"))
        return given_up

    def _give_up(self, key: _PartialKey, reason: GiveUpReason) -> GivenUp:
        partial = self._partials.pop(key)
        self.held_bytes -= partial.header.total_bytes
        self._remember(key, reason)
        return GivenUp(
            reason,
            key[2],
            key[0],
            key[1],
            tuple(partial.refs),
            partial.received,
            partial.header.count,
        )

    def _stray(
        self,
        key: _PartialKey,
        header: wire.ChunkHeader,
        message: ReceivedMessage,
        reason: GiveUpReason,
        *,
        first: bool = False,
    ) -> GivenUp:
        if first:
            self._remember(key, reason)
        return GivenUp(
            reason, header.uuid, key[0], key[1], (message.ref,), 1, header.count, first=first
        )

    def _remember(self, key: _PartialKey, reason: GiveUpReason) -> None:
        self._given_up[key] = reason
        self._given_up.move_to_end(key)
        while len(self._given_up) > GIVEN_UP_REMEMBERED:
            self._given_up.popitem(last=False)

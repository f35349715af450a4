"""Which partition each message of a produce goes to, and how a batch is cut into bus
requests. Pure functions, no I/O.

Routing rule (docs/http-api.md): an unpartitioned topic takes every message. A partitioned
topic with ``N`` partitions sends a message with a key to partition
``fnv1a_32(utf8(key)) mod N`` (:mod:`danube.routing`, shared with the SDK's idempotent
producer, which routes its own batches), so one key always lands in one partition and keeps
its order; messages without a key take partitions in turn (round robin), starting where the
previous batch of this instance stopped.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from danube.frame import FRAME_HEADER_BYTES
from danube.routing import partition_for_key
from danube.wire.ingest.protocol import FRAMED_HEAD_BYTES

_U32_MASK = 0xFFFFFFFF
# Each record travels in a produce request framed (danube.wire.ingest.protocol), behind the
# request's head.
RECORD_FRAMING_BYTES = FRAME_HEADER_BYTES
REQUEST_HEAD_BYTES = FRAMED_HEAD_BYTES


class RoundRobin:
    """Hands out partition indexes in turn for messages without a key.

    One counter for the whole instance (not per topic), so its memory stays bounded however
    many topics there are; each topic still sees its partitions in turn.
    """

    def __init__(self, start: int = 0) -> None:
        self._next = start

    def take(self, count: int) -> int:
        """Reserve ``count`` consecutive turns; return the first."""
        first = self._next
        self._next = (first + count) & _U32_MASK  # wraps; any start is as good as another
        return first


def route(keys: Sequence[str | None], partitions: int, robin: RoundRobin) -> list[int]:
    """The partition index of each message, in message order (all 0 when unpartitioned)."""
    if partitions == 0:
        return [0] * len(keys)
    keyless = sum(1 for key in keys if key is None)
    turn = robin.take(keyless) if keyless else 0
    routed: list[int] = []
    for key in keys:
        if key is None:
            routed.append(turn % partitions)
            turn += 1
        else:
            routed.append(partition_for_key(key, partitions))
    return routed


@dataclass(frozen=True, slots=True)
class Chunk:
    """One bus request: the indexes (into the batch) of the records it carries, in order."""

    partition: int
    indexes: list[int]


def group(routed: Sequence[int]) -> dict[int, list[int]]:
    """Message indexes per partition, each list in message order."""
    groups: dict[int, list[int]] = {}
    for index, partition in enumerate(routed):
        groups.setdefault(partition, []).append(index)
    return groups


def split(
    partition: int,
    indexes: Sequence[int],
    sizes: Sequence[int],
    *,
    max_request_bytes: int,
    max_records: int,
    head_bytes: int = REQUEST_HEAD_BYTES,
    framing_bytes: int = RECORD_FRAMING_BYTES,
) -> list[Chunk]:
    """Cut one partition's records into requests of at most ``max_records`` records and
    ``max_request_bytes`` bytes (framing included), keeping their order. ``sizes[i]`` is the
    encoded size of record ``i`` of the batch; a request has a head of ``head_bytes`` and
    each record ``framing_bytes`` around it (the defaults: the request's layout). A record
    too big for any request raises ValueError (the caller checks sizes before)."""
    chunks: list[Chunk] = []
    current: list[int] = []
    used = head_bytes
    for index in indexes:
        size = sizes[index] + framing_bytes
        if head_bytes + size > max_request_bytes:
            raise ValueError(f"record {index} of {sizes[index]} bytes fits in no request")
        if current and (len(current) >= max_records or used + size > max_request_bytes):
            chunks.append(Chunk(partition, current))
            current, used = [], head_bytes
        current.append(index)
        used += size
    if current:
        chunks.append(Chunk(partition, current))
    return chunks

"""The messages of one produce as the bus requests to ingest carry them (:class:`Batch`):
encoded records sent size-prefixed (the JSON and gRPC paths) or produced frames passed on as
a binary body brought them (danube.frame.produce); and the checks a binary body's frames take
before they are sent. Pure, no I/O."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, overload

from danube.discovery.errors import TooLargeError
from danube.discovery.routing import RECORD_FRAMING_BYTES, REQUEST_HEAD_BYTES
from danube.discovery.schema_gate import Stamp
from danube.frame import FRAME_HEADER_BYTES
from danube.frame.produce import (
    ProducedFrames,
    frame_for_produce,
    scan_frames_for_produce,
    stamp_schema,
)
from danube.wire import codes
from danube.wire.ingest.protocol import (
    FRAMED_HEAD_BYTES,
    encode_framed_produce_request,
    encode_produce_request,
)


def check_payload_sizes(sizes: Sequence[int], limit: int) -> None:
    """413 ``payload_too_large`` naming the first of the largest payloads over ``limit``."""
    biggest = max(sizes)
    if biggest > limit:
        index = sizes.index(biggest)
        raise TooLargeError(
            f"messages[{index}].payload is {biggest} bytes, over the limit of {limit}",
            code=codes.PAYLOAD_TOO_LARGE,
            limit=limit,
        )


class LazyPayloads(Sequence[bytes]):
    """The payloads of produced frames, each copied out only when asked for: the schema gate
    reads them for a topic with a schema only, and most topics have none."""

    def __init__(self, frames: ProducedFrames) -> None:
        self._frames = frames

    def __len__(self) -> int:
        return len(self._frames)

    @overload
    def __getitem__(self, index: int) -> bytes: ...
    @overload
    def __getitem__(self, index: slice) -> Sequence[bytes]: ...
    def __getitem__(self, index: int | slice) -> bytes | Sequence[bytes]:
        if isinstance(index, slice):
            return [bytes(self._frames.payload(i)) for i in range(len(self))[index]]
        if not -len(self) <= index < len(self):
            raise IndexError(index)
        return bytes(self._frames.payload(index % len(self)))


def stamped_frames(frames: ProducedFrames, stamp: Stamp) -> ProducedFrames:
    """``frames`` with every record stamped with the schema it was checked against (a copy:
    the only path on which a binary body's records are written anew)."""
    body = b"".join(
        frame_for_produce(stamp_schema(frames.record(i), stamp.schema_id, stamp.version))
        for i in range(len(frames))
    )
    return scan_frames_for_produce(body, max_count=len(frames), stamped=True)


class Batch(Protocol):
    """The messages of one produce as the bus requests to ingest carry them."""

    @property
    def sizes(self) -> Sequence[int]:
        """Each message's encoded record size, in message order."""

    @property
    def head_bytes(self) -> int:
        """The bytes of a request before its first record."""

    @property
    def framing_bytes(self) -> int:
        """The bytes each record takes around it in a request."""

    def request(self, indexes: Sequence[int]) -> bytes:
        """The request body carrying messages ``indexes``, in that order."""


class RecordsBatch:
    """Encoded records, sent size-prefixed (the JSON and gRPC paths encode them here)."""

    head_bytes = REQUEST_HEAD_BYTES
    framing_bytes = RECORD_FRAMING_BYTES

    def __init__(self, records: Sequence[bytes]) -> None:
        self.records = records
        self.sizes = [len(r) for r in records]

    def request(self, indexes: Sequence[int]) -> bytes:
        return encode_produce_request([self.records[i] for i in indexes])


class FramesBatch:
    """Produced frames (the binary body), passed on as they came: a run of consecutive
    messages (all of them, for a topic of one partition) is one slice of the body."""

    head_bytes = FRAMED_HEAD_BYTES
    framing_bytes = FRAME_HEADER_BYTES

    def __init__(self, frames: ProducedFrames) -> None:
        self.frames = frames
        starts, ends = frames.starts, frames.ends
        self.sizes = [end - start for start, end in zip(starts, ends, strict=True)]

    def request(self, indexes: Sequence[int]) -> bytes:
        frames = self.frames
        first, last = indexes[0], indexes[-1]
        if last - first + 1 == len(indexes):  # consecutive: one slice
            run = frames.body[frames.starts[first] - FRAME_HEADER_BYTES : frames.ends[last]]
            return encode_framed_produce_request(len(indexes), [run])
        return encode_framed_produce_request(len(indexes), frames.frames(indexes))

"""The messages of one produce as the bus requests to ingest carry them (:class:`Batch`):
frames of offset 0 (danube.frame.produce), framed here from encoded records (the JSON and
gRPC paths) or passed on as a binary body brought them, stamped with their schema when their
topic has one. Pure, no I/O. (The checks admission makes of the payloads are
danube.admission.payloads'.)"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from danube.discovery.produce.routing import RECORD_FRAMING_BYTES, REQUEST_HEAD_BYTES
from danube.frame import FRAME_HEADER_BYTES
from danube.frame.produce import ProducedFrames
from danube.wire.ingest.protocol import encode_framed_produce_request, encode_produce_request


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
    """Encoded records, framed as they go (the JSON and gRPC paths encode them here)."""

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

    head_bytes = REQUEST_HEAD_BYTES
    framing_bytes = RECORD_FRAMING_BYTES

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

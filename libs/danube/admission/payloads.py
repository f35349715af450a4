"""The payloads of a produce as admission reads them: each one's size against a limit, and a
binary body's payloads copied out only when a schema check asks. Pure, no I/O."""

from __future__ import annotations

from collections.abc import Sequence
from typing import overload

from danube.errors import TooLargeError
from danube.frame.produce import (
    ProducedFrames,
    frame_for_produce,
    scan_frames_for_produce,
    stamp_schema,
)
from danube.wire import codes


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


def stamped_frames(frames: ProducedFrames, schema_id: int, version: int) -> ProducedFrames:
    """``frames`` with every record stamped with the schema it was checked against (its id
    and version: admission's stamp; a copy: the only path on which a binary body's records
    are written anew)."""
    body = b"".join(
        frame_for_produce(stamp_schema(frames.record(i), schema_id, version))
        for i in range(len(frames))
    )
    return scan_frames_for_produce(body, max_count=len(frames), stamped=True)

"""CPU cost per message of building one cloud fetch reply, without I/O or the bus: one object
of 7 000 frames (records of 100 B payload) scanned from its first offset and its reply built,
the way the cloud reader does now (``ObjectScan.whole_frames``, the frames joined as they lie
in the object) and the way it did before (``ObjectScan.frames``, each payload framed again
with a new CRC). Best of 7 repeats. Run::

    .venv/bin/python tests/bench/bench_cloud_reply.py
"""

from __future__ import annotations

import timeit

from danube.frame import Record, append_frame, encode_frame, encode_record
from danube.storage import ObjectDescriptor, ObjectScan, SparseIndexBuilder, object_key
from danube.wire.ingest import protocol

FRAMES = 7000


def _object() -> tuple[bytes, ObjectDescriptor]:
    record = encode_record(Record(payload=b"x" * 100, publish_time_ms=1, producer="b"))
    body, builder = bytearray(), SparseIndexBuilder()
    for offset in range(FRAMES):
        position = len(body)
        append_frame(body, offset, record)
        builder.add(offset, position, len(body) - position)
    key = object_key("root", "ns", "t", 0, FRAMES - 1)
    return bytes(body), ObjectDescriptor.from_builder(key, builder, created_ms=1)


BODY, DESCRIPTOR = _object()


def framed_again() -> bytes:
    """Before: payload views from the scan, each framed again for the reply."""
    scan = ObjectScan(DESCRIPTOR, 0)
    scan.feed(BODY)
    frames = [(f.offset, encode_frame(f.offset, f.payload)) for f in scan.frames()]
    return protocol.encode_fetch_reply(protocol.FetchStatus.OK, 0, FRAMES, frames)


def whole() -> bytes:
    """Now: the frames whole, as they lie in the object."""
    scan = ObjectScan(DESCRIPTOR, 0)
    scan.feed(BODY)
    frames = list(scan.whole_frames())
    return protocol.encode_fetch_reply(protocol.FetchStatus.OK, 0, FRAMES, frames)


def main() -> None:
    assert framed_again() == whole()  # the same reply bytes either way
    for build in (framed_again, whole):
        best_s = min(timeit.repeat(build, number=5, repeat=7)) / 5
        print(f"{build.__name__:>12}: {best_s / FRAMES * 1e9:,.0f} ns per message")


if __name__ == "__main__":
    main()

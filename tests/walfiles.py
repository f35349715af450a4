"""Reading a WAL segment file as it lies on disk, for tests that look under the services.

An open segment's file goes on in zeros past its last frame (allocated ahead: docs/wal.md,
"Allocating ahead"), and a writer killed mid-write leaves a torn frame: both are where the
frames stop, as WAL recovery sees them (it cuts the file there at the next open)."""

from __future__ import annotations

from pathlib import Path

from danube.frame import Frame, decode_frames, scan_frames


def frames_end(data: bytes) -> int:
    """Where the good frames of a segment file's bytes end."""
    return scan_frames(data).good_end


def segment_frames(path: Path) -> list[Frame]:
    """The frames of a segment file up to its first bad spot (zeros, a torn frame)."""
    data = path.read_bytes()
    frames, _ = decode_frames(data[: frames_end(data)])
    return frames

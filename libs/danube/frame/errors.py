"""Errors of ``danube.frame``: bad frames and bad records, on the way in and on the way out.

::

    DanubeError
    └── FrameError                      "frame_error": an invalid argument (offset out of range)
        ├── CorruptFrameError           "corrupt_frame": position, offset, reason  (decode side)
        ├── TruncatedFramesError        "truncated_frames": position, reason       (decode side)
        ├── FrameTooLargeError          "frame_too_large": size_bytes, limit_bytes (encode side)
        ├── CorruptRecordError          "corrupt_record": reason                   (decode side)
        │   ├── UnsupportedRecordVersionError  "unsupported_record_version": version
        │   └── DecompressedTooLargeError      "payload_too_large": size_bytes, limit_bytes
        └── InvalidRecordError          "invalid_record": field, reason            (encode side)

Decode-side errors mean the bytes are bad and cannot get better by retrying; encode-side errors
mean the caller's input breaks a limit. None of them is retriable.
"""

from __future__ import annotations

from danube.errors import DanubeError, ErrorKind


class FrameError(DanubeError):
    """Root of the frame and record errors; raised as is for an invalid argument."""

    code = "frame_error"


class CorruptFrameError(FrameError):
    """A frame failed its CRC, or its header announced a length beyond the limit.

    ``position`` is the byte position of the frame's header in the stream being decoded;
    ``offset`` is the message offset read from that header (``None`` if no header was read),
    which may itself be garbage since the header is what failed.
    """

    code = "corrupt_frame"

    def __init__(self, *, position: int, offset: int | None, reason: str) -> None:
        where = f"at byte {position}" + ("" if offset is None else f" (header offset {offset})")
        super().__init__(f"corrupt frame {where}: {reason}")
        self.position = position
        self.offset = offset
        self.reason = reason


class TruncatedFramesError(FrameError):
    """A body of frames that must be whole (a produce body) ends inside a frame, or is empty.

    ``position`` is where the incomplete frame starts."""

    code = "truncated_frames"

    def __init__(self, *, position: int, reason: str) -> None:
        super().__init__(f"truncated frames at byte {position}: {reason}")
        self.position = position
        self.reason = reason


class FrameTooLargeError(FrameError):
    """A payload to be framed is larger than the frame limit."""

    code = "frame_too_large"
    kind = ErrorKind.TOO_LARGE

    def __init__(self, *, size_bytes: int, limit_bytes: int) -> None:
        super().__init__(f"frame payload of {size_bytes} bytes exceeds the limit of {limit_bytes}")
        self.size_bytes = size_bytes
        self.limit_bytes = limit_bytes


class CorruptRecordError(FrameError):
    """Record bytes that do not decode: truncated, garbled, over a limit, or trailing garbage."""

    code = "corrupt_record"

    def __init__(self, reason: str) -> None:
        super().__init__(f"corrupt record: {reason}")
        self.reason = reason


class UnsupportedRecordVersionError(CorruptRecordError):
    """A record whose format version this reader does not know (written by a newer writer?)."""

    code = "unsupported_record_version"

    def __init__(self, version: int) -> None:
        super().__init__(f"unsupported record format version {version}")
        self.version = version


class DecompressedTooLargeError(CorruptRecordError):
    """A compressed payload that states a decompressed size over the reader's bound: refused
    before anything is inflated (a zip bomb, or a message over the producer's limit)."""

    code = "payload_too_large"
    kind = ErrorKind.TOO_LARGE

    def __init__(self, *, size_bytes: int, limit_bytes: int) -> None:
        super().__init__(
            f"a compressed payload of {size_bytes} bytes decompressed, over {limit_bytes}"
        )
        self.size_bytes = size_bytes
        self.limit_bytes = limit_bytes


class InvalidRecordError(FrameError):
    """A record that cannot be encoded: a field over its limit, out of range or of a wrong type."""

    code = "invalid_record"
    kind = ErrorKind.INVALID

    def __init__(self, field: str, reason: str) -> None:
        super().__init__(f"invalid record field {field!r}: {reason}")
        self.field = field
        self.reason = reason

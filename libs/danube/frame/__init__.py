"""Binary formats shared by every service and by Spark: frames and the records inside them.

A frame (``[u64 offset][u32 len][u32 crc32c][payload]``) is the unit of the WAL and of object
storage; its payload is one encoded :class:`Record`. docs/formats.md describes both layouts.
"""

from danube.frame.codec import (
    FRAME_HEADER_BYTES,
    MAX_FRAME_PAYLOAD_BYTES,
    Frame,
    FrameDecoder,
    FrameScan,
    RawFrame,
    append_frame,
    decode_frames,
    encode_frame,
    scan_frames,
    verify_frame,
    walk_frames,
)
from danube.frame.errors import (
    CorruptFrameError,
    CorruptRecordError,
    FrameError,
    FrameTooLargeError,
    InvalidRecordError,
    TruncatedFramesError,
    UnsupportedRecordVersionError,
)
from danube.frame.record import (
    MAX_ATTRIBUTE_NAME_BYTES,
    MAX_ATTRIBUTE_VALUE_BYTES,
    MAX_ATTRIBUTES,
    MAX_KEY_BYTES,
    MAX_PRODUCER_NAME_BYTES,
    RECORD_HEADER_BYTES,
    RECORD_VERSION,
    Record,
    RecordFields,
    decode_record,
    decode_record_fields,
    encode_record,
    record_publish_time_ms,
)

__all__ = [
    "FRAME_HEADER_BYTES",
    "MAX_ATTRIBUTES",
    "MAX_ATTRIBUTE_NAME_BYTES",
    "MAX_ATTRIBUTE_VALUE_BYTES",
    "MAX_FRAME_PAYLOAD_BYTES",
    "MAX_KEY_BYTES",
    "MAX_PRODUCER_NAME_BYTES",
    "RECORD_HEADER_BYTES",
    "RECORD_VERSION",
    "CorruptFrameError",
    "CorruptRecordError",
    "Frame",
    "FrameDecoder",
    "FrameError",
    "FrameScan",
    "FrameTooLargeError",
    "InvalidRecordError",
    "RawFrame",
    "Record",
    "RecordFields",
    "TruncatedFramesError",
    "UnsupportedRecordVersionError",
    "append_frame",
    "decode_frames",
    "decode_record",
    "decode_record_fields",
    "encode_frame",
    "encode_record",
    "record_publish_time_ms",
    "scan_frames",
    "verify_frame",
    "walk_frames",
]

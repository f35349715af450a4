"""Payload compression: the codecs a record's payload may be stored in (docs/formats.md,
"Compressed payloads").

A record names its payload's codec in two bits of its flags (:mod:`danube.frame.record`); the
payload bytes are then the codec's form of the message, and readers hand out the message
itself. The forms, so that any language can write and read them::

    codec 1  zstd  one Zstandard frame (RFC 8878) that states its content size
                   (Frame_Content_Size), no dictionary, nothing after it
    codec 2  lz4   [u32 little-endian uncompressed size][one LZ4 block]
                   (the LZ4 block format; python-lz4's ``store_size=True``)

Each form states the size of the message it holds, so a reader checks that size against its
bound before it allocates or inflates anything, and a payload that inflates to anything else
is corrupt: a zip bomb costs the reader its bound, never more.

Compression is per record (one message, one payload): offsets, acks, keys, sequences and
every hop of the read path stay what they are (docs/client.md, "Compression", says why and
what it gives up).
"""

from __future__ import annotations

import struct
import threading
from collections.abc import Mapping
from typing import Final, Literal

import lz4.block
import zstandard

from danube.frame.errors import CorruptRecordError, DecompressedTooLargeError

Compression = Literal["zstd", "lz4"]
"""A codec by name, as the SDK, the CLI and the docs spell it."""

CODEC_NONE: Final = 0
CODEC_ZSTD: Final = 1
CODEC_LZ4: Final = 2
CODEC_IDS: Final[Mapping[str, int]] = {"zstd": CODEC_ZSTD, "lz4": CODEC_LZ4}
CODEC_NAMES: Final[Mapping[int, Compression]] = {CODEC_ZSTD: "zstd", CODEC_LZ4: "lz4"}

ZSTD_LEVEL: Final = 3
"""zstd's default level: on 1 KiB JSON lines, within a few percent of level 9's ratio at a
fraction of its time (tests/bench/bench_compression.py)."""

_LZ4_SIZE = struct.Struct("<I")  # the uncompressed size before an LZ4 block (not a frame header)
_U32_MAX = 2**32 - 1

# zstandard's compressor and decompressor contexts may not be used by two threads at once
# (Spark's Python workers and the SDK's sync client run threads): one of each per thread,
# made on first use and reused, since making one costs more than compressing 1 KiB.
_contexts = threading.local()


def _zstd_compressor() -> zstandard.ZstdCompressor:
    found: zstandard.ZstdCompressor | None = getattr(_contexts, "compressor", None)
    if found is None:
        found = _contexts.compressor = zstandard.ZstdCompressor(
            level=ZSTD_LEVEL, write_content_size=True, write_checksum=False
        )
    return found


def _zstd_decompressor() -> zstandard.ZstdDecompressor:
    found: zstandard.ZstdDecompressor | None = getattr(_contexts, "decompressor", None)
    if found is None:
        found = _contexts.decompressor = zstandard.ZstdDecompressor()
    return found


def codec_id(compression: str | None) -> int:
    """The codec id of ``compression`` (None: no codec); ValueError for an unknown name."""
    if compression is None:
        return CODEC_NONE
    found = CODEC_IDS.get(compression)
    if found is None:
        raise ValueError(f"compression must be one of {sorted(CODEC_IDS)} or None")
    return found


def compress(codec: int, payload: bytes | bytearray | memoryview) -> bytes:
    """``payload`` in ``codec``'s form (always: see :func:`compress_if_smaller`)."""
    if codec == CODEC_ZSTD:
        return _zstd_compressor().compress(payload)
    if codec == CODEC_LZ4:
        size = memoryview(payload).nbytes
        if size > _U32_MAX:
            raise ValueError(f"{size} bytes: over what LZ4's size field holds")
        packed: bytes = lz4.block.compress(payload, store_size=True)
        return packed
    raise ValueError(f"no codec {codec}")


def compress_if_smaller(codec: int, payload: bytes) -> bytes | None:
    """``payload`` in ``codec``'s form, or None when that form is no smaller (short or
    incompressible payloads: the producer then stores the message as is, flag clear)."""
    if codec == CODEC_NONE:
        return None
    packed = compress(codec, payload)
    return packed if len(packed) < len(payload) else None


def decompressed_size(codec: int, data: bytes | memoryview) -> int:
    """The message size that ``data`` (a payload in ``codec``'s form) states, read from its
    header alone. Raises :class:`CorruptRecordError` when it states none."""
    if codec == CODEC_ZSTD:
        try:
            size = zstandard.frame_content_size(data)
        except zstandard.ZstdError as exc:
            raise CorruptRecordError(f"zstd payload: {exc}") from None
        if size < 0:  # -1: the frame does not state it
            raise CorruptRecordError("zstd payload: the frame does not state its content size")
        return int(size)
    if codec == CODEC_LZ4:
        if len(data) < _LZ4_SIZE.size:
            raise CorruptRecordError(f"lz4 payload of {len(data)} bytes: no size")
        (size,) = _LZ4_SIZE.unpack_from(data, 0)
        return int(size)
    raise CorruptRecordError(f"unknown compression codec {codec}")


def decompress(codec: int, data: bytes | memoryview, *, size_bytes_max: int) -> bytes:
    """The message a payload in ``codec``'s form holds, at most ``size_bytes_max`` bytes.

    Raises :class:`DecompressedTooLargeError` (a :class:`CorruptRecordError`) for a stated
    size over the bound, checked before anything is inflated, and
    :class:`CorruptRecordError` for a payload that does not inflate to exactly its stated
    size or has bytes after its compressed form."""
    size = decompressed_size(codec, data)
    out: bytes
    if size > size_bytes_max:
        raise DecompressedTooLargeError(size_bytes=size, limit_bytes=size_bytes_max)
    try:
        if codec == CODEC_ZSTD:
            out = _zstd_decompressor().decompress(
                data, max_output_size=size, read_across_frames=False, allow_extra_data=False
            )
        else:
            out = lz4.block.decompress(data)
    except (zstandard.ZstdError, lz4.block.LZ4BlockError) as exc:
        raise CorruptRecordError(f"{CODEC_NAMES[codec]} payload: {exc}") from None
    if len(out) != size:  # both libraries check it; a reader checks what it reads anyway
        raise CorruptRecordError(
            f"{CODEC_NAMES[codec]} payload inflated to {len(out)} bytes, not {size}"
        )
    return out

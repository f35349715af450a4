"""Which partition a keyed message goes to: the one rule that discovery (routing a produce)
and the SDK (an idempotent producer routing its own batches) share, so a key lands in the
same partition whoever routes it.

The rule (docs/http-api.md, "Routing"): a message with a key goes to partition
``fnv1a_32(utf8(key)) mod N`` of a topic with ``N`` partitions, the 32-bit FNV-1a hash
(offset basis 0x811C9DC5, prime 0x01000193, xor then multiply, over the key's UTF-8 bytes).
"""

from __future__ import annotations

FNV32_OFFSET_BASIS = 0x811C9DC5
FNV32_PRIME = 0x01000193
_U32_MASK = 0xFFFFFFFF


def fnv1a_32(data: bytes) -> int:
    """The 32-bit FNV-1a hash of ``data``."""
    value = FNV32_OFFSET_BASIS
    for byte in data:
        value = ((value ^ byte) * FNV32_PRIME) & _U32_MASK
    return value


def partition_for_key(key: str, partitions: int) -> int:
    """The partition (``0..partitions-1``) a keyed message goes to."""
    return partition_for_raw_key(key.encode("utf-8"), partitions)


def partition_for_raw_key(key: bytes, partitions: int) -> int:
    """:func:`partition_for_key` of a key already UTF-8 (as a record carries it)."""
    if partitions < 1:
        raise ValueError(f"a partitioned topic has at least 1 partition, not {partitions}")
    return fnv1a_32(key) % partitions

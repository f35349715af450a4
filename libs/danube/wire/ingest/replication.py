"""Binary bodies of replication between the replicas of a partition (docs/replication.md):
the follower's fetch from the leader, and a replica's read of another's copy. All integers
little-endian; frames travel as the WAL holds them (danube.frame)::

    repl fetch request  [u64 leader_epoch][u64 from_offset][u32 max_bytes][u32 wait_ms]
                        [u8 n][n bytes follower node id][u8 flags]
                        flags bit 0: the follower's copy holds a damaged range it has not
                        repaired yet (it may not be handed leadership); the flags byte may
                        be absent (0)
    repl fetch reply    [u8 status][u64 leader_epoch][u64 wal_start][u64 high_watermark]
                        [u64 leader_end] then frames from from_offset (maybe none)
                        status 0: ok; 1: from_offset is below wal_start (start there);
                        2: not the leader of that epoch; 3: from_offset is past the leader's
                        end (the follower diverged: find the divergence again)
    repl epochs request [u64 leader_epoch]
    repl epochs reply   JSON {"epoch": E, "end": leader_end, "epochs": [[epoch, start], ...]}
    repl read request   [u64 from_offset][u64 end_offset][u32 max_bytes]   to one replica
    repl read reply     a fetch reply (status 0, 1 or 3) of that replica's own copy, frames
                        from from_offset, none at or past end_offset or the replica's
                        committed end (what it knows to be below the high watermark)
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass
from enum import IntEnum

from danube.wire.errors import BadRequestError

_REPL_FETCH = struct.Struct("<QQIIB")
_REPL_REPLY_HEAD = struct.Struct("<BQQQQ")
_REPL_READ = struct.Struct("<QQI")
_REPL_DAMAGED = 0x01  # repl fetch flags: the follower's copy is damaged


class ReplStatus(IntEnum):
    """The status of a replication fetch reply."""

    OK = 0
    BELOW_WAL_START = 1
    WRONG_EPOCH = 2
    AHEAD = 3


@dataclass(frozen=True, slots=True)
class ReplFetchRequest:
    leader_epoch: int
    from_offset: int
    max_bytes: int
    wait_ms: int
    follower: str
    damaged: bool = False  # the follower's copy holds a damaged range not repaired yet

    def encode(self) -> bytes:
        node = self.follower.encode()
        head = _REPL_FETCH.pack(
            self.leader_epoch, self.from_offset, self.max_bytes, self.wait_ms, len(node)
        )
        return head + node + bytes([_REPL_DAMAGED if self.damaged else 0])

    @classmethod
    def decode(cls, body: bytes) -> ReplFetchRequest:
        if len(body) < _REPL_FETCH.size:
            raise BadRequestError(f"replication fetch request of {len(body)} bytes")
        epoch, from_offset, max_bytes, wait_ms, n = _REPL_FETCH.unpack_from(body, 0)
        end = _REPL_FETCH.size + n
        if len(body) not in (end, end + 1) or n == 0 or max_bytes < 1:
            raise BadRequestError("replication fetch request: bad node id or limits")
        node = bytes(body[_REPL_FETCH.size : end]).decode("utf-8", errors="strict")
        damaged = len(body) > end and bool(body[end] & _REPL_DAMAGED)
        return cls(int(epoch), int(from_offset), int(max_bytes), int(wait_ms), node, damaged)


@dataclass(frozen=True, slots=True)
class ReplReadRequest:
    """A read of ``[from_offset, end_offset)`` of one replica's copy, at most ``max_bytes``
    of payload (the first frame always)."""

    from_offset: int
    end_offset: int
    max_bytes: int

    def encode(self) -> bytes:
        return _REPL_READ.pack(self.from_offset, self.end_offset, self.max_bytes)

    @classmethod
    def decode(cls, body: bytes) -> ReplReadRequest:
        if len(body) != _REPL_READ.size:
            raise BadRequestError(f"replica read request of {len(body)} bytes")
        from_offset, end_offset, max_bytes = _REPL_READ.unpack(body)
        if not from_offset < end_offset or max_bytes < 1:
            raise BadRequestError("replica read request: an empty range or no bytes")
        return cls(int(from_offset), int(end_offset), int(max_bytes))


@dataclass(frozen=True, slots=True)
class ReplFetchReply:
    status: ReplStatus
    leader_epoch: int
    wal_start: int
    high_watermark: int
    leader_end: int
    frames: memoryview


def encode_repl_reply(
    status: ReplStatus,
    leader_epoch: int,
    wal_start: int,
    high_watermark: int,
    leader_end: int,
    frames: Sequence[tuple[int, bytes | memoryview]] = (),
) -> bytes:
    """The reply head followed by the ``(offset, whole frame)`` frames as the WAL holds them."""
    head = _REPL_REPLY_HEAD.pack(status, leader_epoch, wal_start, high_watermark, leader_end)
    return b"".join([head] + [f for _, f in frames])


def decode_repl_reply(body: bytes) -> ReplFetchReply:
    """The head of a replication fetch reply; decode its frames with danube.frame."""
    if len(body) < _REPL_REPLY_HEAD.size:
        raise BadRequestError(f"replication fetch reply of {len(body)} bytes")
    status, epoch, start, hw, end = _REPL_REPLY_HEAD.unpack_from(body, 0)
    return ReplFetchReply(
        ReplStatus(status),
        int(epoch),
        int(start),
        int(hw),
        int(end),
        memoryview(body)[_REPL_REPLY_HEAD.size :],
    )

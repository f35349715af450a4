"""Control bodies of the ingest bus API (docs/bus.md lists the subjects): the stats request
and the segments a stats reply lists, and the leader probe's reply. The data path's bodies
(produce, fetch, live, drop, time) are :mod:`danube.wire.ingest.protocol`'s.

Control replies (claim, stats) are small JSON documents. A stats request is empty, or
``[u32 max_segments]`` to also list the oldest segments (for retention)::

    stats request     empty | [u32 max_segments]   1..STATS_SEGMENTS_MAX

A leader probe (``ctl.probe``, answered by every ingest node from etcd) is empty; its reply::

    probe reply       JSON {"leader": node_id, "epoch": E, "since_ms": T} | {"leader": null}
                      (or the error partition_unavailable: no leader can come; T: when
                      the leader claimed the epoch, its wall clock, Unix ms; optional)
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, fields

import orjson

from danube.wire.errors import BadRequestError

_U32 = struct.Struct("<I")

# A listed segment is about 110 bytes of JSON: 4096 of them stay far below NATS max_payload.
STATS_SEGMENTS_MAX = 4096


def encode_probe_reply(
    node_id: str | None, epoch: int | None = None, since_ms: int | None = None
) -> bytes:
    """A probe's answer: who leads (``node_id`` None: nobody now, one may come), and since
    when (its claim's wall clock)."""
    if node_id is None:
        return orjson.dumps({"leader": None})
    doc: dict[str, object] = {"leader": node_id, "epoch": epoch}
    if since_ms is not None:
        doc["since_ms"] = since_ms
    return orjson.dumps(doc)


def decode_probe_reply(body: bytes) -> tuple[str | None, int | None, int | None]:
    """``(leader node id, its epoch, since when)`` of a probe's answer, ``(None, None,
    None)`` for none (``since`` None too from a node that does not say); BadRequestError
    when it is not one."""
    try:
        doc = orjson.loads(body)
        node_id, epoch, since_ms = doc["leader"], doc.get("epoch"), doc.get("since_ms")
    except (orjson.JSONDecodeError, KeyError, TypeError, AttributeError) as exc:
        raise BadRequestError(f"bad probe reply: {exc!r}") from exc
    if node_id is None:
        return None, None, None
    if not isinstance(node_id, str) or type(epoch) is not int or epoch < 0:
        raise BadRequestError(f"bad probe reply: leader {node_id!r}, epoch {epoch!r}")
    if since_ms is not None and (type(since_ms) is not int or since_ms < 0):
        raise BadRequestError(f"bad probe reply: since_ms {since_ms!r}")
    return node_id, epoch, since_ms


def encode_stats_request(max_segments: int = 0) -> bytes:
    """An empty body (plain stats), or one that also asks for the oldest segments."""
    return b"" if max_segments == 0 else _U32.pack(max_segments)


def decode_stats_request(body: bytes) -> int:
    """How many of the oldest segments to list (0: none)."""
    if not body:
        return 0
    if len(body) != _U32.size:
        raise BadRequestError(f"stats request of {len(body)} bytes")
    (max_segments,) = _U32.unpack(body)
    if not 1 <= max_segments <= STATS_SEGMENTS_MAX:
        raise BadRequestError(f"max_segments {max_segments} outside 1..{STATS_SEGMENTS_MAX}")
    return int(max_segments)


@dataclass(frozen=True, slots=True)
class SegmentInfo:
    """One segment as retention sees it (``Wal.segment_infos``)."""

    first_offset: int
    next_offset: int | None
    """The offset after its last frame; ``None`` when not known (never for a sealed segment
    with a successor: then it is the successor's first offset)."""
    size_bytes: int
    sealed: bool
    modified_ms: int
    """The file's mtime: when its newest frame was written (ms since the epoch)."""

    def as_dict(self) -> dict[str, int | bool | None]:
        """The fields by name (for JSON stats replies)."""
        return {field.name: getattr(self, field.name) for field in fields(self)}

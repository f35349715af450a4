"""Partition growth, the one rule both doors follow: Danube's gRPC producers grow a topic to
have the partition they name (``at least``), ``PATCH /v1/topics/{ns}/{t}`` with
``{"partitions": N}`` grows it to exactly N. A topic never shrinks (its partitions' data and
cursors would be orphaned) and an unpartitioned topic never becomes partitioned (its data
lives under the topic's own name, which no partition reads).

Keys move when the count grows: a key goes to ``fnv1a_32(key) mod N``
(danube.routing), so a key moves from ``h mod old`` to ``h mod new`` unless the two
are equal (docs/http-api.md, "Growing a topic"). No I/O here: the catalog applies it inside
its compare-and-swap of the topic's config.
"""

from __future__ import annotations

from danube.discovery.errors import BadRequestError, ConflictError
from danube.meta import TopicName
from danube.meta.records import TopicConfig
from danube.names import PARTITIONS_MAX


def grown(config: TopicConfig, topic: TopicName, count: int, *, exact: bool) -> TopicConfig:
    """``config`` with ``count`` partitions (``config`` itself when it has them already).
    With ``exact``, fewer than it has is ConflictError ``partitions_cannot_shrink``; without,
    it is left as it is (``at least``). BadRequestError ``too_many_partitions`` past
    ``PARTITIONS_MAX``; ConflictError ``not_partitioned`` for an unpartitioned topic."""
    if count > PARTITIONS_MAX:
        raise BadRequestError(
            f"{topic} cannot have {count} partitions (at most {PARTITIONS_MAX})",
            code="too_many_partitions",
        )
    if config.partitions == 0:
        raise ConflictError(
            f"topic {topic} is not partitioned: it cannot get {count} partitions "
            "(create a partitioned topic instead)",
            code="not_partitioned",
        )
    if exact and count < config.partitions:
        raise ConflictError(
            f"topic {topic} has {config.partitions} partitions: partitions only grow "
            f"(asked for {count})",
            code="partitions_cannot_shrink",
        )
    if count <= config.partitions:
        return config
    return config.model_copy(update={"partitions": count})


def moved_fraction(hashes: list[int], old: int, new: int) -> float:
    """The fraction of ``hashes`` (FNV-1a 32 of keys) whose partition changes from ``old``
    to ``new`` partitions: what a growth moves, for docs and tests."""
    if not hashes:
        return 0.0
    return sum(1 for h in hashes if h % old != h % new) / len(hashes)

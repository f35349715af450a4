"""Reassignments of a partition's replica set as :class:`Assignment` records: pure, no I/O
(docs/replication.md, "Moving partitions"; the shape is KIP-455's).

Writing the record these functions return (compared on the key's mod revision) starts, changes
or cancels a reassignment; the partition's leader carries it out and completes it
(:func:`completed`). Everything about a reassignment lives in the record, so any process may
resume it after any restart.

- :func:`reassign` asks for ``target``. On top of a reassignment under way, the original set
  stays the one before the first began: ``replicas`` = target first (in its order), then the
  other nodes of the current union; ``adding`` = target - original; ``removing`` = union -
  target (a node that was being added and is no longer wanted is removed: it deletes the
  partial copy it fetched).
- :func:`cancel` is a reassignment back to the original set.
- :func:`check_target` refuses a target the cluster cannot hold (codes below, answered 400
  by discovery's one status map).
"""

from __future__ import annotations

from collections.abc import Collection

from danube.errors import DanubeError, ErrorKind
from danube.meta.records import REPLICAS_MAX, Assignment


class ReassignError(DanubeError):
    """A reassignment that cannot be written. ``code``: ``duplicate_replicas``,
    ``node_not_live``, ``node_drained``, ``factor_mismatch``, ``too_many_replicas`` (the
    request is wrong), ``not_reassigning`` (a cancel with nothing under way)."""

    code = "reassign_refused"
    kind = ErrorKind.INVALID


def check_target(
    target: tuple[str, ...],
    *,
    live: Collection[str],
    drained: Collection[str] = (),
    factor: int,
) -> None:
    """ReassignError unless ``target`` is ``factor`` distinct live, undrained nodes."""
    if len(set(target)) != len(target):
        raise ReassignError(f"replicas must be distinct: {list(target)}", code="duplicate_replicas")
    missing = [n for n in target if n not in live]
    if missing:
        raise ReassignError(
            f"not live ingest nodes: {', '.join(missing)} (live: {', '.join(sorted(live))})",
            code="node_not_live",
        )
    draining = [n for n in target if n in drained]
    if draining:
        raise ReassignError(
            f"drained nodes take no replicas: {', '.join(draining)}", code="node_drained"
        )
    if len(target) != factor:
        raise ReassignError(
            f"the partition has {factor} replicas: give {factor} nodes, not {len(target)} "
            "(a reassignment keeps the replication factor)",
            code="factor_mismatch",
        )


def reassign(
    current: Assignment,
    target: tuple[str, ...],
    *,
    catchup_bytes_s: int | None = None,
    now_ms: int,
) -> Assignment:
    """The record that moves ``current`` to ``target`` (see the module docstring); the
    same record when nothing would change. Only a reorder (same nodes, nothing under way)
    changes the preferred leader and nothing else. ReassignError when the union would hold
    more nodes than a record may name."""
    if not target or len(set(target)) != len(target):
        raise ReassignError(f"replicas must be distinct: {list(target)}", code="duplicate_replicas")
    if len(target) > REPLICAS_MAX:
        raise ReassignError(f"at most {REPLICAS_MAX} replicas", code="too_many_replicas")
    if current.replicas == target and not current.moving:
        return current
    original = current.original
    union = (*target, *(n for n in current.replicas if n not in target))
    adding = tuple(n for n in target if n not in original)
    removing = tuple(n for n in union if n not in target)
    if len(union) > 2 * REPLICAS_MAX or len(removing) > REPLICAS_MAX:
        raise ReassignError(
            f"{len(union)} nodes would hold the partition at once: cancel the reassignment "
            "under way (or wait for it) first",
            code="too_many_replicas",
        )
    if (
        current.moving
        and union == current.replicas
        and adding == current.adding
        and removing == current.removing
        and catchup_bytes_s == current.catchup_bytes_s
    ):
        return current
    return Assignment(
        replicas=union,
        min_insync_replicas=min(current.min_insync_replicas, len(target)),
        assigned_ms=now_ms,
        adding=adding,
        removing=removing,
        retired=tuple(n for n in current.retired if n not in union),
        catchup_bytes_s=catchup_bytes_s,
    )


def cancel(current: Assignment, *, now_ms: int) -> Assignment:
    """The record that goes back to the set before the reassignment under way: nodes being
    added are removed, nodes being removed stay. The preferred leader becomes the first node
    of the original set in the current order (the record does not keep the old order).
    ReassignError ``not_reassigning`` when nothing is under way."""
    if not current.moving:
        raise ReassignError(
            "no reassignment is under way", code="not_reassigning", kind=ErrorKind.CONFLICT
        )
    original = current.original
    if len(original) > REPLICAS_MAX:  # after steps back, the original holds leaving nodes too
        raise ReassignError(
            f"the set before this reassignment has {len(original)} nodes: reassign to the "
            "nodes wanted instead",
            code="too_many_replicas",
        )
    return Assignment(
        replicas=(*original, *current.adding),
        min_insync_replicas=min(current.min_insync_replicas, len(original)),
        assigned_ms=now_ms,
        removing=current.adding,
        retired=current.retired,
        catchup_bytes_s=current.catchup_bytes_s,
    )


def completed(current: Assignment, *, now_ms: int) -> Assignment:
    """The record the leader writes once the target is in sync and it leads from it:
    ``replicas`` = the target, ``retired`` = the nodes that left (they delete their copies)."""
    return Assignment(
        replicas=current.target,
        min_insync_replicas=current.min_insync_replicas,
        assigned_ms=now_ms,
        retired=current.removing,
    )

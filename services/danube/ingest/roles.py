"""What one replica of a partition should do next, from the partition's keys in etcd and
its own state: pure, tested on its own (tests/unit/test_ingest_replication.py).

- not in the replica set any more: **stop**;
- leading epoch E: **keep** while the owner key still names this node with E; **reclaim**
  (write the owner key again, same epoch, under the node's new lease) when the key is gone
  but the state still names this node and E — its lease lapsed in an etcd outage it served
  through; else **demote** (another epoch began: this node must never acknowledge again
  under E);
- following epoch E whose owner key is gone while the state still names E's leader and
  that leader still answers (``leader_heard``): **hold** — keep following; it reclaims
  (bounded by the caller: after a grace period ``leader_heard`` is false and a claim may
  follow);
- another node's owner key exists: **follow** its epoch (or keep following it);
- no live leader: **claim** if this node may lead — it is in the ISR (or the partition never
  had a leader) and its log is whole (it has an epoch history, unless the partition never
  had a leader); else, if the owner key still names an earlier incarnation of this node,
  **delete** it so an eligible replica can claim; else **wait**;
- after an operator's unclean move (``state.restart_at`` set, no leader): **restart** —
  start an empty log at ``restart_at`` and claim — if this node is one of the new set;
- a partition that never had a leader is claimed by its preferred leader (the first
  replica) alone for ``TRANSFER_HOLD_MS`` after its placement, then by any replica;
- during a controlled transfer (the leader deleted its owner key and named
  ``state.transfer_to``): only the named replica claims; the others **wait** until it
  leads, or until the transfer is ``TRANSFER_HOLD_MS`` old (it died: any may claim);
- a replica whose copy holds a damaged range not repaired yet **waits** before it claims
  until the partition has had no leader for ``DAMAGED_CLAIM_HOLD_MS``: an intact in-sync
  replica claims first; a damaged one leads only when none did (it reads around its damage).

A node that is no replica any more and that the last reassignment **retired** (it left a
partition whose new replica set held everything) stops and deletes its copy.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from danube.ingest.leadership import PartitionView
from danube.meta.records import TRANSFER_HOLD_MS, PartitionState

DAMAGED_CLAIM_HOLD_MS = 3000
"""A damaged replica claims only after the partition had no leader this long."""


class Act(Enum):
    STOP = "stop"
    RETIRE = "retire"  # stop and delete the local copy: a reassignment moved it away
    KEEP = "keep"
    DEMOTE = "demote"
    FOLLOW = "follow"
    CLAIM = "claim"
    RESTART = "restart"
    DELETE_STALE_OWNER = "delete_stale_owner"
    WAIT = "wait"
    RECLAIM = "reclaim"  # leading: the owner key again under the new lease, same epoch
    HOLD = "hold"  # following: the leader's owner key lapsed but it serves; it reclaims


@dataclass(frozen=True)
class Decision:
    act: Act
    leader: str | None = None
    epoch: int | None = None


def decide(
    me: str,
    view: PartitionView,
    *,
    leading_epoch: int | None,
    following_epoch: int | None,
    has_history: bool,
    now_ms: int,
    damaged: bool = False,
    leaderless_ms: int = 0,
    leader_heard: bool = False,
) -> Decision:
    """The next step of replica ``me`` (see the module docstring); ``now_ms``: wall time;
    ``damaged``: this copy holds a damaged range not repaired yet; ``leaderless_ms``: how
    long this replica has seen the partition without a leader; ``leader_heard``: the leader
    this replica follows answered it lately."""
    assignment, state, owner = view.assignment, view.state, view.owner
    if assignment is None or me not in assignment.replicas:
        if assignment is not None and me in assignment.retired and leading_epoch is None:
            return Decision(Act.RETIRE)  # (a leader is never retired: it completes moves)
        return Decision(Act.STOP)
    if leading_epoch is not None:
        if owner is not None and (owner.node_id, owner.epoch) == (me, leading_epoch):
            return Decision(Act.KEEP)
        if owner is None and _led_by(state, me, leading_epoch):
            return Decision(Act.RECLAIM)
        return Decision(Act.DEMOTE)
    if owner is not None and owner.node_id != me:
        if following_epoch == owner.epoch:
            return Decision(Act.KEEP, owner.node_id, owner.epoch)
        return Decision(Act.FOLLOW, owner.node_id, owner.epoch)
    if (
        owner is None
        and leader_heard
        and state is not None
        and state.leader != me
        and following_epoch is not None
        and _led_by(state, state.leader, following_epoch)
    ):
        return Decision(Act.HOLD, state.leader, following_epoch)
    if state is not None and state.restart_at is not None:
        # An operator's unclean move: the new replicas start empty; any of them may claim.
        return Decision(Act.RESTART if me in state.isr else Act.WAIT)
    if (
        state is not None
        and state.transfer_to is not None
        and state.transfer_to != me
        and state.transfer_to in assignment.replicas
        and now_ms - (state.transfer_ms or 0) < TRANSFER_HOLD_MS
    ):
        return Decision(Act.WAIT)  # leadership is being handed to another replica
    never_led = state is None
    if (
        never_led
        and me != assignment.preferred
        and now_ms - assignment.assigned_ms < TRANSFER_HOLD_MS
    ):
        return Decision(Act.WAIT)  # a new partition: its preferred leader claims first
    in_sync = never_led or me in state.isr  # type: ignore[union-attr]
    if in_sync and (has_history or never_led):
        if damaged and not never_led and leaderless_ms < DAMAGED_CLAIM_HOLD_MS:
            return Decision(Act.WAIT)  # an intact in-sync replica claims first
        return Decision(Act.CLAIM)
    if owner is not None:
        return Decision(Act.DELETE_STALE_OWNER)
    return Decision(Act.WAIT)


def _led_by(state: PartitionState | None, node: str, epoch: int) -> bool:
    """Whether ``state`` still says ``node`` leads ``epoch``, with no transfer or unclean
    move under way (its owner key lapsed with its lease, nothing else happened)."""
    return (
        state is not None
        and (state.leader, state.leader_epoch) == (node, epoch)
        and state.transfer_to is None
        and state.restart_at is None
    )

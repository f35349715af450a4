"""The leader's view of its followers: how far each has durably, who is in sync, and the
high watermark. Pure logic (time comes in as an argument); the leader does the I/O.

A follower's fetch from offset ``o`` says it holds everything below ``o`` durably (it
fetches only after its previous append was fsynced). The **high watermark** is the end the
whole in-sync set (ISR, leader included) holds: readers never see past it, and a produce is
acknowledged once it is below it. It never moves back.

A follower is **caught up** at the moment of a fetch that reaches the leader's end as the
leader had it at that follower's previous fetch (Kafka's rule: under steady load a follower
is never exactly at the end, yet it keeps up). One that has not been caught up for
``lag_max_s`` should leave the ISR; a replica outside it whose end reached the high
watermark, and the start of the current epoch, may rejoin. The leader writes either change
to etcd first and only then applies it here (:meth:`IsrTracker.set_isr`); a replica an
expansion adds is counted for the high watermark from *before* the write (``pending``: etcd
may hold it whether or not the answer comes back), and stays counted until a write that
leaves it out succeeded. So the set counted for the high watermark always contains every ISR
etcd may hold, which is what a new leader is chosen from: the ISR never shrinks, for the
watermark, without an etcd write (docs/replication.md, "Serving through an etcd outage").
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass


@dataclass
class FollowerView:
    """What the leader knows of one follower."""

    end: int | None = None  # its durable end, from its last fetch (None: not fetched yet)
    caught_up_s: float = 0.0  # when it was last caught up
    fetched_s: float | None = None  # when it last fetched
    leader_end_at_fetch: int = 0  # the leader's end at that fetch
    in_sync_since_s: float | None = None  # when it last entered the ISR (None: outside)
    damaged: bool = False  # its copy holds a damaged range (its last fetch said so)


class IsrTracker:
    """Followers, ISR and high watermark of one partition led by ``leader``."""

    def __init__(
        self,
        leader: str,
        replicas: Iterable[str],
        isr: Iterable[str],
        *,
        lag_max_s: float,
        epoch_start: int,
        high_watermark: int,
        now_s: float,
    ) -> None:
        self.leader = leader
        self.lag_max_s = lag_max_s
        self.epoch_start = epoch_start
        self.high_watermark = high_watermark
        # Every follower gets a full lag_max_s from the start of the term to show up.
        self.followers = {
            node: FollowerView(caught_up_s=now_s) for node in replicas if node != leader
        }
        self.isr: frozenset[str] = frozenset(isr) | {leader}
        # Added by an expansion whose etcd write has not (yet) been seen to succeed.
        self.pending: frozenset[str] = frozenset()
        for node, view in self.followers.items():
            if node in self.isr:
                view.in_sync_since_s = now_s
        self.validate()

    def set_replicas(self, replicas: Iterable[str], now_s: float) -> None:
        """The replica set changed (a reassignment): new replicas are followed (outside
        the ISR until they catch up); removed ones are forgotten (:meth:`to_shrink` then
        names them if they are still in the ISR)."""
        wanted = {node for node in replicas if node != self.leader}
        for node in list(self.followers):
            if node not in wanted:
                del self.followers[node]
        for node in wanted - self.followers.keys():
            self.followers[node] = FollowerView(caught_up_s=now_s)

    def ready_to_lead(self, node: str, now_s: float, *, settle_s: float) -> bool:
        """Whether follower ``node`` may be handed leadership: in the ISR for ``settle_s``
        at least, and fetching now (not merely not yet removed)."""
        view = self.followers.get(node)
        if view is None or node not in self.isr or view.in_sync_since_s is None:
            return False
        if view.damaged:
            return False  # not before it repaired its copy
        recent_s = max(1.0, self.lag_max_s / 2)
        return (
            now_s - view.in_sync_since_s >= settle_s
            and view.fetched_s is not None
            and now_s - view.fetched_s <= recent_s
            and now_s - view.caught_up_s <= recent_s
        )

    def first_ready(self, order: Iterable[str], now_s: float) -> str | None:
        """The first follower of ``order`` that may be handed leadership now (in sync,
        fetching, its copy not damaged), if any."""
        for node in dict.fromkeys(order):
            if node != self.leader and self.ready_to_lead(node, now_s, settle_s=0.0):
                return node
        return None

    def on_fetch(
        self, node: str, fetch_offset: int, leader_end: int, now_s: float, *, damaged: bool = False
    ) -> None:
        """Follower ``node`` fetched from ``fetch_offset`` while the leader's end was
        ``leader_end``; ``damaged``: it said its copy holds a range not repaired yet."""
        view = self.followers.get(node)
        if view is None:
            return  # not a replica (an operator moved it away): ignore its fetches
        if fetch_offset >= leader_end:
            view.caught_up_s = now_s
        elif view.fetched_s is not None and fetch_offset >= view.leader_end_at_fetch:
            view.caught_up_s = max(view.caught_up_s, view.fetched_s)
        view.end = fetch_offset
        view.damaged = damaged
        view.fetched_s = now_s
        view.leader_end_at_fetch = leader_end

    def advance(self, leader_end: int) -> int:
        """Recompute the high watermark from the leader's durable end; return it."""
        ends = [leader_end]
        for node in self.counted:
            if node != self.leader:
                end = self.followers[node].end if node in self.followers else None
                ends.append(self.high_watermark if end is None else end)
        self.high_watermark = max(self.high_watermark, min(ends))
        return self.high_watermark

    @property
    def counted(self) -> frozenset[str]:
        """The replicas the high watermark waits for: the ISR and any pending addition."""
        return self.isr | self.pending

    def expanding(self, isr: Iterable[str]) -> None:
        """An ISR write that adds replicas is about to go out: count them from now on."""
        self.pending = self.pending | (frozenset(isr) - self.isr)
        self.validate()

    def confirmed(self, now_s: float, *, within_s: float) -> bool:
        """Whether every counted follower fetched at this epoch within ``within_s``: a
        leader without its lease acknowledges only while this holds (none follow a newer
        epoch yet, or they would not fetch here)."""
        for node in self.counted:
            if node == self.leader:
                continue
            view = self.followers.get(node)
            if view is None or view.fetched_s is None or now_s - view.fetched_s > within_s:
                return False
        return True

    def to_shrink(self, now_s: float) -> frozenset[str]:
        """ISR followers (and pending additions) not caught up for longer than
        ``lag_max_s``."""
        return frozenset(
            node
            for node in self.counted
            if node != self.leader
            and (
                node not in self.followers
                or now_s - self.followers[node].caught_up_s > self.lag_max_s
            )
        )

    def to_expand(self) -> frozenset[str]:
        """Replicas outside the ISR that hold everything committed in this epoch."""
        return frozenset(
            node
            for node, view in self.followers.items()
            if node not in self.isr
            and view.end is not None
            and view.end >= max(self.high_watermark, self.epoch_start)
        )

    def set_isr(self, isr: Iterable[str], now_s: float) -> None:
        """Apply an ISR that etcd now holds."""
        new = frozenset(isr) | {self.leader}
        for node in new - self.isr:
            if node in self.followers:
                self.followers[node].caught_up_s = now_s
                self.followers[node].in_sync_since_s = now_s
        for node in self.isr - new:
            if node in self.followers:
                self.followers[node].in_sync_since_s = None
        self.isr = new
        self.pending = frozenset()  # etcd holds exactly ``new`` now
        self.validate()

    def lag(self, leader_end: int) -> dict[str, int | None]:
        """Messages each follower is behind the leader's end (None: has not fetched)."""
        return {
            node: None if view.end is None else max(0, leader_end - view.end)
            for node, view in sorted(self.followers.items())
        }

    def validate(self) -> None:
        """The tracker's invariants (tests call this after every step)."""
        assert self.leader in self.isr, "the leader is always in its own ISR"
        assert self.leader not in self.followers, "the leader does not follow itself"
        assert self.high_watermark >= 0, "offsets are unsigned"
        assert not self.pending & self.isr, "a pending addition is not in the ISR yet"

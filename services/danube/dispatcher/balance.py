"""Fair share of subscriptions among dispatchers, pure: from counts to what to hand over and
which claims to refuse. No I/O, time passed in; the node (danube.dispatcher.node) reads the
counts from etcd and carries the decisions out.

Eligible dispatchers are the live ones (registered under their lease) that are not drained.
Each one's share is ``ceil(total / eligible)`` of the subscriptions owned in the cluster (the
most counted in the last ``TOTAL_MEMORY_S``: a count misses those between owners), its
ceiling ``ceil((total + 1) / eligible) + slack``. A dispatcher owning more than its ceiling
hands over down to its share, at most ``moves_max`` per round, the ones with the fewest
unacked messages first (each unacked message may be delivered again by the next owner). It
refuses claims (the claimant's retry reaches another member of the queue group):

- of any subscription while it owns its ceiling (so a claim never takes it past the point
  where it would hand over again: no ping-pong; the ``+ 1`` counts a new subscription that
  nobody owns yet, so with accurate counts some eligible dispatcher always has room);
- of a subscription it handed over less than ``holdoff_s`` ago (it would take it right back),
  while it owns its share or more, unless a dispatcher has left since (the one that took it,
  perhaps). Below its share it takes it back: one more cannot take it past its ceiling, and
  the others may all be at theirs (the count misses the subscriptions nobody owns: every
  other dispatcher refused the one it let go, which waited out the hold-off, 30 s);
- of any subscription while it is drained, which hands over everything.

When no dispatcher is eligible (every live one is drained) nothing is handed over and no
claim is refused: serving beats draining into nowhere.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)

# How long a count's total is remembered: a subscription between owners is missing from the
# counts for a moment (a claim takes milliseconds; a consumer's retry up to a second), and a
# deleted one is forgotten this much later (a share a little high for a while: harmless).
TOTAL_MEMORY_S = 10.0


@dataclass(frozen=True, slots=True)
class BalancePolicy:
    """The limits of balancing (DispatcherConfig's ``balance_*``)."""

    slack: int = 1
    moves_max: int = 4
    holdoff_s: float = 30.0

    def __post_init__(self) -> None:
        if self.slack < 0 or self.moves_max < 1 or self.holdoff_s < 0:
            raise ValueError(f"bad balance policy {self!r}")


@dataclass(frozen=True, slots=True)
class Census:
    """What one round read from etcd: the live dispatchers, the drained ones (live or not)
    and the owner of every owned subscription, counted by node."""

    live: frozenset[str]
    drained: frozenset[str]
    owned: Mapping[str, int] = field(default_factory=dict)

    @property
    def total(self) -> int:
        """Subscriptions owned in the cluster (by any node, live or about to expire)."""
        return sum(self.owned.values())

    def eligible(self, me: str) -> int:
        """Dispatchers that may take subscriptions: live (``me`` counts as live, its own
        registration may not be visible yet) and not drained."""
        return len((self.live | {me}) - self.drained)


def fair_share(total: int, eligible: int) -> int:
    """``ceil(total / eligible)``: with every eligible dispatcher at most there, all fit."""
    if total < 0 or eligible < 1:
        raise ValueError(f"fair share of {total} over {eligible} dispatchers")
    return math.ceil(total / eligible)


def ceiling(total: int, eligible: int, slack: int) -> int:
    """The most one dispatcher owns before it hands over, and where it stops claiming."""
    return fair_share(total + 1, eligible) + slack


def release_count(
    owned: int, total: int, eligible: int, *, drained: bool, policy: BalancePolicy
) -> int:
    """How many subscriptions a dispatcher owning ``owned`` hands over this round."""
    if owned < 0 or total < owned:
        raise ValueError(f"owns {owned} of {total}")
    if eligible < 1:
        return 0  # nowhere to go
    if drained:
        return min(owned, policy.moves_max)
    if owned <= ceiling(total, eligible, policy.slack):
        return 0
    return min(owned - fair_share(total, eligible), policy.moves_max)


def choose_release(unacked: Mapping[K, int], count: int) -> list[K]:
    """The ``count`` subscriptions to hand over: fewest unacked messages first (each may be
    delivered again), ties in key order (sorted by ``str``) so a round is reproducible."""
    ranked = sorted(unacked.items(), key=lambda item: (item[1], str(item[0])))
    return [key for key, _ in ranked[: max(count, 0)]]


def claim_refusal(
    owned: int, total: int, eligible: int, *, drained: bool, held_off: bool, slack: int
) -> str | None:
    """Why a dispatcher owning ``owned`` refuses to claim one more subscription (``total``
    owned in the cluster, not counting it), or None to claim it."""
    if eligible < 1:
        return None  # every live dispatcher is drained: someone must serve
    if drained:
        return "this dispatcher is drained"
    if held_off and owned >= fair_share(total, eligible):
        return "this dispatcher handed it over a moment ago"
    most = ceiling(total, eligible, slack)
    if owned >= most:
        return f"this dispatcher holds its share ({owned}, at most {most})"
    return None


@dataclass
class Balancer(Generic[K]):
    """A dispatcher's balancing state: the last census and what it handed over when.
    Before its first census it refuses nothing and hands over nothing."""

    me: str
    policy: BalancePolicy
    census: Census | None = None
    _released_s: dict[K, float] = field(default_factory=dict)
    _totals: deque[tuple[float, int]] = field(default_factory=deque)  # (when, counted)

    def observe(self, census: Census, now_s: float) -> None:
        """A new count; forgets hand-overs older than the hold-off, and every one when a
        dispatcher left (it may have been the one that took them: they need a home now)."""
        if self.census is not None and self.census.live - census.live:
            self._released_s.clear()
        self.census = census
        self._totals.append((now_s, census.total))
        while now_s - self._totals[0][0] > TOTAL_MEMORY_S:
            self._totals.popleft()
        for key, at_s in list(self._released_s.items()):
            if now_s - at_s >= self.policy.holdoff_s:
                del self._released_s[key]

    @property
    def drained(self) -> bool:
        """The operator drained this dispatcher (as of the last census)."""
        return self.census is not None and self.me in self.census.drained

    def plan(self, unacked: Mapping[K, int]) -> list[K]:
        """What to hand over now, of the subscriptions served here (``unacked``: each one's
        unacked messages). Counts ``unacked`` as what this dispatcher owns: the census may be
        a moment older than the claims and hand-overs since."""
        census = self.census
        if census is None:
            return []
        owned = len(unacked)
        total = self._total(census, owned)
        eligible = census.eligible(self.me)
        count = release_count(owned, total, eligible, drained=self.drained, policy=self.policy)
        return choose_release(unacked, count)

    def released(self, keys: Iterable[K], now_s: float) -> None:
        """``keys`` were handed over (or are about to be) at ``now_s``: held off."""
        for key in keys:
            self._released_s[key] = now_s

    def refusal(self, key: K, owned: int, now_s: float) -> str | None:
        """Why not claim ``key`` now (owning ``owned``), or None to claim it."""
        census = self.census
        if census is None:
            return None
        at_s = self._released_s.get(key)
        held_off = at_s is not None and now_s - at_s < self.policy.holdoff_s
        total = self._total(census, owned)
        return claim_refusal(
            owned,
            total,
            census.eligible(self.me),
            drained=self.drained,
            held_off=held_off,
            slack=self.policy.slack,
        )

    def _total(self, census: Census, owned: int) -> int:
        """The cluster's total: the most counted in the last TOTAL_MEMORY_S. A count misses
        the subscriptions between owners (handed over, not claimed yet; all of a dispatcher
        that left); on that lower total every dispatcher looked above its share, handed
        over more and refused claims, and the subscriptions went round (tests/e2e/
        test_dispatcher_spread.py: fair after 40 s instead of 12). Our hand-overs since do
        not take from it, nor do our claims add to it (most are of subscriptions counted as
        another's; a new one is the ``+ 1`` of the ceiling)."""
        return max(max(total for _, total in self._totals), census.total, owned)

    def held_off(self) -> Sequence[K]:
        """The subscriptions held off now (for stats and tests)."""
        return list(self._released_s)

"""Wait for a request to its owner while watching that the owner still leads.

A request sent to a partition's leader reaches whichever node subscribed to its subject when
it was sent. If that node dies (SIGKILL, host loss) after taking the request, nobody will ever
answer it: the bus has no way to say so, and the request would wait for its whole deadline
although a new leader serves a few seconds later. :func:`await_watching_leader` asks, while
the request is slow, who leads now (``probe``: answered by any node, from etcd) and remembers
the first answer; when a later answer names another leader or epoch, or none, the node
holding the request no longer leads, and it raises :class:`LeaderMovedError` (``not_owner``,
retriable) so the caller's retry loop (:func:`danube.wire.claim.request_with_claim`) sends
the request again, to the new leader.

**At least once.** The request abandoned may have been stored: the old leader may have
appended and replicated it before it died, and the new leader then holds it too. The retry
stores it again. A caller that cannot have duplicates must not retry on ``not_owner``.

Why the first answer, not the owner the request went to: the request names a subject, not a
node, and the bus delivers it to the nodes subscribed when it was sent. So the first answer
is compared with when the request was sent: a term claimed after that (``since_ms``, the
claimant's wall clock) cannot hold the request (a leader subscribes after its claim), and
the node that took it no longer leads. That is the common case once a killed leader is
replaced within a second (its followers end its lease: docs/replication.md, "Failure
cases"): the first probe already names the new leader. Clocks differ, so a term claimed
less than ``CLOCKS_MS`` before the request was sent counts as claimed after it: such a
request, unanswered for a whole second by a leader that had just taken over (which answers
in milliseconds), is taken for lost and sent again (at least once, above). A term claimed
earlier is the one the request waits for. A node that does not say since when leaves the
first answer as the reference, as before (a request sent to a leader replaced before the
first probe then waits for its deadline).

The loop does no I/O of its own: the request is an awaitable, the probe a callable, the clock
and sleep may be fakes (tests/unit/test_wire_leader_watch.py).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Collection
from dataclasses import dataclass, field
from typing import Any, TypeVar

from danube.bus import RemoteError

T = TypeVar("T")

NOT_OWNER = "not_owner"
# A slow request's first probe, then one per interval: a dead leader's lease expires within
# its TTL, so a probe a second after that sees it gone (the failover bound is TTL + 2 s).
PROBE_AFTER_S = 1.0
PROBE_EVERY_S = 1.0
# Probes of one request, at most: each is answered by every ingest node from etcd.
PROBES_MAX = 60
# A term claimed less than this before a request was sent (by the two wall clocks) counts
# as claimed after it: the clocks of a client and a claimant differ, and the request may
# have reached only the leader before. Clocks further apart than this make such a request
# wait for its deadline (as before since_ms).
CLOCKS_MS = 100


@dataclass(frozen=True, slots=True)
class Leader:
    """Who leads a partition, as a probe saw it: ``node_id`` None when nobody does (its
    lease expired, or it never had a leader); ``epoch`` None then too. ``since_ms``: when
    the term was claimed, by the claimant's wall clock (None: not said); not part of the
    comparison (a leader that wrote its key again after an etcd outage leads the same
    term)."""

    node_id: str | None
    epoch: int | None = None
    since_ms: int | None = field(default=None, compare=False)


class LeaderMovedError(RemoteError):
    """The leader that held a request in flight no longer leads: the request was abandoned
    (it may have been stored all the same) and may be sent again. ``was``: the leader the
    first probe saw (None when that first probe already saw none); ``now``: what the probe
    that gave up saw."""

    def __init__(self, *, subject: str, was: Leader | None, now: Leader) -> None:
        super().__init__(
            code=NOT_OWNER,
            message=(
                f"{subject}: the leader moved from {_show(was)} to {_show(now)} while a "
                "request was in flight; it may have been stored (send again: at least once)"
            ),
            retriable=True,
            subject=subject,
        )
        self.was = was
        self.now = now


def moved(
    first: Leader | None, answer: Leader | None, sent_ms: int | None = None
) -> tuple[Leader | None, bool]:
    """The decision of one probe answer (pure): ``(first answer kept, the leader moved)``.
    ``answer`` None: nobody answered the probe, nothing learned. No leader: the node holding
    the request lost its lease (a node subscribes only after its claim is written). Another
    node or epoch than the first answer named: a new term began. A first answer whose term
    was claimed after the request was sent (``sent_ms``, wall clock; or less than
    ``CLOCKS_MS`` before it): the request went to an earlier leader."""
    if answer is None:
        return first, False
    if answer.node_id is None:
        return first, True
    if first is None:
        claimed_after = (
            sent_ms is not None
            and answer.since_ms is not None
            and answer.since_ms > sent_ms - CLOCKS_MS
        )
        # Claimed after: "moved from the node it was sent to" (no first answer to name).
        return (None, True) if claimed_after else (answer, False)
    return first, answer != first


async def await_watching_leader(
    request: Awaitable[T],
    probe: Callable[[float], Awaitable[Leader | None]],
    *,
    deadline: float,
    subject: str,
    give_up_codes: Collection[str] = (),
    probe_after_s: float = PROBE_AFTER_S,
    probe_every_s: float = PROBE_EVERY_S,
    probes_max: int = PROBES_MAX,
    clock: Callable[[], float] | None = None,
    sleep: Callable[[float], Awaitable[object]] | None = None,
    sent_ms: int | None = None,
) -> T:
    """``request``'s answer; while it is slow, ``probe(deadline)`` about every
    ``probe_every_s`` (the first after ``probe_after_s``, at most ``probes_max``, none
    starting at or past ``deadline``) and raise :class:`LeaderMovedError` when the leader
    moved (:func:`moved`). ``probe`` returns who leads, None when nobody answered, or raises
    the RemoteError a node answered: raised here when its code is in ``give_up_codes``
    (e.g. ``partition_unavailable``: no leader can come), else nothing learned. ``sent_ms``:
    when the request was sent, wall clock (the first answer is judged by it). ``request``
    must end by ``deadline`` on its own (a bus request's timeout): once no probe is left it
    is simply awaited. It is cancelled when this raises; the caller's cancel reaches both."""
    now = clock if clock is not None else asyncio.get_running_loop().time
    pending = asyncio.ensure_future(request)
    asked: asyncio.Future[Leader | None] | None = None
    first: Leader | None = None
    try:
        next_at = now() + probe_after_s
        for _ in range(probes_max):
            await _wait(pending, max(next_at - now(), 0.0), sleep)
            if pending.done() or now() >= deadline:
                break
            asked = asyncio.ensure_future(probe(deadline))
            await asyncio.wait({pending, asked}, return_when=asyncio.FIRST_COMPLETED)
            if pending.done():
                break
            answer = _answer(asked, give_up_codes)
            first, leader_moved = moved(first, answer, sent_ms)
            if leader_moved:
                assert answer is not None  # moved() says so only on an answer
                raise LeaderMovedError(subject=subject, was=first, now=answer)
            next_at = max(next_at + probe_every_s, now())
        return await pending
    finally:
        for task in (pending, asked):
            if task is not None and not task.done():
                await _cancel(task)


async def _wait(
    pending: asyncio.Future[Any],
    delay_s: float,
    sleep: Callable[[float], Awaitable[object]] | None,
) -> None:
    """Until ``pending`` is done or ``delay_s`` passed. The real clock's timer is the
    loop's own (no task per request: this is every produce's path); a fake ``sleep`` is
    raced as a task."""
    if sleep is None:
        await asyncio.wait({pending}, timeout=delay_s)
        return
    timer = asyncio.ensure_future(sleep(delay_s))
    try:
        await asyncio.wait({pending, timer}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        if not timer.done():
            await _cancel(timer)


async def _cancel(task: asyncio.Future[Any]) -> None:
    task.cancel()
    await asyncio.wait({task})  # never raises: the caller's own cancel stays


def _answer(asked: asyncio.Future[Leader | None], give_up_codes: Collection[str]) -> Leader | None:
    """A finished probe's answer; its RemoteError raised when it is a reason to give up."""
    try:
        return asked.result()
    except RemoteError as exc:
        if exc.code in give_up_codes:
            raise
        return None  # a node failed to answer (etcd trouble...): nothing learned


def _show(leader: Leader | None) -> str:
    if leader is None:
        return "the node it was sent to"
    if leader.node_id is None:
        return "no leader"
    return f"{leader.node_id} (epoch {leader.epoch})"

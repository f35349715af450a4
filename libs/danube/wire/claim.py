"""Claim-and-retry: the one request loop of the clients whose servers own their work.

An ingest partition and a dispatcher subscription are served by whichever node owns them;
nobody may own them yet (the first produce, the first attach) or the owner may be moving.
A request then finds no responder on the owner's subject, or a retriable refusal
(``not_owner``, ``unowned``...). :func:`request_with_claim` asks the service's queue group
to claim the work and retries with capped, jittered backoff (danube.meta.backoff), all
within one deadline; when the deadline cannot be met it raises the last reason the server
gave (its code says more than a timeout), else ``TimeoutError``.

A refusal that says the work is moving (``not_owner``: a leader handing over, a watched
request whose leader changed) backs off at most :data:`RETRY_MOVED_CAP_S`: a live move's
pause is ~10-15 ms (docs/performance.md), and the doubling up to :data:`RETRY_CAP_S` turned
a move of ~0.5 s under load into a produce that waited ~0.9 s (a retry at 0.6 s missed it,
the next was 0.5 s later). Nobody owning the work at all (no responders) keeps the full cap.

A claim that answered (no reason given) is followed by the next attempt at once, not after
a backoff: its owner serves now, and a first produce or attach should not pay a pause for
the claim it needed (docs/performance.md, "The tail at a light load"). Only the first
claim of a request is trusted this way; every later failure backs off.

The transport is the two callables: ``attempt(deadline)`` makes one request, ``claim(deadline)``
asks for an owner. Tests pass fakes of both (and of the clock and sleep): the loop itself
does no I/O.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Collection
from typing import TypeVar

from danube.bus import BusTimeoutError, NoRespondersError, RemoteError
from danube.meta.backoff import backoff_s
from danube.wire.leader_watch import NOT_OWNER

T = TypeVar("T")

RETRY_BASE_S = 0.02
RETRY_CAP_S = 0.5
RETRY_MOVED_CAP_S = 0.1


async def request_with_claim(
    attempt: Callable[[float], Awaitable[T]],
    claim: Callable[[float], Awaitable[RemoteError | None]],
    *,
    timeout_s: float,
    timeout_message: str,
    give_up_codes: Collection[str] = (),
    base_s: float = RETRY_BASE_S,
    cap_s: float = RETRY_CAP_S,
    clock: Callable[[], float] | None = None,
    sleep: Callable[[float], Awaitable[object]] | None = None,
) -> T:
    """``attempt(deadline)`` until it answers, claiming on no responders and backing off on
    retriable refusals; ``deadline`` is on ``clock`` (the running loop's by default).

    - ``NoRespondersError``: ``claim(deadline)``; the RemoteError it returns (the queue
      group's reason there is no owner, if any) becomes the reason kept for the end, and is
      raised at once when its code is in ``give_up_codes``. The first claim that returns
      no reason is followed by the next attempt at once.
    - ``RemoteError``: raised at once unless retriable and not in ``give_up_codes`` (those
      are retriable, but not within one request: e.g. a full disk); else kept as the reason.
    - ``BusTimeoutError`` (the deadline ran out during an attempt): the kept reason if
      there is one; else, when an earlier attempt found no responder, the same
      ``TimeoutError`` as below (nobody owned the work: a retry sent with a millisecond
      left timing out says nothing more); else the timeout itself.
    - Anything else propagates. When the next backoff would pass the deadline: the kept
      reason, else ``TimeoutError(timeout_message)``.
    """
    now = clock if clock is not None else asyncio.get_running_loop().time
    pause = sleep if sleep is not None else asyncio.sleep  # looked up now: tests patch it
    deadline = now() + timeout_s
    failures = 0
    reason: RemoteError | None = None  # why the last attempt failed, if the server said
    claimed = False  # a claim answered already: later ones back off
    unowned = False  # an attempt found no responder
    while True:
        moving = False  # the last attempt was refused by an owner handing the work over
        try:
            return await attempt(deadline)
        except NoRespondersError:
            unowned = True
            refused = await claim(deadline)
            reason = refused or reason
            if reason is not None and reason.code in give_up_codes:
                raise reason from None
            if refused is None and not claimed:
                claimed = True
                continue
        except RemoteError as exc:
            if not exc.retriable or exc.code in give_up_codes:
                raise
            reason = exc
            moving = exc.code == NOT_OWNER
        except BusTimeoutError:
            if reason is not None:
                raise reason from None  # the deadline ran out in a retry: the refusal says more
            if unowned:
                raise TimeoutError(timeout_message) from None
            raise
        failures += 1
        delay_s = backoff_s(
            failures, base_s=base_s, cap_s=min(cap_s, RETRY_MOVED_CAP_S) if moving else cap_s
        )
        if now() + delay_s >= deadline:
            if reason is not None:
                raise reason
            raise TimeoutError(timeout_message)
        await pause(delay_s)

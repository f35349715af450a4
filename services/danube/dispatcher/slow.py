"""Fair redelivery and slow consumers, pure (docs/dispatcher.md, "Fair redelivery").

A consumer that takes messages and never acks them must not starve the others of a shared
subscription. Three rules, applied by :class:`~danube.dispatcher.delivery.SubscriptionMachine`:

- **Elsewhere first.** A message an ack timeout took back from a consumer, or that it
  nacked, carries that consumer (``Entry.refused_by``). When that consumer polls, it is
  skipped while another consumer :func:`can_take` it: attached, polled within the ack
  timeout (it is there to take it), room in its window, and no more strikes than the one
  that refused it. So redeliveries go to a consumer that asks for messages and acks them;
  with nobody else able, they go back to the same one (as before).
- **Slowed.** Each *strike* (an ack timeout of a batch sent after its previous strike: a
  burst of batches sent together strikes once) halves the consumer's window, down to
  ``slow_window_min``; each ack that counts doubles it back and ends the streak.
- **Detached.** ``slow_detach_timeouts`` strikes in a row without an ack detach it, when
  another consumer can take over (shared, key-shared: another is attached; failover: a
  standby; exclusive: never). Its messages go back at once; its later requests are answered
  ``consumer_detached`` (:class:`DetachedBook`).

Every function here is O(1) but :func:`can_take` (O(consumers), asked only when the
polling consumer has refused messages waiting).
"""

from __future__ import annotations

from collections.abc import Iterable

from danube.dispatcher.entries import ConsumerWindow
from danube.dispatcher.redelivery import DeliverySettings

# Halvings counted at most: a window is never shifted by more (a huge streak, same floor).
HALVINGS_MAX = 30
# Detached consumers remembered (to answer them consumer_detached), oldest forgotten first.
DETACHED_REMEMBERED_MAX = 1024


def window(settings: DeliverySettings, consumer: ConsumerWindow) -> int:
    """``consumer``'s window now: the configured one, halved per strike down to the floor."""
    full = settings.max_unacked_per_consumer
    if consumer.halvings == 0 or settings.slow_window_min == 0:
        return full
    return max(min(settings.slow_window_min, full), full >> consumer.halvings)


def strike(
    settings: DeliverySettings, consumer: ConsumerWindow, batch_stamp: int, now_stamp: int
) -> bool:
    """An ack timeout of a batch stamped ``batch_stamp`` sent to ``consumer``: whether it
    counts as a new strike (the batch was sent after the previous one). ``now_stamp`` is the
    machine's stamp now: batches sent before it no longer strike. The window halves unless
    it is at its floor already (so the first ack after a long streak doubles it at once)."""
    if batch_stamp <= consumer.struck_stamp:
        return False
    consumer.strikes += 1
    consumer.struck_stamp = now_stamp
    floor = min(settings.slow_window_min, settings.max_unacked_per_consumer)
    if settings.slow_window_min and window(settings, consumer) > floor:
        consumer.halvings = min(consumer.halvings + 1, HALVINGS_MAX)
    return True


def acked(consumer: ConsumerWindow) -> None:
    """``consumer`` acked a message: the streak ends, and its window doubles back."""
    consumer.strikes = 0
    if consumer.halvings:
        consumer.halvings -= 1


def can_take(
    consumers: Iterable[ConsumerWindow],
    refuser: ConsumerWindow,
    settings: DeliverySettings,
    now_s: float,
) -> bool:
    """Whether a consumer other than ``refuser`` can take the messages ``refuser`` let time
    out or nacked: it polled within the ack timeout, has room in its window, and has no more
    strikes than ``refuser`` (a worse consumer is no better home)."""
    horizon_s = now_s - settings.ack_timeout_s
    for other in consumers:
        if other is refuser or other.polled_s < horizon_s or other.strikes > refuser.strikes:
            continue
        if len(other.held) < window(settings, other):
            return True
    return False


def due_for_detach(settings: DeliverySettings, consumer: ConsumerWindow) -> bool:
    """Whether ``consumer``'s streak reached the threshold (the caller checks that another
    consumer can take over)."""
    limit = settings.slow_detach_timeouts
    return limit > 0 and consumer.strikes >= limit


def detach_reason(settings: DeliverySettings, consumer: ConsumerWindow) -> str:
    """What a detached consumer is told."""
    return (
        f"detached: its messages timed out unacknowledged {consumer.strikes} times in a row "
        f"(ack timeout {settings.ack_timeout_s:g} s, limit {settings.slow_detach_timeouts}); "
        "they went to the other consumers"
    )


class DetachedBook:
    """Consumers detached for their timeouts, with the reason (bounded: the oldest go)."""

    def __init__(self, limit: int = DETACHED_REMEMBERED_MAX) -> None:
        self.limit = limit
        self._reasons: dict[str, str] = {}

    def add(self, consumer_id: str, reason: str) -> None:
        """Remember ``consumer_id`` was detached for ``reason``."""
        self._reasons[consumer_id] = reason
        while len(self._reasons) > self.limit:
            del self._reasons[next(iter(self._reasons))]

    def reason(self, consumer_id: str) -> str | None:
        """Why ``consumer_id`` was detached; None if it was not (or is forgotten)."""
        return self._reasons.get(consumer_id)

    def forget(self, consumer_id: str) -> None:
        """``consumer_id`` attached again: a new consumer, no longer the detached one."""
        self._reasons.pop(consumer_id, None)

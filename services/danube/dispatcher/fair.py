"""Fair redelivery and slow consumers in the subscription machine: the glue between its
polls and ack timeouts and the pure rules of danube.dispatcher.slow. No I/O.

danube.dispatcher.delivery.SubscriptionMachine mixes it in; the state it reads and the
transitions it uses are the machine's.
"""

from __future__ import annotations

from collections.abc import Callable

from danube.dispatcher import slow
from danube.dispatcher.entries import ConsumerWindow
from danube.dispatcher.events import Action, ConsumerDetached, SlowConsumerDetached
from danube.dispatcher.redelivery import DeliverySettings


class FairRedelivery:
    """Redeliveries to another consumer first; a consumer whose messages keep timing out
    detached (danube.dispatcher.slow gives the rules)."""

    delivery_type: str
    settings: DeliverySettings
    _consumers: dict[str, ConsumerWindow]
    _detached_slow: slow.DetachedBook
    _now_s: float

    # The machine's own transition (danube.dispatcher.delivery.SubscriptionMachine).
    def _detach(self, event: ConsumerDetached, actions: list[Action]) -> None:
        raise NotImplementedError

    def _elsewhere(self, consumer: ConsumerWindow) -> Callable[[], bool]:
        """Whether another consumer can take what ``consumer`` refused, asked at most once
        per poll and only when such a message is met (it walks the consumers)."""
        answer: list[bool] = []

        def ask() -> bool:
            if not answer:
                shared = self.delivery_type in ("shared", "key_shared")
                consumers = self._consumers.values()
                answer.append(
                    shared and slow.can_take(consumers, consumer, self.settings, self._now_s)
                )
            return answer[0]

        return ask

    def _detach_if_slow(
        self, consumer: ConsumerWindow, now_s: float, actions: list[Action]
    ) -> None:
        """Detach ``consumer`` once its streak of ack timeouts reaches the limit and another
        consumer can take over (never the one consumer of an exclusive subscription)."""
        if not slow.due_for_detach(self.settings, consumer) or len(self._consumers) < 2:
            return
        if consumer.consumer_id not in self._consumers:
            return  # detached already (two strikes in one tick cannot, but be sure)
        reason = slow.detach_reason(self.settings, consumer)
        self._detach(ConsumerDetached(consumer.consumer_id, now_s), actions)
        self._detached_slow.add(consumer.consumer_id, reason)
        actions.append(
            SlowConsumerDetached(consumer.consumer_id, consumer.name, consumer.strikes, reason)
        )

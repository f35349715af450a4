"""The limits of delivery and the redelivery delay after an ack timeout."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from danube.config import DispatcherConfig
from danube.meta.backoff import backoff_s


@dataclass(frozen=True, slots=True)
class DeliverySettings:
    """Limits of one subscription's delivery.

    - ``max_unacked_per_consumer``: the flow-control window; a consumer is given nothing
      more while this many of its messages are unacked;
    - ``ack_timeout_s``: an unacked message is taken back this long after its delivery;
    - ``redelivery_base_s`` / ``redelivery_max_s``: the backoff after an ack timeout;
    - ``max_redeliveries``: a message is delivered at most ``1 + max_redeliveries`` times,
      then dead-lettered;
    - ``max_held``: messages the subscription holds in memory (buffered, in flight, waiting
      for a redelivery) before it pauses reading; it resumes at half.
    """

    max_unacked_per_consumer: int = 1000
    ack_timeout_s: float = 30.0
    redelivery_base_s: float = 1.0
    redelivery_max_s: float = 60.0
    max_redeliveries: int = 5
    max_held: int = 10_000

    def __post_init__(self) -> None:
        if self.max_unacked_per_consumer < 1 or self.max_held < 2:
            raise ValueError("max_unacked_per_consumer must be >= 1 and max_held >= 2")
        if self.ack_timeout_s <= 0 or not 0 < self.redelivery_base_s <= self.redelivery_max_s:
            raise ValueError("need ack_timeout_s > 0 and 0 < redelivery_base_s <= redelivery_max_s")
        if self.max_redeliveries < 0:
            raise ValueError("max_redeliveries must be >= 0")

    @classmethod
    def from_config(cls, config: DispatcherConfig) -> DeliverySettings:
        """The machine's limits from the service config."""
        return cls(
            max_unacked_per_consumer=config.max_unacked_per_consumer,
            ack_timeout_s=config.ack_timeout_s,
            redelivery_base_s=config.redelivery_base_s,
            redelivery_max_s=max(config.redelivery_max_s, config.redelivery_base_s),
            max_redeliveries=config.max_redeliveries,
            max_held=max(config.max_held_messages, 2),
        )


def redelivery_delay_s(
    attempt: int, *, base_s: float, cap_s: float, rng: Callable[[], float]
) -> float:
    """The wait before redelivery number ``attempt`` (0-based) after an ack timeout.

    "Equal jitter": the ceiling doubles from ``base_s`` up to ``cap_s`` and the delay is
    uniform in ``[ceiling/2, ceiling]``. Below the cap, every delay is therefore at least the
    previous one (the lowest value of one step is the highest of the step before), while
    consumers that timed out together do not all get their messages back at once.
    """
    return backoff_s(attempt, base_s=base_s, cap_s=cap_s, rng=rng)

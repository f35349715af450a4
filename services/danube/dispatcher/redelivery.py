"""The limits of delivery and the redelivery delay after an ack timeout: the cluster's
``dispatcher`` config, overridden per subscription by its failure policy
(danube.meta.failure_policy)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from danube.config import DispatcherConfig
from danube.meta.backoff import backoff_s
from danube.meta.failure_policy import (
    BackoffKind,
    FailurePolicy,
    PoisonPolicy,
    ResolvedPolicy,
)


@dataclass(frozen=True, slots=True)
class DeliverySettings:
    """Limits of one subscription's delivery.

    - ``max_unacked_per_consumer``: the flow-control window; a consumer is given nothing
      more while this many of its messages are unacked;
    - ``ack_timeout_s``: an unacked message is taken back this long after its delivery;
    - ``redelivery_base_s`` / ``redelivery_max_s``: the backoff after an ack timeout,
      ``backoff_kind`` ``fixed`` (always the base) or ``exponential`` (:func:`redelivery_delay_s`);
    - ``max_redeliveries``: a message is delivered at most ``1 + max_redeliveries`` times,
      then disposed of by ``poison_policy`` (``dead_letter``, ``drop`` or ``block``);
    - ``max_held``: messages the subscription holds in memory (buffered, in flight, waiting
      for a redelivery) before it pauses reading; it resumes at half;
    - ``slow_window_min``: each ack timeout in a row halves a consumer's window, down to
      this many messages, and each ack it sends doubles it back (0: windows never shrink);
    - ``slow_detach_timeouts``: a consumer whose messages time out this many times in a row
      with no ack between is detached when another consumer can take over (0: never).
      Both: danube.dispatcher.slow, docs/dispatcher.md "Fair redelivery";
    - ``delay_lookahead_ms``: a delayed message is handed this long before its time to
      consumers that hold it until then (danube.dispatcher.delaying; 0: never early).
    """

    max_unacked_per_consumer: int = 5000
    ack_timeout_s: float = 30.0
    redelivery_base_s: float = 1.0
    redelivery_max_s: float = 60.0
    max_redeliveries: int = 5
    max_held: int = 10_000
    poison_policy: PoisonPolicy = "dead_letter"
    backoff_kind: BackoffKind = "exponential"
    slow_window_min: int = 0
    slow_detach_timeouts: int = 0
    delay_lookahead_ms: int = 0

    def __post_init__(self) -> None:
        if self.max_unacked_per_consumer < 1 or self.max_held < 2:
            raise ValueError("max_unacked_per_consumer must be >= 1 and max_held >= 2")
        if self.ack_timeout_s <= 0 or not 0 < self.redelivery_base_s <= self.redelivery_max_s:
            raise ValueError("need ack_timeout_s > 0 and 0 < redelivery_base_s <= redelivery_max_s")
        if self.max_redeliveries < 0:
            raise ValueError("max_redeliveries must be >= 0")
        if self.slow_window_min < 0 or self.slow_detach_timeouts < 0:
            raise ValueError("slow_window_min and slow_detach_timeouts must be >= 0")
        if not 0 <= self.delay_lookahead_ms <= self.ack_timeout_s * 500:
            raise ValueError("delay_lookahead_ms must be in 0 .. half the ack timeout")

    @classmethod
    def from_config(
        cls, config: DispatcherConfig, policy: FailurePolicy | None = None
    ) -> DeliverySettings:
        """The machine's limits from the service config and the subscription's failure
        policy (its unset fields: the config's)."""
        resolved = resolve_policy(config, policy)
        return cls(
            max_unacked_per_consumer=config.max_unacked_per_consumer,
            ack_timeout_s=resolved.ack_timeout_ms / 1000,
            redelivery_base_s=resolved.backoff_base_ms / 1000,
            redelivery_max_s=resolved.backoff_max_ms / 1000,
            max_redeliveries=resolved.max_redeliveries,
            max_held=max(config.max_held_messages, 2),
            poison_policy=resolved.poison_policy,
            backoff_kind=resolved.backoff_kind,
            slow_window_min=config.slow_consumer_window_min,
            slow_detach_timeouts=config.slow_consumer_detach_timeouts,
            # A held message's ack timeout runs from its hand-over: half of it at most.
            delay_lookahead_ms=min(config.delay_lookahead_ms, resolved.ack_timeout_ms // 2),
        )

    def delay_s(self, attempt: int, rng: Callable[[], float]) -> float:
        """The wait before redelivery number ``attempt`` (0-based) after an ack timeout."""
        if self.backoff_kind == "fixed":
            return self.redelivery_base_s
        return redelivery_delay_s(
            attempt, base_s=self.redelivery_base_s, cap_s=self.redelivery_max_s, rng=rng
        )


def cluster_policy(config: DispatcherConfig) -> ResolvedPolicy:
    """The cluster's failure policy: what a subscription's unset fields take."""
    base_ms = max(1, round(config.redelivery_base_s * 1000))
    return ResolvedPolicy(
        max_redeliveries=config.max_redeliveries,
        ack_timeout_ms=max(1, round(config.ack_timeout_s * 1000)),
        backoff_kind="exponential",
        backoff_base_ms=base_ms,
        backoff_max_ms=max(base_ms, round(config.redelivery_max_s * 1000)),
        poison_policy="dead_letter",
        dead_letter_topic=None,
    )


def resolve_policy(config: DispatcherConfig, policy: FailurePolicy | None) -> ResolvedPolicy:
    """``policy`` with its unset fields from the cluster's config (all of them for None)."""
    defaults = cluster_policy(config)
    return defaults if policy is None else policy.resolve(defaults)


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

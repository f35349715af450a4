"""A served subscription's failure policy (danube.meta.failure_policy): checked against the
cluster's config, stored with the subscription's config, and applied to the live machine.

A change (``PUT .../failure-policy``) comes to the dispatcher that owns the subscription (the
bus op ``policy``, claiming it when nobody serves it), which writes the config fenced on its
owner key and hands the machine its new limits at once: no watch and no restart. A
dispatcher that takes the subscription over later reads the stored config when it resumes.

The subscription's runtime owns one :class:`FailurePolicyAdmin`, which holds the stored
config (the policy is part of it) and is built with what it needs to name and write it.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

from danube.config import DispatcherConfig
from danube.dispatcher.deadletter import dead_letter_topic
from danube.dispatcher.delivery import SubscriptionMachine
from danube.dispatcher.events import Action
from danube.dispatcher.redelivery import DeliverySettings, resolve_policy
from danube.meta import TopicName
from danube.meta.failure_policy import Backoff, FailurePolicy
from danube.meta.records import SubscriptionConfig
from danube.wire.dispatcher import protocol
from danube.wire.dispatcher.errors import PolicyConflictError

log = logging.getLogger(__name__)


Write = Callable[[SubscriptionConfig], Awaitable[None]]
"""Stores the subscription's config, fenced on its owner key (NotOwnerError if not ours)."""
CarryOut = Callable[[list[Action]], Awaitable[None]]
"""Carries out the machine's actions (and wakes waiting polls)."""


class FailurePolicyAdmin:
    """The failure policy of one served subscription of ``topic`` (``where`` is
    ``topic/sub``, for the logs): ``stored`` is its config as last read or written (None
    before the first attach)."""

    def __init__(
        self, config: DispatcherConfig, topic: TopicName, where: str, *, write: Write
    ) -> None:
        self._config = config
        self._topic = topic
        self._where = where
        self._write = write
        self.stored: SubscriptionConfig | None = None

    @property
    def policy(self) -> FailurePolicy | None:
        """The policy as stored (None: the cluster's)."""
        return None if self.stored is None else self.stored.failure_policy

    def effective(self, policy: FailurePolicy | None) -> FailurePolicy:
        """``policy`` with every field set, its dead-letter topic named."""
        resolved = resolve_policy(self._config, policy).as_policy()
        topic = dead_letter_topic(self._topic, self._config.dead_letter_suffix)
        if resolved.dead_letter_topic is None:
            resolved = resolved.model_copy(update={"dead_letter_topic": str(topic)})
        return resolved

    def dead_letter_target(self, partition: TopicName) -> TopicName:
        """Where a poison message of ``partition`` is dead-lettered under the current
        policy."""
        policy = self.policy
        named = None if policy is None else policy.dead_letter_topic
        return dead_letter_topic(partition, self._config.dead_letter_suffix, named)

    def with_policy(
        self, stats: protocol.SubscriptionStats, dropped: int, dead_lettered: int
    ) -> protocol.SubscriptionStats:
        """``stats`` with the policy in effect and the poison messages let go so far."""
        update = {
            "failure_policy": self.effective(self.policy),
            "dropped": dropped,
            "dead_lettered": dead_lettered,
        }
        return stats.model_copy(update=update)

    def read(self) -> protocol.PolicyReply:
        """The policy as stored and in effect."""
        policy = self.policy
        return protocol.PolicyReply(policy=policy, effective=self.effective(policy))

    async def replace(
        self,
        machine: SubscriptionMachine,
        policy: FailurePolicy,
        *,
        check_serving: Callable[[], None],
        carry_out: CarryOut,
    ) -> protocol.PolicyReply:
        """Store ``policy`` as the subscription's and apply it to ``machine`` now: later
        deliveries and ack timeouts follow it, and poison messages held under ``block`` are
        judged again."""
        settings = DeliverySettings.from_config(self._config, policy)
        stored = self.stored
        assert stored is not None, "a served subscription has its config"
        updated = stored.model_copy(update={"failure_policy": policy})
        await self._write(updated)
        check_serving()  # fenced meanwhile: the next owner reads what was stored
        self.stored = updated
        await carry_out(machine.apply_settings(settings))
        log.info("failure policy of %s now %s", self._where, policy.model_dump())
        return protocol.PolicyReply(policy=policy, effective=self.effective(policy))


def check_attach(stored: SubscriptionConfig, requested: FailurePolicy | None) -> None:
    """An attach may repeat the subscription's policy or leave it out, not change it."""
    if requested is None or requested == stored.failure_policy:
        return
    set_ = stored.failure_policy or FailurePolicy()
    differences = [
        f"{name} {_field_text(getattr(set_, name))}, not {_field_text(getattr(requested, name))}"
        for name in FailurePolicy.model_fields
        if getattr(set_, name) != getattr(requested, name)
    ]
    raise PolicyConflictError(
        f"the subscription has another failure policy: {'; '.join(differences)}. Attach "
        "without one, or change it first (PUT .../failure-policy, `danube admin "
        "subscriptions failure-policy set`)"
    )


def _field_text(value: object) -> str:
    """One field of a policy as a person reads it (a message, not a Python repr)."""
    if value is None:
        return "the cluster's"
    if isinstance(value, Backoff):
        bounds = [
            f"{n} {v} ms"
            for n, v in (("base", value.base_ms), ("max", value.max_ms))
            if v is not None
        ]
        return ", ".join([value.kind, *bounds])
    return str(value)

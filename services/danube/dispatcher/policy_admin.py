"""A served subscription's failure policy (danube.meta.failure_policy): checked against the
cluster's config, stored with the subscription's config, and applied to the live machine.

A change (``PUT .../failure-policy``) comes to the dispatcher that owns the subscription (the
bus op ``policy``, claiming it when nobody serves it), which writes the config fenced on its
owner key and hands the machine its new limits at once: no watch and no restart. A
dispatcher that takes the subscription over later reads the stored config when it resumes.
"""

from __future__ import annotations

import logging
from typing import Protocol

from danube.config import DispatcherConfig
from danube.dispatcher.deadletter import dead_letter_topic
from danube.dispatcher.delivery import SubscriptionMachine
from danube.dispatcher.events import Action
from danube.dispatcher.redelivery import DeliverySettings, resolve_policy
from danube.dispatcher.store import SubscriptionStore
from danube.meta import TopicName
from danube.meta.failure_policy import Backoff, FailurePolicy
from danube.meta.records import SubscriptionConfig
from danube.wire.dispatcher import protocol
from danube.wire.dispatcher.errors import PolicyConflictError

log = logging.getLogger(__name__)


class Served(Protocol):
    """What of a served subscription (danube.dispatcher.runtime) the policy admin uses."""

    store: SubscriptionStore
    config: DispatcherConfig
    stored_config: SubscriptionConfig | None
    dropped: int
    dead_lettered: int

    def check_serving(self) -> None:
        """NotOwnerError once it is being deleted or stopped."""
        ...

    def subscription(self) -> SubscriptionMachine:
        """Its state machine (SubscriptionNotFoundError before the first attach)."""
        ...

    def notify(self) -> None:
        """Wake every waiting poll."""
        ...

    async def run_actions(self, actions: list[Action]) -> None:
        """Carry out the machine's actions."""
        ...


def effective(served: Served, policy: FailurePolicy | None) -> FailurePolicy:
    """``policy`` with every field set, its dead-letter topic named."""
    resolved = resolve_policy(served.config, policy).as_policy()
    topic = dead_letter_topic(served.store.topic, served.config.dead_letter_suffix)
    if resolved.dead_letter_topic is None:
        resolved = resolved.model_copy(update={"dead_letter_topic": str(topic)})
    return resolved


def _policy(served: Served) -> FailurePolicy | None:
    return None if served.stored_config is None else served.stored_config.failure_policy


def dead_letter_target(served: Served, partition: TopicName) -> TopicName:
    """Where a poison message of ``partition`` is dead-lettered under the current policy."""
    policy = _policy(served)
    named = None if policy is None else policy.dead_letter_topic
    return dead_letter_topic(partition, served.config.dead_letter_suffix, named)


def with_policy(served: Served, stats: protocol.SubscriptionStats) -> protocol.SubscriptionStats:
    """``stats`` with the policy in effect and the poison messages let go so far."""
    update = {
        "failure_policy": effective(served, _policy(served)),
        "dropped": served.dropped,
        "dead_lettered": served.dead_lettered,
    }
    return stats.model_copy(update=update)


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


async def read(served: Served) -> protocol.PolicyReply:
    """The policy as stored and in effect; SubscriptionNotFoundError before the first attach."""
    served.check_serving()
    served.subscription()
    policy = _policy(served)
    return protocol.PolicyReply(policy=policy, effective=effective(served, policy))


async def replace(served: Served, policy: FailurePolicy) -> protocol.PolicyReply:
    """Store ``policy`` as the subscription's and apply it now: later deliveries and ack
    timeouts follow it, and poison messages held under ``block`` are judged again."""
    served.check_serving()
    machine = served.subscription()
    settings = DeliverySettings.from_config(served.config, policy)
    stored = served.stored_config
    assert stored is not None, "a served subscription has its config"
    updated = stored.model_copy(update={"failure_policy": policy})
    await served.store.write_config(updated)
    served.check_serving()  # fenced meanwhile: the next owner reads what was stored
    served.stored_config = updated
    actions = machine.apply_settings(settings)
    served.notify()
    await served.run_actions(actions)
    log.info(
        "failure policy of %s/%s now %s", served.store.topic, served.store.sub, policy.model_dump()
    )
    return protocol.PolicyReply(policy=policy, effective=effective(served, policy))

"""The failure policy of a subscription (docs/http-api.md, "Failure policy"):
``GET/PUT /v1/topics/{ns}/{topic}/subscriptions/{sub}/failure-policy``.

Both go to the dispatcher serving the subscription (claiming it when none does, as seek and
skip do): a PUT is stored fenced on its owner key and applied to the live subscription at
once; a GET answers the policy as stored and as in effect there (unset fields: the cluster's
``dispatcher`` config).
"""

from __future__ import annotations

from fastapi import APIRouter

from danube.discovery.doors.http.params import Namespace, Subscription, Topic
from danube.discovery.doors.http.state import Services, ServicesDep
from danube.discovery.errors import BadRequestError, NotFoundError
from danube.meta import TopicName
from danube.meta import keys as meta_keys
from danube.meta.failure_policy import FailurePolicy, FailurePolicyIn
from danube.names import user_topic, validate_segment
from danube.wire import codes
from danube.wire.api.catalog import FailurePolicyOut

router = APIRouter(prefix="/v1", tags=["subscriptions"])


async def _existing(services: Services, ns: str, topic: str, sub: str) -> TopicName:
    name = user_topic(ns, topic)
    validate_segment("subscription", sub)
    await services.catalog.get_topic(name)
    if await services.store.get(meta_keys.subscription_key(name, sub)) is None:
        raise NotFoundError(
            f"subscription {sub!r} of {name} does not exist", code=codes.SUBSCRIPTION_NOT_FOUND
        )
    return name


def check_dead_letter_topic(topic: TopicName, policy: FailurePolicy | None) -> None:
    """BadRequestError when ``policy`` dead-letters a subscription of ``topic`` into
    ``topic`` itself (its poison messages would come back to it for ever)."""
    named = None if policy is None else policy.dead_letter_topic
    if named is not None and TopicName.parse(named).parent == topic:
        raise BadRequestError(
            f"failure_policy.dead_letter_topic: {named} is the subscription's own topic",
            code="bad_request",
        )


@router.get(
    "/topics/{ns}/{topic}/subscriptions/{sub}/failure-policy", response_model=FailurePolicyOut
)
async def get_failure_policy(
    ns: Namespace, topic: Topic, sub: Subscription, services: ServicesDep
) -> FailurePolicyOut:
    """The subscription's failure policy, as set and as in effect."""
    name = await _existing(services, ns, topic, sub)
    reply = await services.dispatcher.failure_policy(name, sub)
    return FailurePolicyOut(subscription=sub, policy=reply.policy, effective=reply.effective)


@router.put(
    "/topics/{ns}/{topic}/subscriptions/{sub}/failure-policy", response_model=FailurePolicyOut
)
async def put_failure_policy(
    ns: Namespace, topic: Topic, sub: Subscription, body: FailurePolicyIn, services: ServicesDep
) -> FailurePolicyOut:
    """Replace the subscription's failure policy (fields left out: the cluster's); the
    dispatcher serving it applies it at once, without a restart."""
    name = await _existing(services, ns, topic, sub)
    policy = body.stored()
    check_dead_letter_topic(name, policy)
    reply = await services.dispatcher.failure_policy(name, sub, policy)
    return FailurePolicyOut(subscription=sub, policy=reply.policy, effective=reply.effective)

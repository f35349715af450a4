"""The subscription routes of the admin API (docs/http-api.md): list a topic's subscriptions
with their cursors and backlog, delete one, read and set its failure policy, seek and skip.
:class:`SubscriptionAdmin` is part of :class:`danube.client.AsyncAdmin`
(``client.admin.seek(...)``)."""

from __future__ import annotations

from typing import Any

from pydantic import Field, model_validator

from danube.client._answers import AdminCalls
from danube.client._answers import parse_answer as _parse
from danube.client.errors import InvalidArgumentError
from danube.client.messages import Position, position_json, topic_name, topic_path
from danube.meta import failure_policy
from danube.names import InvalidNameError, TopicName, validate_segment
from danube.wire.api import catalog as api

# The answers are danube.wire.api's, the ones the server answers with (one definition each);
# each model here subclasses one and states only what a client tolerates beyond it: a field
# an older server may leave out (a default), a value a newer server may add (``str``), and
# the SDK's own models where answers nest. Unknown fields are ignored, as there.


class Owner(api.OwnerOut):
    """Who serves it now: a partition's leader, or the dispatcher of a subscription."""


class SubscriptionPartition(api.SubscriptionPartitionOut):
    """A subscription in one partition: ``cursor`` (every offset below it is acked; None
    before its first write), acks beyond it, the partition's end and the backlog between."""

    cursor: int | None = None
    acked_beyond: int = 0
    end_offset: int | None = None
    backlog: int | None = None


class Backoff(failure_policy.Backoff):
    """The redelivery backoff of a failure policy (None: the cluster's). Built as given:
    the server checks the bounds and the order (a 400 naming the field)."""

    base_ms: int | None = None
    max_ms: int | None = None

    @model_validator(mode="after")
    def _ordered(self) -> Backoff:  # in place of the record's check that base <= max
        return self


class FailurePolicy(failure_policy.FailurePolicy):
    """A subscription's failure policy (docs/http-api.md, "Failure policy"); a field None
    takes the cluster's value. Built as given: the server checks the bounds (a 400 naming
    the field)."""

    max_redeliveries: int | None = None
    ack_timeout_ms: int | None = None
    backoff: Backoff | None = None
    dead_letter_topic: str | None = None

    def body(self) -> dict[str, Any]:
        """The policy as a request body gives it (unset fields left out)."""
        return self.model_dump(exclude_none=True)


class FailurePolicyInfo(api.FailurePolicyOut):
    """A subscription's failure policy as set (None: never set) and as in effect."""

    policy: FailurePolicy | None = None
    effective: FailurePolicy


class SubscriptionConsumer(api.SubscriptionConsumerOut):
    """An attached consumer: its id, its name and the messages it holds unacked."""


class Subscription(api.SubscriptionOut):
    """A subscription: its type, the dispatcher serving it (None: none now), its backlog
    (sum of the partitions whose backlog is known), partitions and attached consumers."""

    type: str  # type: ignore[assignment]  # a newer server's types too
    owner: Owner | None = None
    backlog: int = 0
    partitions: list[SubscriptionPartition] = Field(default_factory=list)
    consumers: list[SubscriptionConsumer] = Field(default_factory=list)
    failure_policy: FailurePolicy | None = None  # as set (None: the cluster's)
    effective_failure_policy: FailurePolicy | None = None  # in effect, when served


class SeekPartition(api.SeekPartitionOut):
    """Where a seek put one partition's cursor."""


class Skip(api.SkipResponse):
    """What a skip did (see :meth:`AsyncAdmin.skip`)."""


class _SubscriptionList(api.SubscriptionList):
    topic: str = ""
    subscriptions: list[Subscription]


class _SeekAnswer(api.SeekResponse):
    partitions: list[SeekPartition]


class SubscriptionAdmin(AdminCalls):
    """A topic's subscriptions (mixed into :class:`danube.client.AsyncAdmin`)."""

    async def subscriptions(self, topic: str | TopicName) -> list[Subscription]:
        """Every subscription of a topic: type, cursors, backlog, consumers."""
        answer = await self._call("GET", f"/v1/topics/{_topic_path(topic)}/subscriptions")
        return _parse(_SubscriptionList, answer.body, "subscriptions").subscriptions

    async def delete_subscription(self, topic: str | TopicName, subscription: str) -> None:
        """Delete a subscription: its consumers are detached, its cursors removed;
        NotFoundError ``subscription_not_found``."""
        path = f"/v1/topics/{_topic_path(topic)}/subscriptions/{_subscription(subscription)}"
        await self._call("DELETE", path)

    async def failure_policy(self, topic: str | TopicName, subscription: str) -> FailurePolicyInfo:
        """The subscription's failure policy, as set and as in effect; NotFoundError
        ``subscription_not_found``."""
        path = f"/v1/topics/{_topic_path(topic)}/subscriptions/{_subscription(subscription)}"
        answer = await self._call("GET", f"{path}/failure-policy")
        return _parse(FailurePolicyInfo, answer.body, "failure policy")

    async def set_failure_policy(
        self, topic: str | TopicName, subscription: str, policy: FailurePolicy
    ) -> FailurePolicyInfo:
        """Replace the subscription's failure policy (fields None: the cluster's); the
        dispatcher serving it applies it at once. A value out of bounds: ApiError 400."""
        path = f"/v1/topics/{_topic_path(topic)}/subscriptions/{_subscription(subscription)}"
        answer = await self._call("PUT", f"{path}/failure-policy", body=policy.body())
        return _parse(FailurePolicyInfo, answer.body, "set failure policy")

    async def seek(
        self, topic: str | TopicName, subscription: str, position: Position
    ) -> list[SeekPartition]:
        """Move the subscription's cursor in every partition to ``position`` (``"earliest"``,
        ``"latest"``, an offset, or a :class:`Timestamp`); unacked messages are dropped,
        acked ones after it come again. Returns where each cursor now is."""
        path = f"/v1/topics/{_topic_path(topic)}/subscriptions/{_subscription(subscription)}"
        body = {"position": position_json(position)}
        # Not retried: a seek whose answer was lost moved the cursor; a second one would
        # drop what was delivered in between.
        answer = await self._http.request("POST", f"{path}/seek", body=body)
        return _parse(_SeekAnswer, answer.body, "seek").partitions

    async def skip(
        self,
        topic: str | TopicName,
        subscription: str,
        *,
        partition: int | None = None,
        to_offset: int | None = None,
    ) -> Skip:
        """Move one partition's cursor forward on purpose (``partition`` is its index;
        None for an unpartitioned topic): to ``to_offset``, or, when None, past the range
        no copy holds intact that stops it (``data_damaged``). The offsets skipped are never
        delivered to this subscription."""
        path = f"/v1/topics/{_topic_path(topic)}/subscriptions/{_subscription(subscription)}"
        body: dict[str, int] = {}
        if partition is not None:
            body["partition"] = partition
        if to_offset is not None:
            body["to_offset"] = to_offset
        # Not retried: a skip whose answer was lost moved the cursor.
        answer = await self._http.request("POST", f"{path}/skip", body=body)
        return _parse(Skip, answer.body, "skip")


def _subscription(name: str) -> str:
    try:
        return validate_segment("subscription", name)
    except InvalidNameError as exc:
        raise InvalidArgumentError(exc.message, code=exc.code) from exc


def _topic_path(topic: str | TopicName) -> str:
    return topic_path(topic_name(topic))

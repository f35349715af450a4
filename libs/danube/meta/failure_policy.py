"""A subscription's failure policy: what happens to a message its consumers keep refusing.

Stored with the subscription's config (``subscriptions/<ns>/<t>/<sub>/config``, field
``failure_policy``). Every field is optional: an unset one takes the cluster's value
(the ``dispatcher`` config section) when the policy is resolved (:meth:`FailurePolicy.resolve`),
so a cluster default changed later still applies to the fields a subscription never set.

- ``max_redeliveries``: a message is delivered at most ``1 + max_redeliveries`` times;
- ``ack_timeout_ms``: an unacked message is taken back this long after its delivery;
- ``backoff``: the wait before a message taken back by an ack timeout is delivered again:
  ``fixed`` (always ``base_ms``) or ``exponential`` (doubling from ``base_ms`` up to
  ``max_ms``, with equal jitter);
- ``poison_policy``: what becomes of a message refused once more than ``max_redeliveries``:
  ``dead_letter`` (stored in ``dead_letter_topic``, then acked), ``drop`` (acked and
  counted), ``block`` (kept at the head: nothing past it in its partition is delivered until
  it is acked, skipped or the policy changes; docs/dispatcher.md).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Literal, TypeVar

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, model_validator

from danube.names import InvalidNameError, TopicName

MAX_REDELIVERIES_MAX = 1000
ACK_TIMEOUT_MS_MIN = 100
ACK_TIMEOUT_MS_MAX = 3_600_000  # one hour, as the cluster's ack_timeout_s
BACKOFF_MS_MIN = 1
BACKOFF_MS_MAX = 86_400_000  # one day, as the cluster's redelivery_max_s

_T = TypeVar("_T")

PoisonPolicy = Literal["block", "drop", "dead_letter"]
BackoffKind = Literal["fixed", "exponential"]
# "/ns/topic": the dead-letter topic, unpartitioned (checked again as a TopicName where used).
TOPIC_PATTERN = r"^/[A-Za-z0-9_-]{1,64}/[A-Za-z0-9_-]{1,128}$"


def _dead_letter_topic(name: str) -> str:
    """``name`` if it is a topic a dead letter may go to: a valid name, not a partition."""
    try:
        topic = TopicName.parse(name)
    except InvalidNameError as exc:
        raise ValueError(exc.message) from exc
    if topic.partition is not None:
        raise ValueError(f"{name} is a partition; name its topic (dead-letter topics are whole)")
    return name


class _Policy(BaseModel):
    # Unknown fields are ignored on read, as in every stored record (a rolling upgrade);
    # requests use :class:`FailurePolicyIn`, which refuses them.
    model_config = ConfigDict(extra="ignore", frozen=True)


class Backoff(_Policy):
    """The redelivery backoff after an ack timeout; unset bounds take the cluster's."""

    kind: BackoffKind = "exponential"
    base_ms: Annotated[int, Field(ge=BACKOFF_MS_MIN, le=BACKOFF_MS_MAX)] | None = None
    max_ms: Annotated[int, Field(ge=BACKOFF_MS_MIN, le=BACKOFF_MS_MAX)] | None = None

    @model_validator(mode="after")
    def _ordered(self) -> Backoff:
        if self.base_ms is not None and self.max_ms is not None and self.base_ms > self.max_ms:
            raise ValueError(f"base_ms {self.base_ms} is above max_ms {self.max_ms}")
        return self


class FailurePolicy(_Policy):
    """A subscription's failure policy as set (``None``: the cluster's value)."""

    max_redeliveries: Annotated[int, Field(ge=0, le=MAX_REDELIVERIES_MAX)] | None = None
    ack_timeout_ms: Annotated[int, Field(ge=ACK_TIMEOUT_MS_MIN, le=ACK_TIMEOUT_MS_MAX)] | None = (
        None
    )
    backoff: Backoff | None = None
    poison_policy: PoisonPolicy | None = None
    dead_letter_topic: (
        Annotated[str, Field(pattern=TOPIC_PATTERN), AfterValidator(_dead_letter_topic)] | None
    ) = None

    def resolve(self, defaults: ResolvedPolicy) -> ResolvedPolicy:
        """Every field, the unset ones from ``defaults`` (the cluster's). A ``base_ms``
        above the cluster's maximum (``max_ms`` unset) raises the maximum to it: the base
        is what was asked for (both set out of order is refused when the policy is read)."""
        backoff = self.backoff or Backoff(kind=defaults.backoff_kind)
        base_ms = defaults.backoff_base_ms if backoff.base_ms is None else backoff.base_ms
        max_ms = defaults.backoff_max_ms if backoff.max_ms is None else backoff.max_ms
        if backoff.max_ms is not None and backoff.base_ms is None:
            base_ms = min(base_ms, max_ms)  # a lower max than the cluster's base: both lower
        return ResolvedPolicy(
            max_redeliveries=_or(self.max_redeliveries, defaults.max_redeliveries),
            ack_timeout_ms=_or(self.ack_timeout_ms, defaults.ack_timeout_ms),
            backoff_kind=backoff.kind,
            backoff_base_ms=base_ms,
            backoff_max_ms=max(max_ms, base_ms),
            poison_policy=_or(self.poison_policy, defaults.poison_policy),
            dead_letter_topic=_or(self.dead_letter_topic, defaults.dead_letter_topic),
        )


class BackoffIn(Backoff):
    """:class:`Backoff` as a request gives it: a misspelt field is refused, not ignored."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class FailurePolicyIn(FailurePolicy):
    """:class:`FailurePolicy` as a request gives it: a misspelt field would otherwise keep
    the cluster's value without a word, so unknown fields are refused."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    backoff: BackoffIn | None = None

    def stored(self) -> FailurePolicy:
        """The policy as it is stored and compared."""
        return FailurePolicy.model_validate(self.model_dump())


def _or(value: _T | None, default: _T) -> _T:
    return default if value is None else value


@dataclass(frozen=True, slots=True)
class ResolvedPolicy:
    """A failure policy with every field set. ``dead_letter_topic`` ``None`` means the
    default, ``<topic><dead_letter_suffix>`` (known only per topic)."""

    max_redeliveries: int = 5
    ack_timeout_ms: int = 30_000
    backoff_kind: BackoffKind = "exponential"
    backoff_base_ms: int = 1000
    backoff_max_ms: int = 60_000
    poison_policy: PoisonPolicy = "dead_letter"
    dead_letter_topic: str | None = None

    def __post_init__(self) -> None:
        if not 0 <= self.max_redeliveries <= MAX_REDELIVERIES_MAX:
            raise ValueError(f"max_redeliveries {self.max_redeliveries} out of 0..1000")
        if self.ack_timeout_ms <= 0 or not 0 < self.backoff_base_ms <= self.backoff_max_ms:
            raise ValueError("need ack_timeout_ms > 0 and 0 < backoff_base_ms <= backoff_max_ms")

    def as_policy(self) -> FailurePolicy:
        """The same policy as a :class:`FailurePolicy` with every field set (to show it)."""
        return FailurePolicy(
            max_redeliveries=self.max_redeliveries,
            ack_timeout_ms=self.ack_timeout_ms,
            backoff=Backoff(
                kind=self.backoff_kind, base_ms=self.backoff_base_ms, max_ms=self.backoff_max_ms
            ),
            poison_policy=self.poison_policy,
            dead_letter_topic=self.dead_letter_topic,
        )

"""The JSON bodies of topic and namespace policies (docs/policies.md): strict, unknown
fields refused, every number bounded (a 400 naming ``policies.<field>`` past a bound)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field

from danube.discovery.catalog.growth import grown
from danube.discovery.errors import BadRequestError
from danube.meta import TopicName
from danube.meta.records import (
    BACKLOG_MESSAGES_MAX,
    CHUNKED_BYTES_MAX,
    MESSAGE_ID_WINDOW_MAX_S,
    MESSAGE_TTL_MAX_S,
    POLICY_COUNT_MAX,
    RATE_BYTES_MAX,
    RATE_MSGS_MAX,
    BacklogPolicy,
    Policies,
    RetentionMode,
    TopicConfig,
)
from danube.names import PARTITIONS_MAX

Count = Annotated[int, Field(ge=1, le=POLICY_COUNT_MAX)]


class PoliciesSpec(BaseModel):
    """A topic's or namespace's policies. In a ``PUT`` an absent or ``null`` field is not
    set (inherited); in a ``PATCH`` the fields given replace the stored ones (``null``
    unsets one) and the others stay."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    max_producers: Count | None = None
    max_subscriptions: Count | None = None
    max_consumers_per_subscription: Count | None = None
    publish_rate_msgs_s: Annotated[int, Field(ge=1, le=RATE_MSGS_MAX)] | None = None
    publish_rate_bytes_s: Annotated[int, Field(ge=1, le=RATE_BYTES_MAX)] | None = None
    # At most ingest.max_message_bytes (checked against the settings: check_message_size).
    max_message_bytes: Annotated[int, Field(ge=1, le=2**31)] | None = None
    backlog_quota_messages: Annotated[int, Field(ge=1, le=BACKLOG_MESSAGES_MAX)] | None = None
    backlog_quota_policy: BacklogPolicy | None = None
    message_id_window_s: Annotated[int, Field(ge=1, le=MESSAGE_ID_WINDOW_MAX_S)] | None = None
    message_ttl_s: Annotated[int, Field(ge=1, le=MESSAGE_TTL_MAX_S)] | None = None
    max_chunked_message_bytes: Annotated[int, Field(ge=1, le=CHUNKED_BYTES_MAX)] | None = None
    retention_mode: RetentionMode | None = None

    def stored(self) -> Policies:
        """The stored form of a ``PUT``."""
        return Policies.model_validate(self.model_dump())

    def applied_to(self, current: Policies) -> Policies:
        """``current`` with the fields given in this ``PATCH`` replaced."""
        given = {field: getattr(self, field) for field in self.model_fields_set}
        return Policies.model_validate({**current.model_dump(), **given})


class TopicPatch(BaseModel):
    """``PATCH /v1/topics/{ns}/{topic}``: change a topic's policies in place, and grow its
    partitions (``partitions``: the new count, never fewer: danube.discovery.catalog.growth)."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    partitions: Annotated[int, Field(ge=1, le=PARTITIONS_MAX)] | None = None
    policies: PoliciesSpec = PoliciesSpec()

    def change(self, topic: TopicName) -> Callable[[TopicConfig], TopicConfig]:
        """What it does to ``topic``'s config: grow its partitions (exactly to the count
        given: danube.discovery.catalog.growth), then apply its policies."""

        def change(config: TopicConfig) -> TopicConfig:
            if self.partitions is not None:
                config = grown(config, topic, self.partitions, exact=True)
            return config.model_copy(update={"policies": self.policies.applied_to(config.policies)})

        return change


def check_message_size(policies: PoliciesSpec | None, cap_bytes: int) -> None:
    """400 ``invalid_request`` naming the field when ``max_message_bytes`` is over the
    cluster's ``ingest.max_message_bytes`` (nothing larger can be stored anyway)."""
    if policies is not None and (policies.max_message_bytes or 0) > cap_bytes:
        raise BadRequestError(
            f"policies.max_message_bytes: {policies.max_message_bytes} is over the cluster's "
            f"ingest.max_message_bytes of {cap_bytes}",
            code="invalid_request",
        )

"""Admission: one decision for every produce and consume door (DESIGN §10, issue 33).

A door authenticates its caller its own way (a bearer token or a client certificate, read
from HTTP headers or gRPC metadata) into a principal (a ``str``, ``"anonymous"`` with
security off), decodes its body into :class:`Messages`, and calls::

    admitted = await admission.produce(principal, topic, messages, producer_id=...)

It gets an :class:`Admitted` (the topic's policies, the schema stamp, the sequence run) or a
DanubeError whose ``code`` and kind are the same whichever door asked; the door answers the
kind with its status (discovery's HTTP: danube.discovery.errors, every gRPC door:
danube.grpc_door.status). Nothing here knows a web framework, an HTTP body or a gRPC message:
doors translate, this decides.

The checks of a produce, in order (the first refusal answers; nothing is stored):

1. RBAC: ``produce`` on the topic (403 ``permission_denied``); none with security off.
2. Producer sessions: an exclusive producer other than ``producer_id`` holds the topic
   (409 ``producer_fenced``), from the instance's view of the holders: no I/O.
3. Sequences: an idempotent producer's messages keep to danube.admission.sequences
   (400 ``invalid_sequence``).
4. The instance's limits: messages per request (413 ``too_many_messages``), payload bytes
   (413 ``payload_too_large``).
5. The topic's policies, from the cache: ``max_message_bytes`` (413 ``payload_too_large``),
   ``max_chunked_message_bytes`` (413 ``chunked_message_too_large``, 400 ``invalid_chunk``).
6. The topic's schema: the stamp its records carry, the payloads checked per the binding's
   policy (400 ``schema_violation``, ``schema_mismatch``, ``schema_not_found``).

Where it lives: in the libs (danube.admission), so that every door builds the same one
from the same pieces, discovery's proxy doors and an ingest leader's direct door alike
(:func:`danube.admission.build`). It reaches its collaborators only through the Protocols
below; their implementations are beside it (the policy cache, the schema gate, the view
of exclusive producers) or danube.security.gate's (RBAC), and its error classes are
danube.errors'. What it refuses it counts in the counters it is given
(danube.admission.counters: each service registers its own set).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from prometheus_client import Counter

from danube.admission.chunks import check_chunked, check_chunked_frames, chunked_limit
from danube.admission.payloads import LazyPayloads, check_payload_sizes
from danube.admission.sequences import Sequencing, frames_sequencing
from danube.config import DanubeSettings
from danube.errors import TooLargeError
from danube.frame.produce import ProducedFrames
from danube.meta import TopicName
from danube.meta.records import Policies, TopicConfig
from danube.security import Permission, Resource


@dataclass(frozen=True, slots=True)
class Stamp:
    """What a batch's records carry: the schema (its id and version) they were checked
    against (danube.admission.schema_gate)."""

    schema_id: int
    version: int


Principal = str
"""Who asks: a token's ``sub`` or a client certificate's subject; ``"anonymous"`` with
security off. Every door's authentication yields one."""


# --- what a door hands in ------------------------------------------------------------------


class Messages(Protocol):
    """The messages of one produce as a door decoded them. Only what admission reads: a
    door whose body is large (binary frames) gives views, not copies."""

    def __len__(self) -> int:
        """How many messages."""
        ...

    def sequencing(self) -> Sequencing | None:
        """Their run of sequences (None: unsequenced); 400 ``invalid_sequence``."""
        ...

    def payload_sizes(self, payload_bytes_max: int) -> Sequence[int]:
        """Each payload's size, in order. A door that decodes payloads here (JSON's base64)
        refuses the first one over ``payload_bytes_max`` as it goes."""
        ...

    def payloads(self) -> Sequence[bytes]:
        """The payloads (read for a topic with a schema only)."""
        ...

    def check_chunked(self, limit: int) -> None:
        """Refuse a chunk claiming a whole message over ``limit`` (produce_chunks)."""
        ...


class FramesMessages:
    """A binary body's checked frames (danube.frame.produce): sizes read by the scan,
    payloads copied out only for a schema check."""

    __slots__ = ("frames",)

    def __init__(self, frames: ProducedFrames) -> None:
        self.frames = frames

    def __len__(self) -> int:
        return len(self.frames)

    def sequencing(self) -> Sequencing | None:
        return frames_sequencing(self.frames)

    def payload_sizes(self, payload_bytes_max: int) -> Sequence[int]:
        return self.frames.payload_sizes

    def payloads(self) -> Sequence[bytes]:
        return LazyPayloads(self.frames)

    def check_chunked(self, limit: int) -> None:
        check_chunked_frames(self.frames, limit)


class PayloadMessages:
    """Payloads already decoded, each with its attributes (a gRPC message); unsequenced."""

    __slots__ = ("_attributes", "_payloads")

    def __init__(self, payloads: Sequence[bytes], attributes: Sequence[Mapping[str, str]]) -> None:
        self._payloads = payloads
        self._attributes = attributes

    def __len__(self) -> int:
        return len(self._payloads)

    def sequencing(self) -> Sequencing | None:
        return None

    def payload_sizes(self, payload_bytes_max: int) -> Sequence[int]:
        return [len(payload) for payload in self._payloads]

    def payloads(self) -> Sequence[bytes]:
        return self._payloads

    def check_chunked(self, limit: int) -> None:
        check_chunked(self._attributes, limit)


# --- what admission is built from ----------------------------------------------------------


class Authorizer(Protocol):
    """RBAC (danube.security.gate.SecurityGate): counts and audits its denials."""

    @property
    def enabled(self) -> bool:
        """False: everything is allowed (nothing to ask, not even a resource to build)."""
        ...

    def authorize(
        self, principal: str, permission: Permission, resource: Resource, *, action: str
    ) -> None:
        """Nothing when allowed, else PermissionDeniedError."""
        ...


class PolicySource(Protocol):
    """The policies in effect for a topic, from a cache (danube.admission.policies.PolicyCache,
    which discovery's catalog extends with its writes)."""

    async def effective_policies(self, topic: TopicName) -> tuple[TopicConfig | None, Policies]:
        """The topic's config (None before it exists) and its policies over its namespace's."""
        ...


class SchemaCheck(Protocol):
    """The topics' schema bindings (danube.admission.schema_gate.SchemaGate)."""

    async def admit(
        self,
        topic: TopicName,
        payloads: Sequence[bytes],
        *,
        schema_id: int | None = None,
        version: int | None = None,
    ) -> Stamp | None:
        """The stamp of ``payloads`` (None: no schema), or their refusal."""
        ...


class Fence(Protocol):
    """Exclusive producers as this instance sees them
    (danube.admission.exclusive.ExclusiveView)."""

    def check(self, topic: TopicName, producer_id: str | None) -> None:
        """Refuse (409 ``producer_fenced``) anyone but the exclusive holders of ``topic``."""
        ...


@dataclass(frozen=True, slots=True)
class ProduceLimits:
    """What one produce may carry on this instance, whatever the topic's policies."""

    messages_max: int
    payload_bytes_max: int

    @classmethod
    def from_settings(cls, settings: DanubeSettings) -> ProduceLimits:
        """``discovery.max_produce_messages`` and ``ingest.max_message_bytes``."""
        return cls(
            messages_max=settings.discovery.max_produce_messages,
            payload_bytes_max=settings.ingest.max_message_bytes,
        )


@dataclass(frozen=True, slots=True)
class Admitted:
    """A produce admitted: what storing it needs from admission."""

    topic: TopicName
    policies: Policies
    stamp: Stamp | None  # the schema its records are stamped with (None: no schema)
    sequencing: Sequencing | None  # an idempotent producer's run (None: unsequenced)
    # The topic's config as the policies were read with it (None: the topic does not exist).
    config: TopicConfig | None = None


class Admission:
    """RBAC, producer sessions, limits, policies and schemas: the one decision of every
    door (the module's docstring has the order)."""

    def __init__(
        self,
        limits: ProduceLimits,
        *,
        security: Authorizer,
        policies: PolicySource,
        fence: Fence,
        schemas: SchemaCheck | None = None,
        refusals: Counter | None = None,
    ) -> None:
        """``refusals``: counts what the limits and policies refuse, by code
        (AdmissionCounters.policy_refusals; None: not counted)."""
        self.limits = limits
        self.security = security
        self.policies = policies
        self.fence = fence
        self.schemas = schemas
        self.refusals = refusals

    async def produce(
        self,
        principal: Principal,
        topic: TopicName,
        messages: Messages,
        *,
        producer_id: str | None = None,
        schema_id: int | None = None,
        schema_version: int | None = None,
        action: str = "produce",
    ) -> Admitted:
        """Admit ``messages`` from ``principal`` to ``topic`` (a topic or one partition),
        or raise the first refusal. ``producer_id``: the caller's producer session, if it
        has one; ``schema_id`` / ``schema_version``: the schema it wrote with, if it says;
        ``action``: how the door names the call in the audit log."""
        security = self.security
        if security.enabled:  # the hot path without security builds no resource
            security.authorize(principal, Permission.Produce, Resource.topic(topic), action=action)
        self.fence.check(topic, producer_id)
        sequencing = messages.sequencing()
        limits = self.limits
        try:
            if len(messages) > limits.messages_max:
                raise TooLargeError(
                    f"{len(messages)} messages, over the limit of {limits.messages_max} "
                    "per request",
                    code="too_many_messages",
                    limit=limits.messages_max,
                )
            sizes = messages.payload_sizes(limits.payload_bytes_max)
            check_payload_sizes(sizes, limits.payload_bytes_max)
            config, policies = await self.policies.effective_policies(topic)
            check_payload_sizes(sizes, self.payload_bytes_max(policies))
            messages.check_chunked(chunked_limit(policies))
        except TooLargeError as exc:
            if self.refusals is not None:
                self.refusals.labels(exc.code).inc()
            raise
        stamp = None
        if self.schemas is not None:
            stamp = await self.schemas.admit(
                topic, messages.payloads(), schema_id=schema_id, version=schema_version
            )
        return Admitted(topic, policies, stamp, sequencing, config)

    def consume(self, principal: Principal, topic: TopicName, *, action: str) -> None:
        """Admit ``principal`` to consume from ``topic`` (a topic or one partition), or
        raise PermissionDeniedError. Nothing to wait for: RBAC is decided from memory."""
        if self.security.enabled:
            self.security.authorize(
                principal, Permission.Consume, Resource.topic(topic), action=action
            )

    def payload_bytes_max(self, policies: Policies) -> int:
        """The largest payload a topic with ``policies`` takes: its ``max_message_bytes``,
        never more than the instance's limit."""
        limit = self.limits.payload_bytes_max
        return min(policies.max_message_bytes or limit, limit)

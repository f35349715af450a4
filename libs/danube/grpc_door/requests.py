"""What a gRPC door takes from a request, held to the rules the HTTP API holds the same
values to, so a handler works on valid values only and a bad one is refused
``INVALID_ARGUMENT`` with the HTTP API's code (docs/grpc-api.md, "Bad input"):

- bytes that are not a message of the method's type (garbage, a truncated varint, a string
  that is not UTF-8): :func:`decoder` never raises (gRPC would answer ``UNKNOWN`` with the
  exception's class); it gives the server's wrapper a :class:`Malformed`, refused
  ``invalid_request``;
- topic and partition names: :func:`danube.names.client_topic` (the user-topic
  rules of :mod:`danube.names`, a partition below ``PARTITIONS_MAX``), ``invalid_name``;
  subscriptions: :func:`danube.names.validate_segment`, ``invalid_name``;
- a producer's and a consumer's settings: the HTTP API's own models (``ProducerOpen``,
  ``ConsumerOpen``: danube.wire.opens) through :func:`danube.wire.validation.checked`,
  ``invalid_request`` naming the field by its gRPC name;
- an enum value this server does not know (proto3 enums are open: any number decodes):
  ``invalid_request``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from google.protobuf.message import DecodeError

from danube.errors import BadRequestError
from danube.meta.records import AccessMode, Dispatch
from danube.names import validate_segment
from danube.wire import DanubeApi_pb2 as pb
from danube.wire.opens import ConsumerOpen, ProducerOpen
from danube.wire.validation import checked

SUBSCRIPTION_TYPES: dict[int, str] = {
    pb.ConsumerRequest.Exclusive: "exclusive",
    pb.ConsumerRequest.Shared: "shared",
    pb.ConsumerRequest.Failover: "failover",
    pb.ConsumerRequest.KeyShared: "key_shared",
}
DISPATCH: dict[int, Dispatch] = {pb.NonReliable: "non_reliable", pb.Reliable: "reliable"}
ACCESS_MODES: dict[int, AccessMode] = {pb.Shared: "shared", pb.Exclusive: "exclusive"}
CLIENT_TYPES: dict[int, str] = {
    pb.HealthCheckRequest.Producer: "producer",
    pb.HealthCheckRequest.Consumer: "consumer",
}
# What a refusal quotes of protobuf's reason (its own words, never an exception class).
_REASON_CHARS_MAX = 200

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Malformed:
    """A request whose bytes are not a ``type_name`` message; ``reason`` says why."""

    type_name: str
    reason: str

    def error(self) -> BadRequestError:
        """The refusal: ``invalid_request``, as a body the HTTP API cannot read."""
        return BadRequestError(
            f"the request is not a valid {self.type_name} message: {self.reason}",
            code="invalid_request",
        )


def _reason(exc: Exception) -> str:
    if not isinstance(exc, DecodeError):
        return "its bytes do not decode"
    # protobuf says "Error parsing message with type '<type>': <why>"; the why is the news.
    text = str(exc)
    why = text.rpartition("': ")[2] if "': " in text else text
    return why[:_REASON_CHARS_MAX] or "its bytes do not decode"


def decoder(request_type: Any) -> Callable[[bytes], Any]:
    """A request deserializer for ``request_type`` that answers a :class:`Malformed` instead
    of raising."""
    type_name = request_type.DESCRIPTOR.full_name

    def decode(data: bytes) -> Any:
        try:
            return request_type.FromString(data)
        except Exception as exc:  # DecodeError; anything else a parser raises on bytes too
            return Malformed(type_name, _reason(exc))

    return decode


def known(table: Mapping[int, T], value: int, field: str) -> T:
    """The meaning of enum ``field``'s ``value``; ``invalid_request`` for a number this
    server does not know."""
    meaning = table.get(value)
    if meaning is None:
        raise BadRequestError(
            f"{field}: unknown value {value} (known: {sorted(table)})", code="invalid_request"
        )
    return meaning


def producer_open(request: Any) -> ProducerOpen:
    """A ``ProducerRequest``'s name and access mode, by the rules of ``POST …/producers``."""
    mode = known(ACCESS_MODES, request.producer_access_mode, "producer_access_mode")
    return checked(
        ProducerOpen,
        {"name": request.producer_name, "access_mode": mode},
        {"name": "producer_name", "access_mode": "producer_access_mode"},
    )


def dispatch(request: Any) -> Dispatch:
    """A ``ProducerRequest``'s dispatch strategy."""
    return known(DISPATCH, request.dispatch_strategy, "dispatch_strategy")


def subscription(value: str, field: str = "subscription") -> str:
    """A subscription name: a segment, as in the HTTP API's paths (``invalid_name``)."""
    return validate_segment(field, value)


def attach(request: Any) -> ConsumerOpen:
    """A ``ConsumerRequest``'s consumer name, type and key filters, by the rules of
    ``POST …/subscriptions/{sub}/consumers`` (its subscription: :func:`subscription`)."""
    sub_type = known(SUBSCRIPTION_TYPES, request.subscription_type, "subscription_type")
    return checked(
        ConsumerOpen,
        {"name": request.consumer_name, "type": sub_type, "key_filters": list(request.key_filters)},
        {"name": "consumer_name", "type": "subscription_type"},
    )


def client_type(request: Any) -> str:
    """A ``HealthCheckRequest``'s client kind: ``producer`` or ``consumer``."""
    return known(CLIENT_TYPES, request.client, "client")

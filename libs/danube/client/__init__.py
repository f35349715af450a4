"""The Danube mesh client SDK: produce, consume and administer over the public HTTP API v1
(docs/http-api.md; guide in docs/client.md).

::

    async with AsyncDanubeClient("http://127.0.0.1:8080") as client:
        async with client.producer("/default/orders") as producer:
            stored = await producer.send_and_wait(b"hello", key="user-1")
        async with client.consumer("/default/orders", "billing", start="earliest") as consumer:
            async for message in consumer:
                message.ack()

:class:`DanubeClient` is the same API, blocking. Every error is a
:class:`~danube.client.errors.ClientError` (a :class:`danube.errors.DanubeError`) with a
``code``; those the server answered carry its code and HTTP ``status``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from danube.lazy import LazyNames

if TYPE_CHECKING:
    from danube.client._chunking import ChunkedMessage, IncompleteMessageError
    from danube.client.admin import (
        AsyncAdmin,
        Cluster,
        Lookup,
        Namespace,
        Policies,
        ProducerInfo,
        Retention,
        Topic,
        TopicConfig,
        TopicDescription,
    )
    from danube.client.client import DEFAULT_URL, AsyncDanubeClient
    from danube.client.consumer import AsyncConsumer, ConsumerOptions
    from danube.client.delay import deliver_after, deliver_at
    from danube.client.elastic import DrainStatus, Reassignment, Reassignments, ReplicaAssignment
    from danube.client.errors import (
        ApiError,
        BadRequestError,
        ClientError,
        ClosedError,
        ConflictError,
        DeadlineExceededError,
        InvalidArgumentError,
        InvalidMessageError,
        NotFoundError,
        OverLimitError,
        PermissionDeniedError,
        ProtocolError,
        ServerError,
        TooLargeError,
        TransportError,
        UnauthenticatedError,
        UnavailableError,
    )
    from danube.client.messages import (
        Message,
        MessageRef,
        Position,
        ReceivedMessage,
        SendResult,
        Timestamp,
    )
    from danube.client.multi import AsyncMultiConsumer
    from danube.client.producer import AsyncProducer, ProducerOptions
    from danube.client.retry import RetryPolicy
    from danube.client.schemas import (
        AsyncSchemas,
        Compatibility,
        Registered,
        SchemaVersion,
        TopicSchema,
    )
    from danube.client.subscriptions import (
        Backoff,
        FailurePolicy,
        FailurePolicyInfo,
        SeekPartition,
        Skip,
        Subscription,
    )
    from danube.client.sync import Admin, Consumer, DanubeClient, Producer, Schemas
    from danube.client.tls import ClientTls
    from danube.wire.delay import DELIVER_AFTER_ATTRIBUTE, DELIVER_AT_ATTRIBUTE
    from danube.wire.delivery import TTL_ATTRIBUTE

# Each public name and the module that defines it, imported on first use: `import
# danube.client` (and every command of the CLI) costs a few milliseconds instead of the
# whole SDK with httpx, pydantic and websockets (about 0.3 s).
_HOMES = {
    "AsyncMultiConsumer": "danube.client.multi",
    "TTL_ATTRIBUTE": "danube.wire.delivery",
    "DELIVER_AT_ATTRIBUTE": "danube.wire.delay",
    "DELIVER_AFTER_ATTRIBUTE": "danube.wire.delay",
    "deliver_after": "danube.client.delay",
    "deliver_at": "danube.client.delay",
    "Admin": "danube.client.sync",
    "ApiError": "danube.client.errors",
    "AsyncAdmin": "danube.client.admin",
    "AsyncConsumer": "danube.client.consumer",
    "AsyncDanubeClient": "danube.client.client",
    "AsyncProducer": "danube.client.producer",
    "AsyncSchemas": "danube.client.schemas",
    "Backoff": "danube.client.subscriptions",
    "BadRequestError": "danube.client.errors",
    "ChunkedMessage": "danube.client._chunking",
    "ClientError": "danube.client.errors",
    "ClientTls": "danube.client.tls",
    "ClosedError": "danube.client.errors",
    "Cluster": "danube.client.admin",
    "Compatibility": "danube.client.schemas",
    "ConflictError": "danube.client.errors",
    "Consumer": "danube.client.sync",
    "ConsumerOptions": "danube.client.consumer",
    "DEFAULT_URL": "danube.client.client",
    "DanubeClient": "danube.client.sync",
    "DeadlineExceededError": "danube.client.errors",
    "DrainStatus": "danube.client.elastic",
    "FailurePolicy": "danube.client.subscriptions",
    "FailurePolicyInfo": "danube.client.subscriptions",
    "IncompleteMessageError": "danube.client._chunking",
    "InvalidArgumentError": "danube.client.errors",
    "InvalidMessageError": "danube.client.errors",
    "Lookup": "danube.client.admin",
    "Message": "danube.client.messages",
    "MessageRef": "danube.client.messages",
    "Namespace": "danube.client.admin",
    "NotFoundError": "danube.client.errors",
    "OverLimitError": "danube.client.errors",
    "PermissionDeniedError": "danube.client.errors",
    "Policies": "danube.client.admin",
    "Position": "danube.client.messages",
    "Producer": "danube.client.sync",
    "ProducerInfo": "danube.client.admin",
    "ProducerOptions": "danube.client.producer",
    "ProtocolError": "danube.client.errors",
    "Reassignment": "danube.client.elastic",
    "Reassignments": "danube.client.elastic",
    "ReceivedMessage": "danube.client.messages",
    "Registered": "danube.client.schemas",
    "ReplicaAssignment": "danube.client.elastic",
    "Retention": "danube.client.admin",
    "RetryPolicy": "danube.client.retry",
    "SchemaVersion": "danube.client.schemas",
    "Schemas": "danube.client.sync",
    "SeekPartition": "danube.client.subscriptions",
    "SendResult": "danube.client.messages",
    "ServerError": "danube.client.errors",
    "Skip": "danube.client.subscriptions",
    "Subscription": "danube.client.subscriptions",
    "Timestamp": "danube.client.messages",
    "TooLargeError": "danube.client.errors",
    "Topic": "danube.client.admin",
    "TopicConfig": "danube.client.admin",
    "TopicDescription": "danube.client.admin",
    "TopicSchema": "danube.client.schemas",
    "TransportError": "danube.client.errors",
    "UnauthenticatedError": "danube.client.errors",
    "UnavailableError": "danube.client.errors",
}


_LAZY = LazyNames(__name__, globals(), _HOMES)


def __getattr__(name: str) -> Any:
    return _LAZY.load(name)


def __dir__() -> list[str]:
    return _LAZY.names()


__all__ = [
    "DEFAULT_URL",
    "DELIVER_AFTER_ATTRIBUTE",
    "DELIVER_AT_ATTRIBUTE",
    "TTL_ATTRIBUTE",
    "Admin",
    "ApiError",
    "AsyncAdmin",
    "AsyncConsumer",
    "AsyncDanubeClient",
    "AsyncMultiConsumer",
    "AsyncProducer",
    "AsyncSchemas",
    "Backoff",
    "BadRequestError",
    "ChunkedMessage",
    "ClientError",
    "ClientTls",
    "ClosedError",
    "Cluster",
    "Compatibility",
    "ConflictError",
    "Consumer",
    "ConsumerOptions",
    "DanubeClient",
    "DeadlineExceededError",
    "DrainStatus",
    "FailurePolicy",
    "FailurePolicyInfo",
    "IncompleteMessageError",
    "InvalidArgumentError",
    "InvalidMessageError",
    "Lookup",
    "Message",
    "MessageRef",
    "Namespace",
    "NotFoundError",
    "OverLimitError",
    "PermissionDeniedError",
    "Policies",
    "Position",
    "Producer",
    "ProducerInfo",
    "ProducerOptions",
    "ProtocolError",
    "Reassignment",
    "Reassignments",
    "ReceivedMessage",
    "Registered",
    "ReplicaAssignment",
    "Retention",
    "RetryPolicy",
    "SchemaVersion",
    "Schemas",
    "SeekPartition",
    "SendResult",
    "ServerError",
    "Skip",
    "Subscription",
    "Timestamp",
    "TooLargeError",
    "Topic",
    "TopicConfig",
    "TopicDescription",
    "TopicSchema",
    "TransportError",
    "UnauthenticatedError",
    "UnavailableError",
    "deliver_after",
    "deliver_at",
]

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

from danube.client.admin import (
    AsyncAdmin,
    Backoff,
    Cluster,
    FailurePolicy,
    FailurePolicyInfo,
    Lookup,
    Namespace,
    Policies,
    ProducerInfo,
    Retention,
    SeekPartition,
    Skip,
    Subscription,
    Topic,
    TopicConfig,
    TopicDescription,
)
from danube.client.client import DEFAULT_URL, AsyncDanubeClient
from danube.client.consumer import AsyncConsumer, ConsumerOptions
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
from danube.client.sync import Admin, Consumer, DanubeClient, Producer, Schemas
from danube.client.tls import ClientTls
from danube.wire.delivery import TTL_ATTRIBUTE

__all__ = [
    "DEFAULT_URL",
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
]

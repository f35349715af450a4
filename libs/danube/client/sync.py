"""The blocking client: the async client run on an event loop of its own, in one daemon
thread per :class:`DanubeClient`.

One implementation of batching, retries, the stream and acks serves both APIs; each blocking
call hands a coroutine to that loop and waits for it. A call interrupted in the caller's
thread (Ctrl-C) cancels its coroutine, so nothing keeps running in the background for it.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Coroutine, Iterator, Mapping
from typing import Any, TypeVar

import httpx

from danube.client.admin import (
    AsyncAdmin,
    Cluster,
    Dispatch,
    Durability,
    Lookup,
    Namespace,
    Policies,
    ProducerInfo,
    Retention,
    Topic,
    TopicDescription,
)
from danube.client.client import DEFAULT_TIMEOUT_S, DEFAULT_URL, AsyncDanubeClient
from danube.client.consumer import AsyncConsumer, ConsumerOptions
from danube.client.errors import ClosedError
from danube.client.messages import Message, Payload, Position, ReceivedMessage, SendResult
from danube.client.producer import AsyncProducer, ProducerOptions
from danube.client.retry import RetryPolicy
from danube.client.schemas import (
    AsyncSchemas,
    Compatibility,
    Registered,
    SchemaType,
    SchemaVersion,
    TopicSchema,
    ValidationPolicy,
)
from danube.client.subscriptions import SeekPartition, Subscription
from danube.client.tls import ClientTls
from danube.names import TopicName

_T = TypeVar("_T")

# Closing the client (flushing its producers, detaching its consumers) takes at most this.
CLOSE_TIMEOUT_S = 60.0


class _Portal:
    """An event loop running in a daemon thread; blocking calls run coroutines on it."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self.loop.run_forever, name="danube-client", daemon=True
        )
        self._thread.start()

    def submit(self, coro: Coroutine[Any, Any, _T]) -> concurrent.futures.Future[_T]:
        """Start ``coro`` on the loop."""
        if threading.current_thread() is self._thread:
            coro.close()
            raise RuntimeError("a blocking client call from inside the client's own loop")
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def call(self, coro: Coroutine[Any, Any, _T], timeout_s: float | None = None) -> _T:
        """Run ``coro`` on the loop and wait for its outcome."""
        future = self.submit(coro)
        try:
            return future.result(timeout_s)
        except BaseException:
            future.cancel()  # Ctrl-C or a timeout here: stop the coroutine too
            raise

    def stop(self) -> None:
        """Stop the loop and its thread."""
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join()
        self.loop.close()


async def _construct(factory: Any, *args: Any, **kwargs: Any) -> Any:
    # The async objects are made inside the loop they will run on.
    return factory(*args, **kwargs)


class DanubeClient:
    """The blocking twin of :class:`AsyncDanubeClient` (same arguments); use as ``with``
    or call :meth:`close`."""

    def __init__(
        self,
        url: str = DEFAULT_URL,
        *,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        retry: RetryPolicy | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
        tls: ClientTls | None = None,
        token: str | None = None,
    ) -> None:
        self._portal = _Portal()
        try:
            self._client: AsyncDanubeClient = self._portal.call(
                _construct(
                    AsyncDanubeClient,
                    url,
                    timeout_s=timeout_s,
                    retry=retry,
                    transport=transport,
                    tls=tls,
                    token=token,
                )
            )
        except BaseException:
            self._portal.stop()
            raise
        self.url = url
        self.admin = Admin(self._portal, self._client.admin)
        self.schemas = Schemas(self._portal, self._client.schemas)
        self._closed = False

    def __enter__(self) -> DanubeClient:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def producer(
        self, topic: str | TopicName, options: ProducerOptions | None = None, **overrides: Any
    ) -> Producer:
        """A producer to ``topic`` (see :meth:`AsyncDanubeClient.producer`)."""
        producer = self._portal.call(_construct(self._client.producer, topic, options, **overrides))
        return Producer(self._portal, producer)

    def consumer(
        self,
        topic: str | TopicName,
        subscription: str,
        options: ConsumerOptions | None = None,
        **overrides: Any,
    ) -> Consumer:
        """A consumer, not attached yet (``with`` or :meth:`Consumer.start` attaches)."""
        consumer = self._portal.call(
            _construct(self._client.consumer, topic, subscription, options, **overrides)
        )
        return Consumer(self._portal, consumer)

    def subscribe(
        self,
        topic: str | TopicName,
        subscription: str,
        options: ConsumerOptions | None = None,
        **overrides: Any,
    ) -> Consumer:
        """:meth:`consumer`, attached."""
        consumer = self.consumer(topic, subscription, options, **overrides)
        consumer.start()
        return consumer

    def close(self) -> None:
        """Flush and close every producer and consumer made here, then stop the loop."""
        if self._closed:
            return
        self._closed = True
        try:
            self._portal.call(self._client.close(), CLOSE_TIMEOUT_S)
        finally:
            self._portal.stop()


class Producer:
    """The blocking twin of :class:`AsyncProducer`."""

    def __init__(self, portal: _Portal, producer: AsyncProducer) -> None:
        self._portal = portal
        self._producer = producer
        self.topic = producer.topic
        self.name = producer.name  # unique when left at the default and idempotent
        self.idempotent = producer.idempotent

    def __enter__(self) -> Producer:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def send(
        self,
        payload: Payload | Message,
        *,
        key: str | None = None,
        attributes: Mapping[str, str] | None = None,
    ) -> concurrent.futures.Future[SendResult]:
        """Queue a message (blocking while the queue is full); the future resolves to
        where it was stored. A message that breaks a limit raises here."""
        if self._producer.would_chunk(payload):  # a large message: its chunks, in the loop
            queued = self._portal.call(self._producer.send(payload, key=key, attributes=attributes))
        else:
            body = self._producer.encode(payload, key=key, attributes=attributes)
            queued = self._portal.call(self._producer.send_encoded(body))
        result: concurrent.futures.Future[SendResult] = concurrent.futures.Future()

        def copy(done: asyncio.Future[SendResult]) -> None:
            if done.cancelled():
                result.cancel()
            elif (error := done.exception()) is not None:
                result.set_exception(error)
            else:
                result.set_result(done.result())

        self._portal.loop.call_soon_threadsafe(queued.add_done_callback, copy)
        return result

    def send_and_wait(
        self,
        payload: Payload | Message,
        *,
        key: str | None = None,
        attributes: Mapping[str, str] | None = None,
    ) -> SendResult:
        """:meth:`send`, then wait for the result."""
        return self.send(payload, key=key, attributes=attributes).result()

    def flush(self) -> None:
        """Send everything queued now and wait until each message is settled."""
        self._portal.call(self._producer.flush())

    def close(self) -> None:
        """Flush, then stop; later sends raise :class:`ClosedError`."""
        self._portal.call(self._producer.close())


class Consumer:
    """The blocking twin of :class:`AsyncConsumer`; iterate it for messages."""

    def __init__(self, portal: _Portal, consumer: AsyncConsumer) -> None:
        self._portal = portal
        self._consumer = consumer
        self.topic = consumer.topic
        self.subscription = consumer.subscription

    @property
    def consumer_id(self) -> str:
        """The id the server knows this consumer by."""
        return self._consumer.consumer_id

    def __enter__(self) -> Consumer:
        self.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def start(self) -> None:
        """Attach and start receiving in the background."""
        self._portal.call(self._consumer.start())

    def receive(self, timeout_s: float | None = None) -> ReceivedMessage:
        """The next message, waiting at most ``timeout_s`` (None: as long as it takes)."""
        return self._portal.call(self._consumer.receive(timeout_s))

    def __iter__(self) -> Iterator[ReceivedMessage]:
        while True:
            try:
                yield self.receive()
            except ClosedError:
                return

    def ack(self, message: ReceivedMessage) -> None:
        """Queue an ack (sent in a batch)."""
        self._consumer.ack(message)

    def nack(self, message: ReceivedMessage, delay_ms: int = 0) -> None:
        """Queue a nack: redelivery after ``delay_ms``."""
        self._consumer.nack(message, delay_ms)

    def flush_acks(self) -> None:
        """Send the queued acks and nacks and wait for their answers."""
        self._portal.call(self._consumer.flush_acks())

    def close(self, *, detach: bool = True) -> None:
        """Stop receiving, send the queued acks, detach."""
        self._portal.call(self._consumer.close(detach=detach))


class Admin:
    """The blocking twin of :class:`AsyncAdmin`."""

    def __init__(self, portal: _Portal, admin: AsyncAdmin) -> None:
        self._portal = portal
        self._admin = admin

    def cluster(self) -> Cluster:
        """Registered nodes by service kind, and the controller's leader."""
        return self._portal.call(self._admin.cluster())

    def namespaces(self) -> list[str]:
        """Every namespace's name."""
        return self._portal.call(self._admin.namespaces())

    def namespace(self, ns: str) -> Namespace:
        """One namespace's policy."""
        return self._portal.call(self._admin.namespace(ns))

    def create_namespace(
        self, ns: str, *, max_topics: int | None = None, retention: Retention | None = None
    ) -> Namespace:
        """Create a namespace (idempotent)."""
        return self._portal.call(
            self._admin.create_namespace(ns, max_topics=max_topics, retention=retention)
        )

    def delete_namespace(self, ns: str) -> None:
        """Delete an empty namespace."""
        self._portal.call(self._admin.delete_namespace(ns))

    def producers(self, topic: str | TopicName) -> list[ProducerInfo]:
        """The open producer sessions of a topic."""
        return self._portal.call(self._admin.producers(topic))

    def topics(self, ns: str = "default") -> list[str]:
        """The topics of a namespace."""
        return self._portal.call(self._admin.topics(ns))

    def create_topic(
        self,
        topic: str | TopicName,
        *,
        partitions: int = 0,
        dispatch: Dispatch = "reliable",
        durability: Durability = "fsync",
        retention: Retention | None = None,
    ) -> Topic:
        """Create a topic (idempotent)."""
        return self._portal.call(
            self._admin.create_topic(
                topic,
                partitions=partitions,
                dispatch=dispatch,
                durability=durability,
                retention=retention,
            )
        )

    def update_topic(
        self,
        topic: str | TopicName,
        *,
        partitions: int | None = None,
        policies: Policies | None = None,
    ) -> Topic:
        """Grow a topic's partitions and change its policies (AsyncAdmin.update_topic)."""
        return self._portal.call(
            self._admin.update_topic(topic, partitions=partitions, policies=policies)
        )

    def update_topic_policies(self, topic: str | TopicName, policies: Policies) -> Topic:
        """Change a topic's policies in place (the fields set replace the stored ones)."""
        return self._portal.call(self._admin.update_topic_policies(topic, policies))

    def describe_topic(self, topic: str | TopicName) -> TopicDescription:
        """Config, partitions with owners and offsets, subscriptions."""
        return self._portal.call(self._admin.describe_topic(topic))

    def delete_topic(self, topic: str | TopicName) -> None:
        """Delete a topic."""
        self._portal.call(self._admin.delete_topic(topic))

    def lookup(self, topic: str | TopicName) -> Lookup:
        """The partitions of a topic and the owner of each."""
        return self._portal.call(self._admin.lookup(topic))

    def subscriptions(self, topic: str | TopicName) -> list[Subscription]:
        """Every subscription of a topic: type, cursors, backlog, consumers."""
        return self._portal.call(self._admin.subscriptions(topic))

    def delete_subscription(self, topic: str | TopicName, subscription: str) -> None:
        """Delete a subscription."""
        self._portal.call(self._admin.delete_subscription(topic, subscription))

    def seek(
        self, topic: str | TopicName, subscription: str, position: Position
    ) -> list[SeekPartition]:
        """Move the subscription's cursor in every partition to ``position``."""
        return self._portal.call(self._admin.seek(topic, subscription, position))


class Schemas:
    """The blocking twin of :class:`~danube.client.schemas.AsyncSchemas`."""

    def __init__(self, portal: _Portal, schemas: AsyncSchemas) -> None:
        self._portal = portal
        self._schemas = schemas

    def register(
        self, subject: str, schema_type: SchemaType, definition: str | bytes, **options: Any
    ) -> Registered:
        """Register a version (``description``, ``created_by``, ``tags``)."""
        return self._portal.call(
            self._schemas.register(subject, schema_type, definition, **options)
        )

    def get(self, schema_id: int, version: int | None = None) -> SchemaVersion:
        """A version by schema id (the latest live one when ``version`` is None)."""
        return self._portal.call(self._schemas.get(schema_id, version))

    def latest(self, subject: str) -> SchemaVersion:
        """The subject's newest live version."""
        return self._portal.call(self._schemas.latest(subject))

    def version(self, subject: str, version: int, *, deleted: bool = False) -> SchemaVersion:
        """One version of the subject."""
        return self._portal.call(self._schemas.version(subject, version, deleted=deleted))

    def versions(self, subject: str) -> list[SchemaVersion]:
        """The subject's live versions, oldest first."""
        return self._portal.call(self._schemas.versions(subject))

    def check(
        self,
        subject: str,
        schema_type: SchemaType,
        definition: str | bytes,
        *,
        mode: str | None = None,
    ) -> Compatibility:
        """Whether ``definition`` could be registered now."""
        return self._portal.call(self._schemas.check(subject, schema_type, definition, mode=mode))

    def delete_version(self, subject: str, version: int) -> None:
        """Soft-delete a version."""
        self._portal.call(self._schemas.delete_version(subject, version))

    def mode(self, subject: str) -> str:
        """The subject's compatibility mode."""
        return self._portal.call(self._schemas.mode(subject))

    def set_mode(self, subject: str, mode: str) -> str:
        """Set the subject's compatibility mode."""
        return self._portal.call(self._schemas.set_mode(subject, mode))

    def subjects(self) -> list[str]:
        """Every subject."""
        return self._portal.call(self._schemas.subjects())

    def bind_topic(
        self,
        topic: str | TopicName,
        subject: str,
        *,
        validation_policy: ValidationPolicy = "none",
        payload_validation: bool = False,
    ) -> TopicSchema:
        """Bind the topic to a subject with a validation policy."""
        return self._portal.call(
            self._schemas.bind_topic(
                topic,
                subject,
                validation_policy=validation_policy,
                payload_validation=payload_validation,
            )
        )

    def topic_schema(self, topic: str | TopicName) -> TopicSchema:
        """The topic's binding."""
        return self._portal.call(self._schemas.topic_schema(topic))

    def update_topic_policy(
        self,
        topic: str | TopicName,
        *,
        validation_policy: ValidationPolicy,
        payload_validation: bool,
    ) -> TopicSchema:
        """Change a bound topic's validation policy."""
        return self._portal.call(
            self._schemas.update_topic_policy(
                topic, validation_policy=validation_policy, payload_validation=payload_validation
            )
        )

    def unbind_topic(self, topic: str | TopicName) -> None:
        """Remove the topic's binding."""
        self._portal.call(self._schemas.unbind_topic(topic))

"""Namespaces and topics in etcd: create idempotently, read, list, delete; over the produce
path's cache of topic configs and namespace policies (danube.admission.policies, which
every produce door reads), kept current here at once on every write.

Creation is a create-if-absent transaction, so of two instances creating the same topic at
once exactly one writes it and the other reads the winner's config: the same config is
answered as created again (idempotent), a different one as a conflict. A topic is created
only while its namespace exists (compared in the same transaction).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence

from danube.admission.policies import PolicyCache
from danube.discovery.catalog.growth import grown
from danube.discovery.errors import ConflictError, NotFoundError
from danube.meta import (
    TopicName,
    UpdateRacedError,
    decode_model,
    encode_model,
)
from danube.meta import keys as meta_keys
from danube.meta.records import Dispatch, NamespacePolicy, TopicConfig
from danube.wire import codes

log = logging.getLogger(__name__)

DEFAULT_NAMESPACE = "default"
# Deletes of one topic's records are sent in transactions of at most this many ops
# (etcd refuses more than 128 per transaction).
_DELETE_OPS_PER_TXN = 100
_UPDATE_TRIES = 5  # compare-and-swap attempts of an update racing another


def now_ms() -> int:
    """Wall-clock Unix milliseconds (what records store)."""
    return int(time.time() * 1000)


def _same(existing: TopicConfig | NamespacePolicy, wanted: TopicConfig | NamespacePolicy) -> bool:
    """Whether two records say the same, their creation times aside."""
    return existing.model_dump(exclude={"created_ms"}) == wanted.model_dump(exclude={"created_ms"})


class Catalog(PolicyCache):
    """Namespaces and topics of one cluster (one ``MetaStore``): the policy cache of the
    produce path (danube.admission.policies) and the writes that keep it current on this
    instance at once."""

    # --- namespaces ----------------------------------------------------------------

    async def ensure_default_namespace(self) -> None:
        """Create ``default`` if it does not exist (every instance does at start)."""
        policy = NamespacePolicy(created_ms=now_ms())
        await self.store.create_model(meta_keys.namespace_key(DEFAULT_NAMESPACE), policy)

    async def create_namespace(
        self, name: str, wanted: NamespacePolicy
    ) -> tuple[NamespacePolicy, bool]:
        """Create the namespace with the policy ``wanted`` (its ``created_ms`` is set here);
        ``(policy, created)``. The same policy again is not an error."""
        key = meta_keys.namespace_key(name)
        policy = wanted.model_copy(update={"created_ms": now_ms()})
        result = (
            await self.store.txn()
            .if_absent(key)
            .then_put(key, encode_model(policy))
            .else_get(key)
            .commit()
        )
        if result.succeeded:
            return policy, True
        kv = result.first_kv()
        if kv is None:  # deleted between the compare and the read: cannot happen in one txn
            raise ConflictError(f"namespace {name} changed while being created", code="conflict")
        existing = decode_model(kv, NamespacePolicy)
        if not _same(existing, policy):
            raise ConflictError(
                f"namespace {name} exists with another policy", code="namespace_exists"
            )
        return existing, False

    async def update_namespace(
        self,
        name: str,
        change: Callable[[NamespacePolicy], NamespacePolicy],
        *,
        changed: Sequence[str],
    ) -> NamespacePolicy:
        """Apply ``change`` to the namespace's policy (compare-and-swap on its revision, a
        few tries; ``changed`` names the fields it changes, for the log); NotFoundError if
        it does not exist."""
        key = meta_keys.namespace_key(name)
        try:
            found = await self.store.update_model(key, NamespacePolicy, change, tries=_UPDATE_TRIES)
        except UpdateRacedError:
            raise ConflictError(
                f"namespace {name} changed during the update", code="conflict"
            ) from None
        if found is None:
            raise NotFoundError(f"namespace {name} does not exist", code=codes.NAMESPACE_NOT_FOUND)
        updated = found[1]
        log.info("namespace %s updated: %s", name, list(changed))
        self._remember_namespace(name, updated)
        return updated

    async def get_namespace(self, name: str) -> NamespacePolicy:
        """The namespace's policy; NotFoundError if it does not exist."""
        found = await self.store.get_model(meta_keys.namespace_key(name), NamespacePolicy)
        if found is None:
            raise NotFoundError(f"namespace {name} does not exist", code=codes.NAMESPACE_NOT_FOUND)
        return found

    async def list_namespaces(self) -> list[str]:
        """Every namespace, sorted."""
        kvs = await self.store.range(meta_keys.NAMESPACES_PREFIX)
        return [kv.key.removeprefix(meta_keys.NAMESPACES_PREFIX) for kv in kvs]

    async def delete_namespace(self, name: str) -> None:
        """Delete an empty namespace other than ``default``."""
        key = meta_keys.namespace_key(name)
        if name == DEFAULT_NAMESPACE:
            raise ConflictError(
                "the default namespace cannot be deleted", code="namespace_protected"
            )
        found = await self.store.get(key)
        if found is None:
            raise NotFoundError(f"namespace {name} does not exist", code=codes.NAMESPACE_NOT_FOUND)
        if await self.store.range(meta_keys.topics_prefix(name), limit=1):
            raise ConflictError(f"namespace {name} still has topics", code="namespace_not_empty")
        # A topic created meanwhile compared on the namespace key, so it either landed before
        # this delete (and is checked above) or finds the namespace gone.
        await self.store.compare_and_delete(key, expected_mod_revision=found.mod_revision)

    # --- topics --------------------------------------------------------------------

    async def create_topic(self, topic: TopicName, wanted: TopicConfig) -> tuple[TopicConfig, bool]:
        """Create the topic with the config ``wanted`` (its ``created_ms`` is set here);
        ``(config, created)``. The same config again is not an error; a different one is
        ConflictError; a missing namespace NotFoundError."""
        ns_key = meta_keys.namespace_key(topic.namespace)
        key = meta_keys.topic_key(topic)
        config = wanted.model_copy(update={"created_ms": now_ms()})
        policy = await self.get_namespace(topic.namespace)
        existing = await self.store.get_model(key, TopicConfig)
        if existing is None:
            count = len(await self.store.range(meta_keys.topics_prefix(topic.namespace)))
            if count >= policy.max_topics:
                raise ConflictError(
                    f"namespace {topic.namespace} holds its maximum of {policy.max_topics} topics",
                    code="namespace_full",
                )
            result = await (
                self.store.txn()
                .if_absent(key)
                .if_present(ns_key)
                .then_put(key, encode_model(config))
                .else_get(key)
                .commit()
            )
            if result.succeeded:
                self._remember(topic, config)
                log.info("created topic %s (%d partitions)", topic, config.partitions)
                return config, True
            kv = result.first_kv()
            if kv is None:
                raise NotFoundError(
                    f"namespace {topic.namespace} does not exist", code=codes.NAMESPACE_NOT_FOUND
                )
            existing = decode_model(kv, TopicConfig)
        if not _same(existing, config):
            raise ConflictError(f"topic {topic} exists with another config", code="topic_exists")
        self._remember(topic, existing)
        return existing, False

    async def ensure_topic(
        self, topic: TopicName, *, auto_create: bool, dispatch: Dispatch = "reliable"
    ) -> tuple[TopicConfig, bool]:
        """The config of ``topic`` (or of the topic of a partition, ``<t>-part-N``), made to
        exist when it does not and ``auto_create`` allows: a topic is created unpartitioned
        with ``dispatch``; a partition's topic is created with ``N + 1`` partitions, or grown
        to have it (Danube's clients name partitions). ``(config, created)``; NotFoundError
        ``topic_not_found`` when it does not exist and may not be made to. The one place a
        topic is created on demand (produce, attach, a gRPC producer or consumer)."""
        base = topic.parent
        config = await self.cached_topic(base)
        created = False
        if config is None:
            if not auto_create:
                raise NotFoundError(
                    f"topic {base} does not exist and auto-creation is off",
                    code=codes.TOPIC_NOT_FOUND,
                )
            count = 0 if topic.partition is None else topic.partition + 1
            wanted = TopicConfig(partitions=count, dispatch=dispatch, created_ms=0)
            try:
                config, created = await self.create_topic(base, wanted)
            except ConflictError as exc:  # created meanwhile, with another config
                if exc.code != "topic_exists":
                    raise
                config = await self.get_topic(base)
        if topic.partition is not None and config.partitions <= topic.partition:
            if not auto_create:
                raise NotFoundError(f"topic {topic} does not exist", code=codes.TOPIC_NOT_FOUND)
            config = await self.grow_partitions(base, topic.partition + 1)
        return config, created

    async def grow_partitions(self, topic: TopicName, count: int) -> TopicConfig:
        """Give the partitioned topic at least ``count`` partitions (Danube's clients create a
        producer per partition they name, ``<t>-part-N``, and expect it to exist): the rules
        of :func:`danube.discovery.catalog.growth.grown`, never shrinking. New partitions are placed
        on their first produce; dispatchers serving the topic's subscriptions read them from
        offset 0 as soon as they see the new count (their watch of topic configs)."""
        before, after = await self._change_topic(
            topic,
            lambda config: grown(config, topic, count, exact=False),
            raced="kept changing while growing",
        )
        if after is not before:
            log.info("topic %s grew to %d partitions", topic, after.partitions)
        return after

    async def update_topic(
        self, topic: TopicName, change: Callable[[TopicConfig], TopicConfig]
    ) -> tuple[TopicConfig, TopicConfig]:
        """Apply ``change`` (its policies, and a growth of its partitions: the rules of
        :func:`danube.discovery.catalog.growth.grown`, exact) in one compare-and-swap on its
        revision (a few tries); ``(before, after)``; NotFoundError if it does not exist.
        Other instances see it at once (their caches follow etcd), this one too."""
        before, updated = await self._change_topic(topic, change, raced="changed during the update")
        if updated.partitions != before.partitions:
            log.info(
                "topic %s grew from %d to %d partitions",
                topic,
                before.partitions,
                updated.partitions,
            )
        log.info("topic %s policies updated: %s", topic, updated.policies)
        return before, updated

    async def _change_topic(
        self, topic: TopicName, change: Callable[[TopicConfig], TopicConfig], *, raced: str
    ) -> tuple[TopicConfig, TopicConfig]:
        """Compare-and-swap the topic's config through ``change`` (a few tries) and cache
        the result: ``(before, after)``. NotFoundError when the topic does not exist,
        ConflictError ``"topic <topic> <raced>"`` when every try lost its race."""
        try:
            found = await self.store.update_model(
                meta_keys.topic_key(topic), TopicConfig, change, tries=_UPDATE_TRIES
            )
        except UpdateRacedError:
            raise ConflictError(f"topic {topic} {raced}", code="conflict") from None
        if found is None:
            raise NotFoundError(f"topic {topic} does not exist", code=codes.TOPIC_NOT_FOUND)
        self._remember(topic, found[1])
        return found

    async def get_topic(self, topic: TopicName) -> TopicConfig:
        """The topic's config, read from etcd; NotFoundError if it does not exist."""
        found = await self.store.get_model(meta_keys.topic_key(topic), TopicConfig)
        if found is None:
            raise NotFoundError(f"topic {topic} does not exist", code=codes.TOPIC_NOT_FOUND)
        self._remember(topic, found)
        return found

    async def list_topics(self, namespace: str) -> list[str]:
        """The topic segments of a namespace, sorted; NotFoundError if it does not exist."""
        await self.get_namespace(namespace)
        prefix = meta_keys.topics_prefix(namespace)
        return [kv.key.removeprefix(prefix) for kv in await self.store.range(prefix)]

    async def delete_topic(self, topic: TopicName) -> TopicConfig:
        """Delete the topic's config, then its partitions' records (owner, reservation,
        assignment...), their cloud-tier records (descriptors, checkpoint), subscriptions,
        producer sessions and producer epochs.
        Removing the owner key fences the owning ingest, removing the uploader's assignment
        key fences its uploads."""
        key = meta_keys.topic_key(topic)
        found = await self.store.get_model_kv(key, TopicConfig)
        if found is None:
            raise NotFoundError(f"topic {topic} does not exist", code=codes.TOPIC_NOT_FOUND)
        config, kv = found
        if not await self.store.compare_and_delete(key, expected_mod_revision=kv.mod_revision):
            raise ConflictError(f"topic {topic} changed while being deleted", code="conflict")
        self._cache.pop(topic, None)
        partitions = topic.partitions(config.partitions)
        prefixes = [meta_keys.partition_prefix(p) for p in partitions]
        prefixes += [meta_keys.storage_prefix(p) for p in partitions]
        prefixes.append(meta_keys.subscriptions_prefix(topic))
        # Producer sessions of the topic and of its partitions (one prefix): their leases
        # run out.
        prefixes.append(meta_keys.producers_prefix(topic))
        prefixes.append(meta_keys.producer_epochs_prefix(topic))
        if config.partitions > 0:  # what Danube's clients make per partition
            prefixes += [meta_keys.subscriptions_prefix(p) for p in partitions]
        for start in range(0, len(prefixes), _DELETE_OPS_PER_TXN):
            txn = self.store.txn()
            for prefix in prefixes[start : start + _DELETE_OPS_PER_TXN]:
                txn.then_delete(prefix, prefix=True)
            await txn.commit()
        log.info("deleted topic %s", topic)
        return config

"""Schemas on the produce path (docs/schemas.md): a topic bound to a subject gets every
stored record stamped with the schema id and version it was checked against, and its
payloads checked by the binding's policy:

- ``none``: stamped, not checked;
- ``warn``: checked (with ``payload_validation``); a payload that fails is stored all the
  same, counted (``schema_violations``: discovery's
  ``danube_discovery_schema_violations_total``) and logged (at most once per
  topic every :data:`WARN_LOG_EVERY_S`);
- ``enforce``: checked; one failing message refuses the whole batch (400
  ``schema_violation`` naming the message index and the first error), nothing stored.

A produce names the version it was written with (HTTP ``schema_version``, gRPC
``schema_version``; a gRPC ``schema_id`` must be the subject's): the latest live one when it
names none. Bindings and latest versions are cached ``cache_ttl_s`` (etcd stays off the hot
path: a binding or version change is seen that late); validators are compiled once per
version.

The gate reads the registry through its read side (danube.admission.schema_reads), so any
door's process builds one over etcd alone; the registry's writes are discovery's.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TypeVar

from prometheus_client import Counter

from danube.admission.core import Stamp
from danube.admission.refresh import Refresher, StaleError, read_or_stale, refresh_at
from danube.admission.schema_reads import SchemaReader, SchemaVersion, TopicSchema
from danube.errors import BadRequestError, NotFoundError
from danube.meta import TopicName
from danube.schemas.validate import Validator, compile_validator

log = logging.getLogger(__name__)

WARN_LOG_EVERY_S = 10.0
CACHED_MAX = 10_000  # bindings, versions
VALIDATORS_MAX = 256  # compiled payload checks, one per schema version
INLINE_CHECKS_MAX = 16  # larger batches are checked in a worker thread
K = TypeVar("K")


@dataclass(frozen=True, slots=True)
class _Entry:
    value: object
    expires_at: float
    refresh_at: float  # a hit from then on reads it again in the background (refresh.py)


class SchemaGate:
    """Stamps and checks produced payloads of bound topics; cached per instance."""

    def __init__(
        self,
        registry: SchemaReader,
        *,
        cache_ttl_s: float,
        refresher: Refresher | None = None,
        violations: Counter | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """``refresher``: refresh-ahead of bindings and versions (None: read again only
        once expired, inline); ``violations``: counts the payloads that fail, by policy
        (AdmissionCounters.schema_violations; None: not counted)."""
        self.registry = registry
        self.violations = violations
        self.cache_ttl_s = cache_ttl_s
        self._refresher = refresher
        self._clock = clock
        self._bindings: OrderedDict[TopicName, _Entry] = OrderedDict()
        self._versions: OrderedDict[tuple[str, int | None], _Entry] = OrderedDict()
        self._warned: dict[TopicName, float] = {}
        self._validators: OrderedDict[tuple[int, int], Validator] = OrderedDict()

    async def admit(
        self,
        topic: TopicName,
        payloads: Sequence[bytes],
        *,
        schema_id: int | None = None,
        version: int | None = None,
    ) -> Stamp | None:
        """The stamp of ``payloads`` produced to ``topic`` (a topic or one of its
        partitions), None when the topic has no schema; BadRequestError when the binding
        enforces and one fails, or the named schema is not the topic's."""
        binding = await self._binding(topic.parent)
        if binding is None:
            return None
        if schema_id is not None and schema_id != binding.schema_id:
            raise BadRequestError(
                f"{topic} takes schemas of subject {binding.subject!r} (id {binding.schema_id}),"
                f" not schema id {schema_id}",
                code="schema_mismatch",
            )
        chosen = await self._version(binding.subject, version)
        stamp = Stamp(chosen.schema_id, chosen.version)
        if binding.validation_policy == "none" or not binding.payload_validation:
            return stamp
        check = await self._validator(chosen)
        if len(payloads) > INLINE_CHECKS_MAX:  # a big batch: keep the loop responsive
            failures = await asyncio.to_thread(_failures, check, payloads)
        else:
            failures = _failures(check, payloads)
        if not failures:
            return stamp
        if self.violations is not None:
            self.violations.labels(binding.validation_policy).inc(len(failures))
        index, error = failures[0]
        message = (
            f"messages[{index}] does not match {binding.subject!r} version "
            f"{chosen.version}: {error}"
        )
        if binding.validation_policy == "enforce":
            raise BadRequestError(message, code="schema_violation")
        self._warn(topic, f"{len(failures)} of {len(payloads)} messages failed; {message}")
        return stamp

    def _warn(self, topic: TopicName, message: str) -> None:
        now = time.monotonic()
        if now - self._warned.get(topic, -WARN_LOG_EVERY_S) >= WARN_LOG_EVERY_S:
            self._warned[topic] = now
            if len(self._warned) > CACHED_MAX:
                self._warned.clear()
            log.warning("%s: stored anyway (policy warn): %s", topic, message)

    async def _binding(self, topic: TopicName) -> TopicSchema | None:
        hit = self._bindings.get(topic)
        now = self._clock()
        if hit is not None and hit.expires_at > now:
            assert hit.value is None or isinstance(hit.value, TopicSchema)
            if hit.refresh_at <= now and self._refresher is not None:
                self._refresher.start(("binding", topic), lambda: self._refresh_binding(topic, hit))
            return hit.value
        key = ("binding", topic)
        refresher = self._refresher
        try:
            binding = await read_or_stale(
                lambda: self.registry.topic_schema(topic),
                has_stale=hit is not None,
                stalled=refresher is not None and refresher.stalled(key),
            )
        except StaleError:  # etcd stalls or fails: the binding known a moment ago
            assert hit is not None
            assert hit.value is None or isinstance(hit.value, TopicSchema)
            if refresher is not None:  # replaces the entry once etcd answers
                refresher.start(key, lambda: self._refresh_binding(topic, hit))
            return hit.value
        self._remember(self._bindings, topic, binding)
        return binding

    async def _version(self, subject: str, version: int | None) -> SchemaVersion:
        key = (subject, version)
        hit = self._versions.get(key)
        now = self._clock()
        if hit is not None and hit.expires_at > now:
            assert isinstance(hit.value, SchemaVersion)
            if hit.refresh_at <= now and self._refresher is not None:
                self._refresher.start(("version", key), lambda: self._refresh_version(key, hit))
            return hit.value
        try:
            if version is None:
                found = await self.registry.latest(subject)
            else:
                found = await self.registry.version(subject, version)
        except NotFoundError as exc:
            raise BadRequestError(exc.message, code="schema_not_found") from exc
        if found.deleted:
            raise BadRequestError(
                f"version {found.version} of {subject!r} is deleted", code="schema_not_found"
            )
        self._remember(self._versions, key, found)
        return found

    async def _refresh_binding(self, topic: TopicName, hit: _Entry) -> None:
        binding = await self.registry.topic_schema(topic)
        if self._bindings.get(topic) is hit:  # else replaced meanwhile: keep the newer
            self._remember(self._bindings, topic, binding)

    async def _refresh_version(self, key: tuple[str, int | None], hit: _Entry) -> None:
        subject, version = key
        try:
            if version is None:
                found: SchemaVersion | None = await self.registry.latest(subject)
            else:
                found = await self.registry.version(subject, version)
        except NotFoundError:
            found = None
        if self._versions.get(key) is not hit:
            return
        if found is None or found.deleted:
            self._versions.pop(key, None)  # the next produce reads it inline and is refused
        else:
            self._remember(self._versions, key, found)

    async def _validator(self, version: SchemaVersion) -> Validator:
        key = (version.schema_id, version.version)
        check = self._validators.get(key)
        if check is None:
            # Compiling parses the definition (protobuf runs protoc): off the loop, once.
            check = await asyncio.to_thread(
                compile_validator, version.schema_type, version.definition
            )
            self._validators[key] = check
            while len(self._validators) > VALIDATORS_MAX:
                self._validators.popitem(last=False)
        return check

    def _remember(self, cache: OrderedDict[K, _Entry], key: K, value: object) -> None:
        now = self._clock()
        cache[key] = _Entry(value, now + self.cache_ttl_s, refresh_at(now, self.cache_ttl_s))
        cache.move_to_end(key)
        while len(cache) > CACHED_MAX:
            cache.popitem(last=False)


def _failures(check: Validator, payloads: Sequence[bytes]) -> list[tuple[int, str]]:
    """``(index, error)`` of every payload that fails ``check``."""
    failed = []
    for index, payload in enumerate(payloads):
        error = check(payload)
        if error is not None:
            failed.append((index, error))
    return failed

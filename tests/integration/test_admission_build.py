"""An admission built by danube.admission.build over etcd alone (as an ingest node builds it,
nothing of discovery handed in) refuses and admits as discovery's (built over its catalog,
registry and producer sessions) on real etcd: RBAC, exclusive producers, limits, topic
policies, schemas; its watches follow roles and exclusive producers written meanwhile."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path

import pytest

from danube.admission import AdmissionCounters, AdmissionParts, PayloadMessages, build
from danube.config import DanubeSettings, DiscoveryConfig, SecurityConfig
from danube.discovery.catalog.catalog import Catalog
from danube.discovery.doors.bodies.api import TopicSpec
from danube.discovery.doors.bodies.policies import PoliciesSpec
from danube.discovery.produce.sessions import DiscoverySessions
from danube.discovery.schemas.registry import SchemaRegistry
from danube.errors import DanubeError
from danube.meta import MetaStore, TopicName
from danube.meta import keys as meta_keys
from danube.meta.records import TopicConfig
from danube.security import Binding, Permission, Role, generate_key

pytestmark = pytest.mark.integration

PLAIN = TopicName("default", "plain")
SMALL = TopicName("default", "small")  # max_message_bytes 100
TYPED = TopicName("default", "typed")  # bound to a JSON schema, enforced
HELD = TopicName("default", "held")  # an exclusive producer holds it
LATER = TopicName("default", "later")  # held only once the views follow
MESSAGES_MAX = 4
SCHEMA = {"type": "object", "required": ["id"], "properties": {"id": {"type": "integer"}}}
FOLLOW_WAIT_S = 10.0


def _settings(keys_dir: Path) -> DanubeSettings:
    return DanubeSettings(
        discovery=DiscoveryConfig(max_produce_messages=MESSAGES_MAX),
        security=SecurityConfig(enabled=True, keys_dir=keys_dir),
    )


async def _grant(store: MetaStore, principal: str) -> None:
    role = Role(name="writer", permissions=[Permission.Produce, Permission.Consume])
    await store.put_model(meta_keys.role_key("writer"), role)
    binding = Binding(id=f"b-{principal}", principal=principal, roles=["writer"], scope="cluster")
    await store.put_model(meta_keys.binding_key(binding.id), binding)


@asynccontextmanager
async def _following(parts: AdmissionParts) -> AsyncIterator[None]:
    await parts.load()
    views = asyncio.create_task(parts.follow(), name="admission-views")
    try:
        yield
    finally:
        views.cancel()
        with pytest.raises(asyncio.CancelledError):
            await views


async def _answer(
    parts: AdmissionParts,
    principal: str,
    topic: TopicName,
    payloads: list[bytes],
    producer_id: str | None = None,
) -> str:
    """``ok``, or the code of the refusal."""
    messages = PayloadMessages(payloads, [{} for _ in payloads])
    try:
        await parts.admission.produce(principal, topic, messages, producer_id=producer_id)
    except DanubeError as exc:
        return exc.code
    return "ok"


async def _until(check: Callable[[], Awaitable[bool]]) -> None:
    async with asyncio.timeout(FOLLOW_WAIT_S):
        while not await check():  # noqa: ASYNC110 - a watch applies changes, no event to wait on
            await asyncio.sleep(0.02)


async def test_a_built_admission_decides_as_discoverys(store: MetaStore, tmp_path: Path) -> None:
    generate_key(tmp_path)
    settings = _settings(tmp_path)
    catalog = Catalog(store, cache_ttl_s=0.0)
    await catalog.ensure_default_namespace()
    for topic in (PLAIN, TYPED, HELD, LATER):
        await catalog.create_topic(topic, TopicSpec().stored())
    await catalog.create_topic(
        SMALL, TopicSpec(policies=PoliciesSpec(max_message_bytes=100)).stored()
    )
    registry = SchemaRegistry(store)
    await registry.register("typed-value", "json_schema", json.dumps(SCHEMA).encode())
    await registry.bind_topic(
        TYPED, "typed-value", validation_policy="enforce", payload_validation=True
    )
    sessions = DiscoverySessions(store, catalog, ttl_s=30)
    holder = await sessions.open(HELD, "p", access_mode="exclusive")
    await _grant(store, "alice")

    counters = AdmissionCounters.unregistered()
    discoverys = build(
        settings,
        store,
        refresher=None,
        cache_ttl_s=0.0,
        counters=AdmissionCounters.unregistered(),
        policies=catalog,
        schemas=registry,
        holders=sessions.holders,
    )
    alone = build(settings, store, refresher=None, cache_ttl_s=0.0, counters=counters)

    too_big = [b"x" * (settings.ingest.max_message_bytes + 1)]
    cases: list[tuple[str, TopicName, list[bytes], str | None, str]] = [
        ("alice", PLAIN, [b"x"], None, "ok"),
        ("mallory", PLAIN, [b"x"], None, "permission_denied"),
        ("alice", PLAIN, [b"x"] * (MESSAGES_MAX + 1), None, "too_many_messages"),
        ("alice", PLAIN, too_big, None, "payload_too_large"),
        ("alice", SMALL, [b"x" * 100], None, "ok"),
        ("alice", SMALL, [b"x" * 101], None, "payload_too_large"),
        ("alice", TYPED, [b'{"id": 1}'], None, "ok"),
        ("alice", TYPED, [b'{"id": "one"}'], None, "schema_violation"),
        ("alice", HELD, [b"x"], None, "producer_fenced"),
        ("alice", HELD, [b"x"], "someone-else", "producer_fenced"),
        ("alice", HELD, [b"x"], holder.producer_id, "ok"),
    ]
    async with _following(discoverys), _following(alone):
        for principal, topic, payloads, producer_id, expected in cases:
            answers = [
                await _answer(parts, principal, topic, payloads, producer_id)
                for parts in (discoverys, alone)
            ]
            assert answers == [expected, expected], (principal, topic, producer_id)
        assert counters.policy_refusals.labels("payload_too_large")._value.get() == 2
        assert counters.policy_refusals.labels("too_many_messages")._value.get() == 1
        assert counters.schema_violations.labels("enforce")._value.get() == 1
        assert counters.authz_denied.labels("Produce")._value.get() == 1

        # Written by others meanwhile: seen by the standalone one through its watches.
        await _grant(store, "mallory")
        later = await sessions.open(LATER, "q", access_mode="exclusive")

        async def followed() -> bool:
            return [
                await _answer(alone, "mallory", PLAIN, [b"x"]),
                await _answer(alone, "alice", LATER, [b"x"]),
                await _answer(alone, "alice", LATER, [b"x"], later.producer_id),
            ] == ["ok", "producer_fenced", "ok"]

        await _until(followed)
        await store.delete(meta_keys.binding_key("b-mallory"))
        await _until(lambda: _is(_answer(alone, "mallory", PLAIN, [b"x"]), "permission_denied"))


async def _is(answer: Awaitable[str], expected: str) -> bool:
    return await answer == expected


async def test_follow_before_load_is_refused(store: MetaStore, tmp_path: Path) -> None:
    generate_key(tmp_path)
    parts = build(
        _settings(tmp_path),
        store,
        refresher=None,
        cache_ttl_s=1.0,
        counters=AdmissionCounters.unregistered(),
    )
    with pytest.raises(RuntimeError, match="before load"):
        await parts.follow()


async def test_a_topic_changed_elsewhere_is_seen_long_before_the_cache_expires(
    store: MetaStore, tmp_path: Path
) -> None:
    """The door's cache holds configs for an hour here: a topic grown and given a smaller
    message limit by another writer (discovery's catalog) is seen from the watch, and so is
    its namespace's policy."""
    generate_key(tmp_path)
    parts = build(
        DanubeSettings(discovery=DiscoveryConfig(max_produce_messages=MESSAGES_MAX)),
        store,
        refresher=None,
        cache_ttl_s=3600.0,
        counters=AdmissionCounters.unregistered(),
    )
    writer = Catalog(store, cache_ttl_s=1.0)
    await writer.ensure_default_namespace()
    topic = TopicName("default", "grows")
    await writer.create_topic(topic, TopicSpec(partitions=2).stored())
    cache = parts.policies
    config, _ = await cache.effective_policies(topic)
    assert config is not None
    assert config.partitions == 2
    assert await _answer(parts, "anonymous", topic, [b"x" * 200]) == "ok"
    async with _following(parts):
        await asyncio.sleep(0.2)  # the watches are open
        await writer.grow_partitions(topic, 4)
        await _until(lambda: _partitions_are(cache.effective_policies(topic), 4))
        await store.put_model(
            meta_keys.topic_key(topic),
            (await writer.get_topic(topic)).model_copy(
                update={"policies": PoliciesSpec(max_message_bytes=100).stored()}
            ),
        )
        await _until(
            lambda: _is(_answer(parts, "anonymous", topic, [b"x" * 200]), "payload_too_large")
        )


async def _partitions_are(
    reading: Awaitable[tuple[TopicConfig | None, object]], expected: int
) -> bool:
    config, _ = await reading
    return config is not None and config.partitions == expected

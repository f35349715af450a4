"""Where a served subscription starts: the config its first attach creates (the start
position resolved, and an offset past an end refused, before anything is stored), and the
cursor of each partition once it is served: as stored, else at the offsets its first
attach resolved, else resolved from the start position, except that a resumed
subscription reads a partition with no stored cursor (it came with a growth) from 0."""

from __future__ import annotations

import time
from dataclasses import dataclass

from danube.dispatcher.cursor import CursorState, FlushPolicy, PartitionCursor
from danube.dispatcher.positions import Resolve
from danube.dispatcher.store import SubscriptionStore
from danube.meta import TopicName
from danube.meta.records import Policies, SubscriptionConfig
from danube.wire.dispatcher import protocol


async def create_config(
    store: SubscriptionStore,
    resolve: Resolve,
    request: protocol.AttachRequest,
    limits: Policies,
) -> tuple[SubscriptionConfig, dict[TopicName, int]]:
    """The config a first attach creates (or the one already stored, if another attach
    created it first) and the offsets its start position resolved to, by partition; the
    topic's ``max_subscriptions`` may refuse it."""
    partitions = await store.partitions()
    offsets = await resolve(partitions, request.start)
    initial = request.start if isinstance(request.start, str) else "earliest"
    config = await store.create_config(
        SubscriptionConfig(
            type=request.type,
            initial_position=initial,
            created_ms=int(time.time() * 1000),
            failure_policy=request.failure_policy,
        ),
        max_subscriptions=limits.max_subscriptions,
    )
    return config, dict(zip(partitions, offsets, strict=True))


@dataclass(frozen=True)
class Start:
    """Where each partition of a subscription starts."""

    partitions: list[TopicName]
    stored: dict[TopicName, CursorState]
    """The cursors as stored (a resume)."""
    fresh: dict[TopicName, CursorState]
    """The cursors made here: stored before any consumer sees a message, so "latest"
    means the latest at attach, not at the next restart."""
    cursors: dict[str, PartitionCursor]
    """Every partition's cursor, by short name."""


async def load_start(
    store: SubscriptionStore,
    resolve: Resolve,
    start: protocol.StartPosition,
    resolved: dict[TopicName, int] | None,
    policy: FlushPolicy,
) -> Start:
    """Every partition's cursor: stored, else at ``resolved`` (the first attach resolves
    its start before creating the config), else at ``start``."""
    partitions = await store.partitions()
    stored = await store.load_cursors(partitions)
    missing = [p for p in partitions if p not in stored and p not in (resolved or {})]
    starts = dict(resolved or {})
    if stored:  # resumed: a partition without a cursor came with a growth (read it all)
        starts.update(dict.fromkeys(missing, 0))
    else:
        found = await resolve(missing, start)
        starts.update(zip(missing, found, strict=True))
    cursors: dict[str, PartitionCursor] = {}
    fresh: dict[TopicName, CursorState] = {}
    for partition in partitions:
        state = stored.get(partition)
        if state is None:
            state = fresh[partition] = CursorState(next_offset=starts[partition])
        cursors[partition.topic] = PartitionCursor.from_state(state, policy=policy)
    return Start(partitions, stored, fresh, cursors)


async def load_grown(
    store: SubscriptionStore, partitions: list[TopicName], policy: FlushPolicy
) -> Start:
    """The cursors of ``partitions``, new since the topic grew: a former owner's if it grew
    there, else from 0 (a new partition holds only what came after the growth). None is
    written now: a resumed subscription reads a partition it has no cursor of from 0 as
    well, and the first ack writes it."""
    stored = await store.load_cursors(partitions)
    states = {p: stored.get(p, CursorState(next_offset=0)) for p in partitions}
    cursors = {p.topic: PartitionCursor.from_state(states[p], policy=policy) for p in partitions}
    return Start(partitions, stored, {}, cursors)

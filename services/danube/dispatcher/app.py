"""Wires one dispatcher: the node session (bus, etcd, lease, registration, health), the
subscriptions it serves, and its consume door (danube.dispatcher.door)."""

from __future__ import annotations

import asyncio
import logging

from danube.aio import cancel_all_and_wait
from danube.bus.subjects import Kind
from danube.config import DanubeSettings
from danube.dispatcher.door import open_door
from danube.dispatcher.handlers import serve_claims
from danube.dispatcher.local_consume import LocalConsumers
from danube.dispatcher.node import DispatcherNode
from danube.dispatcher.sampling import SubscriptionSampler
from danube.runtime.service import node_session

log = logging.getLogger(__name__)

__all__ = ["serve"]


async def serve(settings: DanubeSettings, node_id: str, stop: asyncio.Event) -> None:
    """Run the dispatcher until ``stop``. A lost node lease does not end it: it serves on
    and reclaims its subscriptions under a new lease (docs/dispatcher.md, "Through an etcd
    outage")."""
    async with node_session(
        settings, "dispatcher", node_id, settings.dispatcher, stop, renew_lease=True
    ) as s:
        node = DispatcherNode(settings, node_id=node_id, bus=s.bus, store=s.store, lease=s.lease)
        s.renewed.append(node.renewed)
        door = None
        if settings.dispatcher.data_enabled:  # before the claims: every attach names it
            calls = LocalConsumers(node.owned, s.store)
            door, node.data_url = await open_door(settings, s, calls)
        notices = await s.bus.subscribe(
            s.bus.subjects.all_of_kind(Kind.SUBSCRIPTION_CLAIMED), node.on_claim_notice
        )
        claims = await serve_claims(s.bus, node_id, node.ensure_serving)
        leaseless = s.tasks.create_task(node.watch_leaseless(), name="leaseless-watch")
        watcher = s.tasks.create_task(node.watch_owners(), name="subscription-watch")
        grower = s.tasks.create_task(node.watch_topics(), name="topic-watch")
        balancer = s.tasks.create_task(node.balance(), name="subscription-balance")
        sampler = s.tasks.create_task(
            SubscriptionSampler(node.runtimes).run(settings.metrics.sample_interval_s),
            name="subscription-metrics",
        )
        s.started.set()
        log.info("dispatcher %s up", node_id)
        await stop.wait()
        await cancel_all_and_wait([leaseless, watcher, grower, balancer, sampler])
        await s.leave()  # peers count it out: they take what it hands over below at once
        if door is not None:
            await door.close()
        await claims.drain()
        await notices.unsubscribe()
        await node.close(release=s.lease.alive)

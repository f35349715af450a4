"""Wires one dispatcher: the node session (bus, etcd, lease, registration, health) and the
subscriptions it serves."""

from __future__ import annotations

import asyncio
import logging

from danube.config import DanubeSettings
from danube.dispatcher.handlers import serve_claims
from danube.dispatcher.node import DispatcherNode
from danube.dispatcher.sampling import SubscriptionSampler
from danube.runtime.service import LeaseLost, node_session, wait_for_any

log = logging.getLogger(__name__)

__all__ = ["LeaseLost", "serve"]


async def serve(settings: DanubeSettings, node_id: str, stop: asyncio.Event) -> None:
    """Run the dispatcher until ``stop``; raise LeaseLost if its lease is lost first (every
    subscription was fenced; a restart claims afresh)."""
    async with node_session(settings, "dispatcher", node_id, settings.dispatcher, stop) as s:
        node = DispatcherNode(settings, node_id=node_id, bus=s.bus, store=s.store, lease=s.lease)
        claims = await serve_claims(s.bus, node_id, node.ensure_serving)
        watcher = s.tasks.create_task(node.watch_owners(), name="subscription-watch")
        balancer = s.tasks.create_task(node.balance(), name="subscription-balance")
        sampler = s.tasks.create_task(
            SubscriptionSampler(node.runtimes).run(settings.metrics.sample_interval_s),
            name="subscription-metrics",
        )
        s.started.set()
        log.info("dispatcher %s up", node_id)
        await wait_for_any(stop, s.lease.lost)
        watcher.cancel()
        balancer.cancel()
        sampler.cancel()
        await claims.drain()
        await node.close(release=s.lease.alive)

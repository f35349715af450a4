"""The process entry every service shares: settings, logging, signals, exit codes.

A service provides ``serve(settings, node_id, stop)``: it runs until ``stop`` is set
(SIGTERM or SIGINT) and returns, or raises to end the process with a failure, which
the supervisor (or the container runtime) answers with a restart.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import os
import signal
import socket
import sys
import time
from collections.abc import AsyncIterator, Callable, Coroutine, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from prometheus_client import Counter

from danube.aio import awaited_task, cancel_all_and_wait, cancel_and_wait, task_stacks, wait_any
from danube.bus import Bus
from danube.config import ConfigError, DanubeSettings, load_settings
from danube.config.model import ServiceConfig
from danube.meta import Lease, LeaseLostError, MetaError, MetaStore
from danube.meta import keys as meta_keys
from danube.meta.backoff import backoff_s
from danube.meta.keys import ServiceKind
from danube.meta.records import NodeRecord
from danube.runtime import topic_metrics
from danube.runtime.allocator import keep_freed_memory
from danube.runtime.gcpause import collect_fully_less_often, track_gc_pauses
from danube.runtime.healthcheck import probe_url, write_health_file
from danube.runtime.http import HealthServer, NotReady
from danube.runtime.listener import AcceptBackoffLoop, raise_open_files_limit
from danube.runtime.logs import configure_logging
from danube.runtime.looplag import watch_loop_lag
from danube.runtime.slots import SLOTS_ENV, Slot, SlotError, claim_slot
from danube.wire.sizes import check_message_fits

log = logging.getLogger(__name__)

LOG_LEVEL_ENV = "DANUBE_LOG_LEVEL"  # a process variable (danube.config.PROCESS_VARIABLES)
LOG_LEVELS = frozenset({"DEBUG", "INFO", "WARNING", "ERROR"})

NODE_ID_ENV = "DANUBE_NODE_ID"
Serve = Callable[[DanubeSettings, str, asyncio.Event], Coroutine[Any, Any, None]]

# Counted before the process ends for it (a supervisor restarts it): the alert rules also
# watch process restarts, as a scrape may miss this last increment.
LEASES_LOST = Counter("danube_node_lease_losses", "Node leases lost (etcd expired them)", ["kind"])

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_BAD_CONFIG = 2
# The health endpoint binds at once or not at all (port taken); this only bounds the wait.
HEALTH_START_TIMEOUT_S = 10.0


def node_id_for(kind: str) -> tuple[str, Slot | None]:
    """This process's node id, and the slot that holds it if it came from one.

    ``$DANUBE_NODE_ID`` if set (``danube up`` sets it); else, when ``$DANUBE_NODE_SLOTS``
    names a directory shared by the replicas of a kind (containers), the lowest free slot
    ``<kind>-<n>``, held while the process lives (:mod:`danube.runtime.slots`); else
    ``<kind>-<hostname>``. Each is stable across restarts, which an ingest node needs to
    take its partitions back. Two instances of one kind on one host must be given
    distinct ids or a slot directory."""
    named = os.environ.get(NODE_ID_ENV)
    if named:
        return named, None
    slots = os.environ.get(SLOTS_ENV)
    if slots:
        slot = claim_slot(Path(slots), kind)
        return slot.node_id, slot
    return f"{kind}-{socket.gethostname()}", None


def run_service(
    kind: str,
    serve: Serve,
    loop_factory: Callable[[], asyncio.AbstractEventLoop] = AcceptBackoffLoop,
) -> None:
    """Run ``serve`` as this process's main task, on a loop of ``loop_factory``, and exit
    with its outcome."""
    level = os.environ.get(LOG_LEVEL_ENV, "info").strip().upper() or "INFO"
    if level not in LOG_LEVELS:
        sys.stderr.write(f"{LOG_LEVEL_ENV}={level.lower()}: not one of {sorted(LOG_LEVELS)}\n")
        sys.exit(EXIT_BAD_CONFIG)
    configure_logging(kind, level=level)
    try:
        node_id, slot = node_id_for(kind)
    except SlotError as exc:
        log.error("no node id: %s", exc)
        sys.exit(EXIT_BAD_CONFIG)
    soft, hard = raise_open_files_limit()
    log.info("open files limit %d (hard %d)", soft, hard)
    # Known before the settings, so the file can name per-node state after it
    # (`dir: "/var/lib/danube/wal/${DANUBE_NODE_ID}"`).
    os.environ[NODE_ID_ENV] = node_id
    try:
        settings = load_settings()
    except ConfigError as exc:
        log.error("bad configuration: %s", exc)
        sys.exit(EXIT_BAD_CONFIG)
    # What this process built to start (modules, settings, their objects) lives as long as
    # it does: out of the cyclic GC's way, so that the full collections that long-lived
    # young objects (a message cache, requests in flight) set off do not walk it each time.
    gc.freeze()
    collect_fully_less_often()
    track_gc_pauses()  # danube_gc_pause_seconds: what the collections that remain cost
    keep_freed_memory()  # ~1 MB buffers per batched produce: reused, not faulted in anew
    try:
        with asyncio.Runner(loop_factory=loop_factory) as runner:
            runner.run(_main(serve, settings, node_id))
    except ConfigError as exc:  # found by the service at start (e.g. a volume too small)
        log.error("bad configuration: %s", exc)
        sys.exit(EXIT_BAD_CONFIG)
    except Exception:
        log.exception("%s %s failed", kind, node_id)
        sys.exit(EXIT_FAILED)
    finally:
        if slot is not None:
            slot.release()
    log.info("%s %s stopped", kind, node_id)
    sys.exit(EXIT_OK)


async def _main(serve: Serve, settings: DanubeSettings, node_id: str) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    failures = 0
    while True:
        try:
            await serve(settings, node_id, stop)
            return
        except LeaseLostError as exc:
            # The node lease expired before the service was asked to stop (node_session
            # raises it on the way out). Everything the lease guarded is fenced already
            # (and its keys expired in etcd). Stay up and serve again under a new lease once
            # etcd answers: a restart of the process would only add its start-up to the
            # outage.
            log.warning("%s; serving again once etcd answers", exc)
        except MetaError as exc:
            if failures == 0 or stop.is_set():
                raise  # etcd unreachable at start: a configuration problem, not an outage
            log.warning("etcd does not answer yet: %s", exc)
        failures += 1
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(backoff_s(failures - 1, base_s=0.5, cap_s=5.0)):
                await stop.wait()
        if stop.is_set():
            return


async def register_node(
    store: MetaStore,
    kind: ServiceKind,
    node_id: str,
    address: str,
    lease: Lease,
    *,
    data_url: str | None = None,
    grpc_url: str | None = None,
) -> None:
    """Announce this process at ``nodes/<kind>/<node_id>``, under its lease: the key goes
    when the process does, which is how the controller and ``GET /v1/cluster`` see it,
    and lookups the ``data_url`` of its data door and the ``grpc_url`` of its gRPC door."""
    record = NodeRecord(
        node_id=node_id,
        kind=kind,
        address=address,
        data_url=data_url,
        grpc_url=grpc_url,
        started_ms=int(time.time() * 1000),
    )
    await store.put_model(meta_keys.node_key(kind, node_id), record, lease=lease)


async def wait_for_any(*events: asyncio.Event) -> None:
    """Return as soon as one of ``events`` is set."""
    await wait_any(*events)


@dataclass
class NodeSession:
    """What every internal service process holds while it runs (see :func:`node_session`):
    its bus and etcd connections, its node lease, and the task group its work runs in."""

    node_id: str
    kind: ServiceKind
    bus: Bus
    store: MetaStore
    lease: Lease
    tasks: asyncio.TaskGroup
    lease_ttl_s: int
    renew_lease: bool = False
    started: asyncio.Event = field(default_factory=asyncio.Event)
    """Set by the service once it serves: /readyz answers 200 from then on (while the bus
    is connected, the lease alive and every one of :attr:`ready_checks` passes)."""
    renewed: list[Callable[[Lease], object]] = field(default_factory=list)
    """Called with each new lease taken after a loss (``renew_lease``): a service whose
    claims sit under the node lease writes them again under the new one."""
    ready_checks: list[Callable[[], NotReady | None]] = field(default_factory=list)
    """The service's own readiness conditions: each returns why it is not ready, or None."""
    data_url: str | None = None
    """Where clients reach this node's data door (:meth:`advertise`), in its registration."""
    grpc_url: str | None = None
    """Where Danube's clients reach this node's gRPC door, in its registration."""
    _address: str | None = None
    _renewal: asyncio.Task[None] | None = None

    def not_ready(self) -> list[NotReady]:
        """Why the service is not ready now (``/readyz``); empty when it is."""
        reasons: list[NotReady] = []
        if not self.started.is_set():
            reasons.append(NotReady("starting", f"{self.kind} {self.node_id} is starting"))
        if not self.bus.is_connected:
            reasons.append(NotReady("bus_disconnected", "the bus (NATS) is not connected"))
        if not self.lease.alive:
            reasons.append(NotReady("lease_lost", "the node lease (etcd) is lost"))
        for check in self.ready_checks:
            reason = check()
            if reason is not None:
                reasons.append(reason)
        return reasons

    async def register(self, address: str) -> None:
        """Announce this node at ``nodes/<kind>/<node_id>`` with ``address`` under the node
        lease (:func:`register_node`); with ``renew_lease``, keep it announced through lost
        leases from now on."""
        self._address = address
        await self._register(self.lease)
        if self.renew_lease and self._renewal is None:
            self._renewal = self.tasks.create_task(self._stay_registered(), name="registration")

    async def advertise(self, data_url: str | None = None, *, grpc_url: str | None = None) -> None:
        """Name ``data_url`` as this node's data door and ``grpc_url`` as its gRPC door (those
        given) in its registration (written again now; registered first with
        :meth:`register`)."""
        if data_url is not None:
            self.data_url = data_url
        if grpc_url is not None:
            self.grpc_url = grpc_url
        await self._register(self.lease)

    async def withdraw_doors(self) -> None:
        """Name no data or gRPC door in the registration any more (written again now),
        before a clean stop closes them: lookups stop naming them, and a peer finding them
        refuse connections does not take this node for dead (danube.runtime.liveness)
        while it still hands its work over. Best effort: etcd away, a peer may find out."""
        self.data_url = self.grpc_url = None
        try:
            await self._register(self.lease)
        except MetaError as exc:
            log.warning("%s %s: doors still registered: %s", self.kind, self.node_id, exc)

    async def leave(self) -> None:
        """Take this node's registration out of ``nodes/<kind>/`` before a clean stop hands
        its work over: peers counting the live nodes (the dispatchers' balancing) count it
        out at once and take what it hands over, rather than refusing it while the node
        still looks like the one to hold it until its lease goes. Best effort: etcd away,
        the key goes with the lease."""
        await cancel_all_and_wait([self._renewal])  # not written again under a new lease
        try:
            await self.store.delete(meta_keys.node_key(self.kind, self.node_id))
        except MetaError as exc:
            log.warning("%s %s: registered until the lease goes: %s", self.kind, self.node_id, exc)

    async def _register(self, lease: Lease) -> None:
        assert self._address is not None, "register() first"
        await register_node(
            self.store,
            self.kind,
            self.node_id,
            self._address,
            lease,
            data_url=self.data_url,
            grpc_url=self.grpc_url,
        )

    async def _stay_registered(self) -> None:
        """Register again under a new lease each time the lease is lost (an etcd stall
        longer than its TTL), once etcd answers."""
        failures = 0
        while True:
            await self.lease.lost.wait()
            log.warning("%s %s: node lease lost; registering again", self.kind, self.node_id)
            while True:
                try:
                    lease = await self.store.grant_lease(self.lease_ttl_s)
                    lease.on_lost(lambda _: LEASES_LOST.labels(self.kind).inc())
                    self.lease = lease
                    await self._register(lease)
                    log.info("%s %s registered again", self.kind, self.node_id)
                    failures = 0
                    break
                except MetaError as exc:
                    failures += 1
                    if failures == 1:
                        log.warning("%s: etcd does not answer yet: %s", self.node_id, exc)
                    # Capped at 1 s: a service serving through the outage (ingest) takes
                    # its claims back this soon after etcd returns.
                    await asyncio.sleep(backoff_s(failures - 1, base_s=0.2, cap_s=1.0))
            for callback in list(self.renewed):
                try:
                    callback(self.lease)
                except Exception:  # one bad callback must not keep the others from running
                    log.exception("%s: lease renewal callback %r failed", self.node_id, callback)


@asynccontextmanager
async def node_session(
    settings: DanubeSettings,
    kind: ServiceKind,
    node_id: str,
    config: ServiceConfig,
    stop: asyncio.Event,
    *,
    health_server: bool = True,
    renew_lease: bool = False,
    ready_checks: Sequence[Callable[[], NotReady | None]] = (),
) -> AsyncIterator[NodeSession]:
    """Connect to the bus and etcd, take a node lease, serve health on
    ``config.metrics_port``, register ``nodes/<kind>/<node_id>``; on exit close everything
    (closing the store revokes the lease: our keys go at once). Raises
    :class:`~danube.meta.LeaseLostError` after the block when the lease was lost rather than
    ``stop`` set.

    ``health_server=False``: the service answers ``/readyz`` on a port of its own and
    registers that address itself (:meth:`NodeSession.register`) once it listens; no health
    server here. ``renew_lease``: losing the node lease does not end the session: a new
    lease is taken and the registration written again once etcd answers, and no
    :class:`~danube.meta.LeaseLostError` is raised. Either the lease guards nothing but the
    registration (discovery), or the service fences by its own rule and writes its claims
    again under the new lease, told through :attr:`NodeSession.renewed` (ingest).
    ``ready_checks``: the service's own readiness conditions
    (:attr:`NodeSession.ready_checks`), in force from the health server's first answer."""
    topic_metrics.configure(settings.metrics)
    bus = await Bus.connect(settings.bus, name=node_id)
    try:
        check_message_fits(bus.max_payload_bytes, settings.ingest.max_message_bytes)
        store = await MetaStore.connect(settings.wal_cloud.metadata)
    except BaseException:
        await bus.close()
        raise
    try:
        lease = await store.grant_lease(config.lease_ttl_s)
        lease.on_lost(lambda _: LEASES_LOST.labels(kind).inc())
        async with asyncio.TaskGroup() as tasks:
            session = NodeSession(
                node_id, kind, bus, store, lease, tasks, config.lease_ttl_s, renew_lease
            )
            session.ready_checks.extend(ready_checks)
            lag = tasks.create_task(watch_loop_lag(), name="loop-lag")
            try:
                if not health_server:
                    yield session
                    return
                health = HealthServer(
                    config.host,
                    config.metrics_port,
                    ready=session.not_ready,
                    limits=config,
                )
                serving = tasks.create_task(health.serve(), name="health")
                await health.wait_started(serving, HEALTH_START_TIMEOUT_S)
                # The real port, not 0 ("any free port"): what the node registry and the
                # container healthcheck (the health file) point at.
                url = probe_url(config.host, health.port, tls=config.tls.enabled)
                await asyncio.to_thread(write_health_file, node_id, url)
                await session.register(f"{config.host}:{health.port}")
                yield session
                health.stop()
            finally:
                await cancel_all_and_wait([lag, session._renewal])
    finally:
        await store.close()
        await bus.close()
    if not renew_lease and lease.lost.is_set() and not stop.is_set():
        raise LeaseLostError(f"{kind} {node_id}: node lease lost", lease_id=lease.id)


# How long an in-process service may take to stop once asked (tests and benchmarks).
IN_PROCESS_STOP_S = 30.0


@asynccontextmanager
async def run_in_process(
    serve: Serve, settings: DanubeSettings, node_id: str, *, must_stop_cleanly: bool = False
) -> AsyncIterator[asyncio.Task[None]]:
    """Run a service's ``serve`` as a task of this process until the block ends (tests and
    benchmarks); ``must_stop_cleanly``: re-raise what it failed with, if anything. A service
    still running :data:`IN_PROCESS_STOP_S` after the block ends is cancelled and the block
    fails naming where each task waited (a hung stop would otherwise hold the test until its
    timeout and leave the service's bus subscriptions to answer the next test)."""
    stop = asyncio.Event()
    # Its outcome is the block's (raised when asked), not an owner's to log.
    task = awaited_task(serve(settings, node_id, stop), name=f"serve-{node_id}")
    try:
        yield task
    finally:
        stop.set()
        done, _ = await asyncio.wait([task], timeout=IN_PROCESS_STOP_S)
        if not done:  # a stop that hangs is a bug: say where, then end it
            stuck = task_stacks()
            await cancel_and_wait(task, timeout_s=IN_PROCESS_STOP_S)
            raise TimeoutError(
                f"{node_id} did not stop within {IN_PROCESS_STOP_S:.0f} s; its tasks:\n{stuck}"
            )
    outcome = asyncio.CancelledError() if task.cancelled() else task.exception()
    if must_stop_cleanly and outcome is not None:
        raise outcome  # a clean stop returns; anything else is a bug

"""A follower's copy loop for one leader epoch (docs/replication.md).

1. **Find the divergence**: ask the leader for its epoch history and end
   (``repl.epochs``), keep the longest prefix both logs agree on
   (:func:`danube.ingest.epochs.divergence`) and truncate the rest.
2. **Fetch**: long-poll the leader from the WAL's durable end (``repl.fetch``); the offset
   asked is the follower's report of what it holds durably, which is what moves the
   leader's high watermark. Append the frames (CRC-checked on arrival) at the same offsets,
   with the leader's epoch entries written first; mirror the leader's WAL start (retention).
   The fetches go straight to the leader's data door when it offers a link with its epoch
   history (danube.ingest.replica_link), else over the bus.

The loop ends when the leader answers that its epoch is over; the replica then reconciles.

**A killed leader.** Its owner key lives on with its lease for up to ``lease_ttl_s``, and a
fetch it took before it died is never answered (the bus tells the requester nothing). A
fetch unanswered ``QUIET_S`` past its wait (then every ``AGAIN_S``), or failing, asks
whether the leader is provably gone (danube.runtime.liveness: registered under the owner
key's lease, its door refusing connections); if so its lease is ended at once and the
replica reconciles: an in-sync one claims (docs/replication.md, "Failure cases").
"""

from __future__ import annotations

import asyncio
import logging
import time
from itertools import groupby
from typing import Protocol

import orjson

from danube.aio import GoneError, unless_gone
from danube.bus import Bus, BusError
from danube.config import DanubeSettings
from danube.frame import Frame, decode_frames
from danube.ingest import metrics
from danube.ingest.epochs import EpochHistory, divergence
from danube.ingest.replica_link import RETRY_S, LinkError, LinkOffer, ReplicaLink, ReplicaLinks
from danube.ingest.wal import DiskFullError, Wal
from danube.meta import MetaError, MetaStore, TopicName
from danube.meta import keys as meta_keys
from danube.meta.backoff import backoff_s
from danube.meta.records import Owner
from danube.runtime.liveness import GoneNodes
from danube.wire.ingest import protocol, replication
from danube.wire.sizes import body_limit

log = logging.getLogger(__name__)

_REQUEST_MARGIN_S = 5.0
EPOCHS_TIMEOUT_S = 1.0
"""A follower's first request to a new leader (``repl.epochs``, answered from memory)
waits this long, then asks again (the run loop's backoff). The follower asks as soon as it
sees the new owner key, which the claim writes before the new leader subscribes; NATS
routes a request to the subscribers it knows *when it is published*, so while the old
leader's subscription is still registered (a leader cut off by a silent link, its TCP
connection not closed yet) the request goes there alone and is never answered. With the
old 5 s deadline the new leader shrank its ISR meanwhile and refused produce with
not_enough_replicas for ~5 s (docs/chaos.md, isolate_leader)."""


# A fetch unanswered this long past its wait asks whether the leader is gone, then again
# every AGAIN_S (an etcd read per partition: a frozen leader's followers ask that often).
QUIET_S = 0.25
AGAIN_S = 1.0
# A leader that offered no link is asked once more this long after: a node opens its data
# door after its first terms began (at its start), and their followers asked before.
OFFER_AGAIN_S = 5.0


class _Restart(Exception):
    """Find the divergence again (the leader says this follower is past its end)."""


class NodeView(Protocol):
    """What a fetcher uses of its node (danube.ingest.replica.NodeContext is one)."""

    @property
    def settings(self) -> DanubeSettings: ...
    @property
    def node_id(self) -> str: ...
    @property
    def bus(self) -> Bus: ...
    @property
    def store(self) -> MetaStore: ...
    @property
    def gone_leaders(self) -> GoneNodes | None: ...
    @property
    def links(self) -> ReplicaLinks: ...


class Follower(Protocol):
    """The replica a fetcher copies into (danube.ingest.replica.Replica is one): named here
    so that the fetcher never imports the replica that owns it."""

    high_watermark: int

    @property
    def name(self) -> TopicName: ...
    @property
    def ctx(self) -> NodeView: ...
    @property
    def wal(self) -> Wal | None: ...
    @property
    def history(self) -> EpochHistory | None: ...
    @property
    def copy_damaged(self) -> bool: ...
    async def truncate(self, end: int) -> int: ...
    async def store_history(self, history: EpochHistory) -> None: ...
    def follow_ended(self) -> None: ...
    def kick(self) -> None: ...


class Fetcher:
    """Copies one leader epoch's log into a replica."""

    def __init__(self, replica: Follower, leader: str, epoch: int) -> None:
        self.replica = replica
        self.leader = leader
        self.epoch = epoch
        self._leader_history = EpochHistory()
        self.answered_s: float | None = None  # time.monotonic() of the leader's last answer
        self._link: ReplicaLink | None = None  # fetching straight from the leader's door
        self._no_link_until_s = 0.0  # time.monotonic() before which the bus is used
        self._offer_again_s: float | None = None  # when to ask a leader for a link again
        self._asked_again = False

    def heard_within(self, within_s: float, now_s: float) -> bool:
        """Whether the leader answered a fetch at this epoch within ``within_s``."""
        return self.answered_s is not None and now_s - self.answered_s <= within_s

    async def run(self) -> None:
        """Follow until the epoch is over (then tell the replica) or cancelled."""
        failures = 0
        try:
            while True:
                try:
                    await self._truncate_to_divergence()
                    await self._fetch_loop()
                    self.replica.follow_ended()
                    return
                except _Restart:
                    continue
                except LinkError as exc:
                    # Over the bus from now on (for RETRY_S); at once, without a backoff:
                    # the link may have failed for itself. A killed leader's door refuses.
                    failures += 1
                    metrics.REPLICA_LINK_FAILURES.inc()
                    log.info("%s: %s; fetching over the bus", self.replica.name, exc)
                    self._no_link_until_s = time.monotonic() + RETRY_S
                    await self._drop_link()
                    await self._leader_gone()
                    continue
                except (BusError, TimeoutError, protocol.BadRequestError, DiskFullError) as exc:
                    failures += 1
                    log.info("%s: following %s failed: %s", self.replica.name, self.leader, exc)
                    if isinstance(exc, BusError | TimeoutError):
                        await self._leader_gone()  # a killed leader: its lease ends now
                    await asyncio.sleep(backoff_s(failures - 1, base_s=0.05, cap_s=1.0))
                except GoneError:
                    await asyncio.sleep(QUIET_S)  # the replica reconciles and ends this loop
        finally:
            await self._drop_link()

    async def _take_link(self, offer: LinkOffer | None) -> None:
        """Fetch over the link ``offer`` names from now on, if it may (else the bus)."""
        link = self._link
        if link is not None and link.offer == offer:
            return
        await self._drop_link()
        if offer is not None and time.monotonic() >= self._no_link_until_s:
            self._link = self.replica.ctx.links.open(self.leader, offer, self.replica.name)

    async def _drop_link(self) -> None:
        link, self._link = self._link, None
        if link is not None:
            await link.close()

    async def _leader_gone(self) -> bool:
        """Whether this epoch's leader is provably gone; if so its lease is ended (its
        owner key goes) and the replica is told to reconcile at once."""
        ctx, name = self.replica.ctx, self.replica.name
        probes = ctx.gone_leaders
        if probes is None:
            return False
        try:
            found = await ctx.store.get_model_kv(meta_keys.partition_owner_key(name), Owner)
            if found is None or (found[0].node_id, found[0].epoch) != (self.leader, self.epoch):
                return False  # gone already, or another epoch: the replica sees to it
            if await probes.gone(self.leader, found[1].lease_id) is None:
                return False
        except MetaError:
            return False  # etcd away: the lease is left to expire
        self.answered_s = None  # no grace to give it (Act.HOLD): it will not come back
        self.replica.kick()
        return True

    async def _truncate_to_divergence(self) -> None:
        replica = self.replica
        bus = replica.ctx.bus
        reply = await bus.request(
            bus.subjects.repl_epochs(replica.name),
            protocol.encode_offset(self.epoch),
            timeout_s=EPOCHS_TIMEOUT_S,
        )
        body = orjson.loads(reply.body)
        if body.get("epoch") != self.epoch:
            raise protocol.BadRequestError(f"leader answered epoch {body.get('epoch')}")
        self._leader_history = EpochHistory.from_json(body["epochs"])
        leader_end = int(body["end"])
        offer = LinkOffer.from_json(body.get("link"))
        await self._take_link(offer)
        if offer is None and not self._asked_again:
            self._offer_again_s = time.monotonic() + OFFER_AGAIN_S
        wal = replica.wal
        assert wal is not None
        mine = replica.history or EpochHistory()
        cut = divergence(mine, wal.next_offset, self._leader_history, leader_end)
        if cut < wal.next_offset:
            await replica.truncate(cut)
        assert replica.wal is not None
        await replica.store_history(self._leader_history.until(replica.wal.next_offset))

    async def _fetch_loop(self) -> None:
        replica = self.replica
        ctx = replica.ctx
        bus = ctx.bus
        ingest = ctx.settings.ingest
        max_bytes = max(body_limit(bus.max_payload_bytes), 4096)
        subject = bus.subjects.repl_fetch(replica.name)
        while True:
            again_s = self._offer_again_s
            if again_s is not None and time.monotonic() >= again_s:
                self._offer_again_s, self._asked_again = None, True
                raise _Restart()  # its epochs again, and the link they may offer now
            wal = replica.wal
            assert wal is not None
            link = self._link
            # A long poll on the door is answered within its timeout: half of it at most.
            wait_s = ingest.replica_fetch_wait_s
            if link is not None:
                wait_s = min(wait_s, ingest.data_timeout_s / 2)
            request = replication.ReplFetchRequest(
                self.epoch,
                wal.durable_next,
                max_bytes,
                int(wait_s * 1000),
                ctx.node_id,
                damaged=replica.copy_damaged,  # never handed leadership before it repaired
            ).encode()
            timeout_s = wait_s + _REQUEST_MARGIN_S
            raw = await unless_gone(
                link.fetch(request, timeout_s)
                if link is not None
                else _over_bus(bus, subject, request, timeout_s),
                self._leader_gone,
                quiet_s=wait_s + QUIET_S,
                every_s=AGAIN_S,
                name=f"fetch of {replica.name} from {self.leader}",
            )
            reply = replication.decode_repl_reply(raw)
            if reply.status is replication.ReplStatus.WRONG_EPOCH:
                return
            self.answered_s = time.monotonic()
            if reply.status is replication.ReplStatus.AHEAD:
                raise _Restart()
            replica.high_watermark = max(replica.high_watermark, reply.high_watermark)
            if reply.status is replication.ReplStatus.BELOW_WAL_START:
                # What lies below the leader's WAL start is in the cloud tier already.
                await wal.advance_to(reply.wal_start)
                continue
            frames, consumed = decode_frames(reply.frames)
            if consumed != len(reply.frames):
                raise protocol.BadRequestError("replication reply ends in a partial frame")
            if frames:
                await self._append(frames)
            if reply.wal_start > wal.start_offset:
                await wal.drop_below(min(reply.wal_start, replica.high_watermark))

    async def _append(self, frames: list[Frame]) -> None:
        replica = self.replica
        wal = replica.wal
        assert wal is not None
        end = frames[-1].offset + 1
        # The epochs before the frames they describe.
        await replica.store_history(self._leader_history.until(end))
        # Runs of consecutive offsets; a gap in the leader's log is a gap here too.
        for _, run in groupby(enumerate(frames), key=lambda item: item[1].offset - item[0]):
            batch = [frame for _, frame in run]
            first = batch[0].offset
            if first < wal.next_offset:
                raise _Restart()  # overlaps what this replica has: compare histories again
            if first > wal.next_offset:
                await wal.advance_to(first)
            # Framed once more, into one buffer (the WAL writes each frame's offset and CRC
            # where it lies: the leader's offsets, so the leader's bytes).
            await wal.append([frame.payload for frame in batch])
        metrics.REPLICATED_MESSAGES.inc(len(frames))


async def _over_bus(bus: Bus, subject: str, request: bytes, timeout_s: float) -> bytes:
    reply = await bus.request(subject, request, timeout_s=timeout_s)
    return reply.body

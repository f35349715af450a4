"""The metrics one served subscription feeds from its machine (danube.dispatcher.metrics):
what a poll delivered, and the running totals the machine keeps (messages expired; delayed
messages spilled, read again from the log, loaded from snapshots), added to their counters
as they grow. The subscription's runtime owns one :class:`SubscriptionCounts`."""

from __future__ import annotations

from prometheus_client import Counter

from danube.dispatcher import metrics, tiers
from danube.dispatcher.delayed import DelayedMessages
from danube.dispatcher.delivery import SubscriptionMachine
from danube.dispatcher.events import Deliver
from danube.frame import FRAME_HEADER_BYTES
from danube.meta import TopicName
from danube.runtime.topic_metrics import subscription_labels
from danube.wire.dispatcher import protocol


class SubscriptionCounts:
    """The counters of subscription ``sub`` of ``topic``; of each running total, what the
    counter has so far."""

    def __init__(self, topic: TopicName, sub: str) -> None:
        self._topic = topic
        self._sub = sub
        self._out: tuple[Counter, Counter, Counter] | None = None  # messages, bytes, again
        self._expired = 0  # of machine.expired
        self._spilled = 0  # of the delayed messages' spilled_bytes
        self._reread = 0  # of their reread_frames
        self._loaded = 0  # of their loaded_records

    def poll_reply(self, deliver: Deliver) -> bytes:
        """The poll reply (its columns are those of ``deliver``: a poll's answer is one
        Deliver), its messages and bytes counted."""
        partitions, counts = deliver.partitions, deliver.redelivery_counts
        frames = tiers.frame_views(deliver.payloads)
        redelivered = len(counts) - counts.count(0)
        metrics.observe_delivery_age(counts, frames)
        metrics.DELIVERED.inc(len(frames))
        metrics.REDELIVERED.inc(redelivered)
        out = self._out
        if out is None:  # the subscription's series, looked up once
            labels = subscription_labels(self._topic, self._sub)
            out = self._out = (
                metrics.SUB_MESSAGES_OUT.labels(*labels),
                metrics.SUB_BYTES_OUT.labels(*labels),
                metrics.SUB_REDELIVERED.labels(*labels),
            )
        out[0].inc(len(frames))
        out[1].inc(sum(map(len, frames)) - FRAME_HEADER_BYTES * len(frames))
        if redelivered:
            out[2].inc(redelivered)
        return protocol.encode_poll_columns(partitions, counts, frames)

    def follow(self, machine: SubscriptionMachine) -> None:
        """Add to the counters what the machine's running totals grew by since the last
        call (after each event it handled)."""
        if machine.delayed is not None:
            self._follow_delayed(machine.delayed)
        expired = machine.expired
        if expired > self._expired:
            labels = subscription_labels(self._topic, self._sub)
            metrics.SUB_EXPIRED.labels(*labels).inc(expired - self._expired)
            self._expired = expired

    def _follow_delayed(self, delayed: DelayedMessages) -> None:
        if delayed.spilled_bytes > self._spilled:
            metrics.DELAYED_SPILLED.inc(delayed.spilled_bytes - self._spilled)
            self._spilled = delayed.spilled_bytes
        if delayed.reread_frames > self._reread:
            metrics.DELAYED_REREAD.inc(delayed.reread_frames - self._reread)
            self._reread = delayed.reread_frames
        if delayed.loaded_records > self._loaded:
            metrics.DELAYED_SNAPSHOT_LOADED.inc(delayed.loaded_records - self._loaded)
            self._loaded = delayed.loaded_records

"""Message TTL, the subscription machine's share (danube.dispatcher.delivery mixes it in):
a message past its expiry is never delivered; it is acknowledged on the subscription's
behalf instead (its cursor moves past it, so the backlog drops) and counted.

A message expires at ``publish_time_ms + ttl_ms``: its own ``danube.ttl_ms`` attribute when
it has a valid one, else the topic's ``message_ttl_s`` policy (else its namespace's), as the
runtime read it when the message was read (:func:`expiry_ms`, filed on the entry). Expiry is
judged at delivery, against the wall clock the event carries (``Poll.wall_ms``): a fresh
message or a redelivery alike. A tick also sweeps the oldest messages held (at most
``SWEEP_SCAN_MAX`` a tick), so a subscription nobody polls lets its expired backlog go too.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from functools import partial

from danube.dispatcher.entries import Entry, PartitionQueue, Ref
from danube.frame import (
    RECORD_HEADER,
    RECORD_HEADER_BYTES,
    SEQUENCED_HEADER_BYTES,
    SEQUENCED_RECORD_VERSION,
    RawFrame,
)
from danube.frame.errors import FrameError
from danube.frame.record import read_attributes
from danube.wire.delivery import TTL_ATTRIBUTE, TTL_MS_MAX

# A tick looks at this many of the oldest messages held at most (the sweep's cost bound).
SWEEP_SCAN_MAX = 4096
_SWEPT_STATES = ("fresh", "ready", "scheduled")
_TTL_NAME = TTL_ATTRIBUTE.encode()

ExpiryOf = Callable[[object], int | None]


def expiry_ms(payload: object, policy_ttl_ms: int | None) -> int | None:
    """When the record in ``payload`` (its frame as read, or the record bytes) expires, in
    Unix ms; None when it never does. Its own ``danube.ttl_ms`` (a whole number of ms,
    1 … ``TTL_MS_MAX``) wins over ``policy_ttl_ms``; another value there is ignored. A
    record whose header does not unpack, or whose attributes (decoded only when their bytes
    hold the name) do not decode, never expires (the consumer's own check reports it).

    This runs for every message a subscription reads, so the usual case reads the header
    alone (~1 µs) and checks nothing else: a record damaged elsewhere (its version, flags,
    text or lengths) is timed by its header like any other. Records reach the dispatcher
    checked (the produce scan, then the CRC of every read); a full decode here would cost
    several times as much (measured: ~7 µs a record against ~1 µs)."""
    record = payload.record if isinstance(payload, RawFrame) else payload
    if not isinstance(record, bytes | bytearray | memoryview):
        return None
    view = memoryview(record)
    try:
        version, _, time_ms, _, _, producer_len, key_len, count, payload_len = (
            RECORD_HEADER.unpack_from(view, 0)
        )
        ttl_ms = policy_ttl_ms
        if count:  # the text after the header of the record's version
            start = (
                SEQUENCED_HEADER_BYTES
                if version == SEQUENCED_RECORD_VERSION
                else RECORD_HEADER_BYTES
            )
            at = start + producer_len + key_len
            if _TTL_NAME in bytes(view[at : len(view) - payload_len]):
                attributes: dict[str, str] = {}
                read_attributes(view, at, len(view), count, attributes)
                own = _ttl(attributes.get(TTL_ATTRIBUTE))
                ttl_ms = own if own is not None else ttl_ms
    except (FrameError, ValueError, IndexError, struct.error):
        return None
    return None if ttl_ms is None else int(time_ms) + ttl_ms


def _ttl(value: str | None) -> int | None:
    if value is None or not value.isdigit():
        return None
    ttl_ms = int(value)
    return ttl_ms if 1 <= ttl_ms <= TTL_MS_MAX else None


def _never(payload: object) -> int | None:
    return None


class ExpiryHandling:
    """The TTL share of the subscription machine; its state is the machine's."""

    _entries: dict[Ref, Entry]
    _partitions: dict[str, PartitionQueue]
    # Set by the runtime: when a payload expires (expiry_ms with the policy in effect).
    expiry_of: ExpiryOf = staticmethod(_never)
    expired = 0  # messages let go expired, since this machine was built
    _wall_ms: int | None = None  # the wall clock of the event being handled
    _expiring = False  # an entry with an expiry was ever held: ticks sweep

    def _forget(self, entry: Entry) -> None:
        raise NotImplementedError

    def _expire(self, entry: Entry) -> bool:
        """True when ``entry`` is past its expiry now: acknowledged on the subscription's
        behalf (forgotten, its cursor acked), counted, never to be delivered. An entry let
        go earlier (still in a fresh queue) is True as well."""
        if entry.state == "expired":
            return True
        expires, now = entry.expires_ms, self._wall_ms
        if expires is None or now is None or expires >= now:
            return False
        self._forget(entry)
        entry.state = "expired"
        entry.stamp = -1  # heap items of it never match again
        self._partitions[entry.partition].cursor.ack(entry.offset)
        self.expired += 1
        return True

    def _sweep_expired(self) -> None:
        """Let go of the oldest expired messages held and not in flight (a consumer holding
        one acks it or lets it time out): the heads of the fresh queues, then the first
        SWEEP_SCAN_MAX entries in read order (redeliveries waiting, key-shared's keyed
        messages). A message still in a fresh queue is let go only from its head, so
        the queue never keeps what the machine no longer counts."""
        if not self._expiring or self._wall_ms is None:
            return
        budget = SWEEP_SCAN_MAX
        for partition in self._partitions.values():
            fresh = partition.fresh
            while fresh and budget > 0 and self._expire(fresh[0]):
                fresh.popleft()
                budget -= 1
        found: list[Entry] = []
        for scanned, entry in enumerate(self._entries.values()):
            if scanned >= budget:
                break
            queued = entry.state == "fresh" and entry.key is None  # in a fresh queue
            if entry.state in _SWEPT_STATES and entry.consumer_id is None and not queued:
                found.append(entry)
        for entry in found:
            self._expire(entry)


def expiry_for(message_ttl_s: int | None) -> ExpiryOf:
    """The machine's ``expiry_of`` under a ``message_ttl_s`` policy (None: unset; messages
    with their own ``danube.ttl_ms`` still expire)."""
    policy_ttl_ms = None if message_ttl_s is None else message_ttl_s * 1000
    return partial(expiry_ms, policy_ttl_ms=policy_ttl_ms)

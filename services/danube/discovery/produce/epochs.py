"""Producer epochs (docs/producers.md, "Epochs"): the incarnations of an idempotent producer
of one name on one topic, handed out by etcd compare-and-swap, so that a restarted instance
fences the one it replaces.

The key ``producer_epochs/<ns>/<t>/<name>`` holds the newest epoch handed out (decimal text);
each call writes the next one only if the key is as it was read, so two instances asking at
once get two different epochs, and the later one is the higher. The partitions' leaders
compare them (an older epoch than the newest seen for the name is ``producer_fenced``):
this module only counts.
"""

from __future__ import annotations

import asyncio

from danube.discovery.errors import ConflictError
from danube.meta import MetaStore, TopicName
from danube.meta import keys as meta_keys
from danube.meta.backoff import backoff_s
from danube.meta.errors import MetaDecodeError

EPOCH_MAX = 2**32 - 1
"""A record carries the epoch as a u32 (danube.frame.record, format version 2)."""
# Callers racing for the same name: how often to read again, and how long to wait between.
_TRIES = 16
_RETRY_BASE_S = 0.01
_RETRY_CAP_S = 0.2


async def next_epoch(store: MetaStore, topic: TopicName, producer: str) -> int:
    """The next epoch of ``producer`` on ``topic`` (its partitions share it): the previous
    one + 1, 1 the first time. 409 ``epochs_exhausted`` past ``EPOCH_MAX``; 409
    ``conflict`` when others kept taking epochs of the name through every try."""
    key = meta_keys.producer_epoch_key(topic, producer)
    for attempt in range(_TRIES):
        kv = await store.get(key)
        previous = 0 if kv is None else _decode(key, kv.value)
        if previous >= EPOCH_MAX:
            raise ConflictError(
                f"producer {producer!r} of {topic.parent} used every epoch (up to {EPOCH_MAX})",
                code="epochs_exhausted",
            )
        epoch = previous + 1
        revision = 0 if kv is None else kv.mod_revision
        if await store.compare_and_swap(key, b"%d" % epoch, expected_mod_revision=revision):
            return epoch
        await asyncio.sleep(backoff_s(attempt, base_s=_RETRY_BASE_S, cap_s=_RETRY_CAP_S))
    raise ConflictError(
        f"the epoch of producer {producer!r} of {topic.parent} changed {_TRIES} times while "
        "being taken; ask again",
        code="conflict",
    )


def _decode(key: str, value: bytes) -> int:
    if not value.isdigit():
        raise MetaDecodeError(key=key, reason=f"not an epoch: {value[:40]!r}")
    return int(value)

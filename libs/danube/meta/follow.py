"""Follow every change under a prefix for good: the one loop services use to react to etcd
(ingest to its partitions' keys, the dispatcher to its subscriptions' owner keys)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from danube.errors import DanubeError
from danube.meta.backoff import backoff_s
from danube.meta.errors import MetaError, WatchCompactedError, WatchError
from danube.meta.watch import WatchEvent

if TYPE_CHECKING:
    from danube.meta.store import MetaStore

log = logging.getLogger(__name__)

_RETRY_BASE_S = 0.1
_RETRY_CAP_S = 5.0


async def follow_prefix(
    store: MetaStore,
    prefix: str,
    on_event: Callable[[WatchEvent], None],
    *,
    start_revision: int | None = None,
    on_resync: Callable[[], Awaitable[int]] | None = None,
) -> None:
    """Pass every change under ``prefix`` to ``on_event`` (from ``start_revision`` on),
    until cancelled. A broken watch resumes where it stopped, after a capped, jittered
    backoff; an event ``on_event`` rejects (ValueError, or a DanubeError such as a key it
    cannot parse) is logged and skipped.

    Where it stopped may have been compacted away meanwhile (etcd keeps no history before
    its compaction revision): the changes in between are lost, so ``on_resync`` re-reads
    what the caller follows and returns the revision it read at, and the watch goes on from
    the next one. Without ``on_resync``, it goes on from the oldest revision etcd keeps (a
    caller that also polls catches up on its next poll)."""
    revision = start_revision
    failures = 0
    while True:
        try:
            async with store.watch_prefix(prefix, start_revision=revision) as events:
                async for event in events:
                    failures = 0
                    revision = event.mod_revision + 1
                    try:
                        on_event(event)
                    except (ValueError, DanubeError) as exc:  # a key it cannot parse
                        log.warning("watch of %s: %s: %s", prefix, event.key, exc)
        except WatchCompactedError as exc:
            log.warning("watch of %s: %s", prefix, exc)
            if on_resync is None:
                revision = exc.compact_revision
            else:
                try:
                    revision = await on_resync() + 1
                except MetaError as failed:  # the same revision again: compacted, tried again
                    log.warning("watch of %s: reading the state again failed: %s", prefix, failed)
        except WatchError as exc:
            revision = exc.resume_revision or revision
        except MetaError as exc:
            log.warning("watch of %s failed: %s", prefix, exc)
        failures += 1
        await asyncio.sleep(backoff_s(failures - 1, base_s=_RETRY_BASE_S, cap_s=_RETRY_CAP_S))

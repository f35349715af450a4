"""The node's load as the controller sees it: appended bytes/s, reported in this node's
registration (``NodeRecord.load``) so that placement and the balancer can break count ties by
it (danube.meta.placement, docs/controller.md "Balancing").

:class:`LoadMeter` is pure (counter readings and times come in); :func:`report_load` reads
the process's appended-bytes counter every ``interval_s`` and rewrites the registration
when the rate moved by more than ``change_min`` (relative) since the last report, compared
on the key's revision (the registration is the session's: never recreated here).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from prometheus_client import REGISTRY

from danube.meta import Lease, MetaStore, encode_model
from danube.meta import keys as meta_keys
from danube.meta.records import NodeRecord

log = logging.getLogger(__name__)

REPORT_INTERVAL_S = 10.0
CHANGE_MIN = 0.2  # report again once the rate moved by a fifth
RATE_FLOOR_BYTES_S = 64 * 1024  # below this, changes are noise: not worth a write


@dataclass
class LoadMeter:
    """Bytes/s between two readings of a monotonic byte counter, and whether it changed
    enough since the last reported rate to report it."""

    total_bytes: float
    at_s: float
    reported: float | None = None

    def rate(self, total_bytes: float, now_s: float) -> float:
        """The rate since the previous reading (0 for no time passed); the reading is kept."""
        elapsed_s = now_s - self.at_s
        rate = 0.0 if elapsed_s <= 0 else max(0.0, total_bytes - self.total_bytes) / elapsed_s
        self.total_bytes, self.at_s = total_bytes, now_s
        return rate

    def worth_reporting(self, rate: float) -> bool:
        """Whether ``rate`` differs enough from the last report (always, the first time)."""
        if self.reported is None:
            return True
        if max(rate, self.reported) < RATE_FLOOR_BYTES_S:
            return False
        return abs(rate - self.reported) > CHANGE_MIN * max(self.reported, RATE_FLOOR_BYTES_S)


def appended_bytes() -> float:
    """The process's appended payload bytes so far (danube_ingest_appended_bytes_total)."""
    return REGISTRY.get_sample_value("danube_ingest_appended_bytes_total") or 0.0


async def report_load(
    store: MetaStore,
    node_id: str,
    current_lease: Callable[[], Lease],
    *,
    interval_s: float = REPORT_INTERVAL_S,
) -> None:
    """Keep ``nodes/ingest/<node_id>``'s ``load`` near the node's appended bytes/s, under
    the node's lease as ``current_lease()`` gives it; runs until cancelled (etcd failures
    are logged and tried again next time)."""
    meter = LoadMeter(appended_bytes(), time.monotonic())
    key = meta_keys.node_key("ingest", node_id)
    while True:
        await asyncio.sleep(interval_s)
        rate = meter.rate(appended_bytes(), time.monotonic())
        lease = current_lease()
        if not meter.worth_reporting(rate) or not lease.alive:
            continue
        try:
            found = await store.get_model_kv(key, NodeRecord)
            if found is None:
                continue  # not registered (yet, or any more): the session owns the key
            record = found[0].model_copy(update={"load": round(rate, 1)})
            result = await (
                store.txn()
                .if_mod_revision(key, "==", found[1].mod_revision)
                .then_put(key, encode_model(record), lease=lease)
                .commit()
            )
            if result.succeeded:
                meter.reported = rate
        except Exception as exc:  # etcd: the next round tries again
            log.info("could not report this node's load: %s", exc)

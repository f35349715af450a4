"""The cluster's object store, recorded in etcd at each start (``cluster/object_store``,
docs/metadata.md): the ``wal_cloud.cloud`` section without credentials, so that a reader
given only the etcd endpoint (``danube backfill``) finds the objects where they are."""

from __future__ import annotations

import logging
import time

from danube.config import CloudConfig
from danube.meta import MetaStore
from danube.meta import keys as meta_keys
from danube.meta.records import ObjectStoreRecord
from danube.storage.location import public_settings

log = logging.getLogger(__name__)


async def record_object_store(store: MetaStore, cloud: CloudConfig, node_id: str) -> bool:
    """Record ``cloud`` as the cluster's object store unless the same is recorded already
    (every uploader start calls this: idempotent); return whether it wrote. A different
    section recorded before is replaced, said in the log: the config changed, or two
    uploaders disagree (one of them cannot be writing where the readers look)."""
    wanted = public_settings(cloud)
    found = await store.get_model(meta_keys.OBJECT_STORE_KEY, ObjectStoreRecord)
    if found is not None and found.cloud == wanted:
        return False
    if found is not None:
        log.warning(
            "the cluster's object store changes",
            extra={"before": found.cloud, "by": found.recorded_by, "after": wanted},
        )
    record = ObjectStoreRecord(
        cloud=wanted, recorded_by=node_id, updated_ms=int(time.time() * 1000)
    )
    await store.put_model(meta_keys.OBJECT_STORE_KEY, record)
    log.info("object store recorded", extra={"cloud": wanted})
    return True

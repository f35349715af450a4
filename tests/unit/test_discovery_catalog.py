"""The produce path's topic cache: fresh entries, and a stale one while etcd fails."""

from __future__ import annotations

from typing import Any

import pytest

from danube.discovery.catalog import Catalog
from danube.meta import TopicName
from danube.meta.errors import MetaUnavailableError
from danube.meta.records import TopicConfig

pytestmark = pytest.mark.unit

TOPIC = TopicName("default", "t")


class FlakyStore:
    """Answers ``get_model`` with a config until told etcd is gone."""

    def __init__(self) -> None:
        self.down = False
        self.reads = 0

    async def get_model(self, key: str, model: type[Any]) -> Any:
        self.reads += 1
        if self.down:
            raise MetaUnavailableError("etcd does not answer")
        return TopicConfig(partitions=2, created_ms=1)


async def test_a_stale_config_routes_produces_while_etcd_fails() -> None:
    store = FlakyStore()
    catalog = Catalog(store, cache_ttl_s=0.0)  # type: ignore[arg-type]  # every read misses
    assert (await catalog.cached_topic(TOPIC)) == TopicConfig(partitions=2, created_ms=1)
    store.down = True
    stale = await catalog.cached_topic(TOPIC)
    assert stale == TopicConfig(partitions=2, created_ms=1)
    assert store.reads == 2  # it did ask etcd first
    with pytest.raises(MetaUnavailableError):  # never seen: nothing to fall back on
        await catalog.cached_topic(TopicName("default", "other"))

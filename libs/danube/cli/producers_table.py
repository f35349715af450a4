"""How `danube admin topics producers` and `topics describe` show producer sessions."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import TYPE_CHECKING

from rich.table import Table

if TYPE_CHECKING:
    from danube.client.admin import ProducerInfo


def producers_table(producers: list[ProducerInfo]) -> Table:
    """One row per open producer session."""
    table = Table("producer id", "topic", "name", "access mode", "since")
    for producer in producers:
        since = datetime.fromtimestamp(producer.created_ms / 1000, UTC)
        table.add_row(
            producer.producer_id,
            producer.topic,
            producer.name,
            producer.access_mode,
            since.strftime("%Y-%m-%d %H:%M:%S UTC"),
        )
    return table

"""How `danube admin topics producers` and `topics describe` show producer sessions."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import TYPE_CHECKING

from rich.console import Console, RenderableType

from danube.cli.layout import rows_view

if TYPE_CHECKING:
    from danube.client.admin import ProducerInfo


def producers_table(console: Console, producers: list[ProducerInfo]) -> RenderableType:
    """One row per open producer session (blocks when the table is wider than ``console``)."""
    rows = []
    for producer in producers:
        since = datetime.fromtimestamp(producer.created_ms / 1000, UTC)
        rows.append(
            (
                producer.producer_id,
                producer.topic,
                producer.name,
                producer.access_mode,
                since.strftime("%Y-%m-%d %H:%M:%S UTC"),
            )
        )
    return rows_view(console, ("producer id", "topic", "name", "access mode", "since"), rows)

"""`danube admin topics describe` (and the producers and subscriptions tables) at 80 columns:
every value printed whole within the width (one block per row), and a table again when the
terminal is wide enough."""

from __future__ import annotations

import io

import pytest
from rich.console import Console
from rich.table import Table

from danube.cli.admin_topics import _describe_table, _subscriptions_table
from danube.cli.layout import rows_view
from danube.cli.producers_table import producers_table
from danube.client.admin import TopicDescription

pytestmark = pytest.mark.unit

TOPIC = "/default/orders-from-the-web-shop"


def _description() -> TopicDescription:
    partitions = [
        {
            "name": f"{TOPIC}-part-{index}",
            "owner": {"node_id": f"ingest-{index + 1}", "epoch": 12},
            "offsets": {
                "wal_start": 1_000_000,
                "next_offset": 123_456_789,
                "uploaded_through": 123_450_000,
                "replicas": ["ingest-1", "ingest-2", "ingest-3"],
                "isr": ["ingest-1", "ingest-2"],
                "followers": {"ingest-2": {"end": 123_456_780, "lag": 9}},
            },
        }
        for index in range(3)
    ]
    return TopicDescription.model_validate(
        {
            "name": TOPIC,
            "config": {
                "partitions": 3,
                "dispatch": "reliable",
                "durability": "fsync",
                "retention": {},
                "created_ms": 1_700_000_000_000,
            },
            "partitions": partitions,
            "subscriptions": [
                {
                    "name": "billing-and-invoicing",
                    "type": "key_shared",
                    "created_ms": 1_700_000_000_000,
                    "owner": {"node_id": "dispatcher-1", "epoch": 3},
                    "backlog": 42_000,
                    "consumers": [
                        {"consumer_id": "c1", "name": "billing-worker-1", "unacked": 17},
                        {"consumer_id": "c2", "name": "billing-worker-2", "unacked": 3},
                    ],
                }
            ],
            "producers": [
                {
                    "producer_id": "p-7f3c9a2e1b5d4c6f",
                    "topic": f"{TOPIC}-part-0",
                    "name": "web-shop-checkout",
                    "access_mode": "exclusive",
                    "created_ms": 1_700_000_000_000,
                }
            ],
        }
    )


def _render(width: int) -> str:
    console = Console(file=io.StringIO(), width=width, highlight=False, color_system=None)
    found = _description()
    console.print(_describe_table(console, found))
    console.print(_subscriptions_table(console, found.subscriptions))
    console.print(producers_table(console, found.producers))
    assert isinstance(console.file, io.StringIO)
    return console.file.getvalue()


def test_at_80_columns_every_value_is_printed_whole() -> None:
    text = _render(80)
    assert max(len(line) for line in text.splitlines()) <= 80
    assert "…" not in text
    for value in (
        f"{TOPIC}-part-2",
        "ingest-1, ingest-2, ingest-3",
        "123456789",
        "123450000",
        "ingest-2:9",
        "billing-and-invoicing",
        "billing-worker-1 (17), billing-worker-2 (3)",
        "p-7f3c9a2e1b5d4c6f",
        f"{TOPIC}-part-0",
        "web-shop-checkout",
        "2023-11-14 22:13:20 UTC",
    ):
        assert value in text, value
    # One block per partition, each value beside its column's name.
    assert f"partition {TOPIC}-part-1" in text
    assert "high watermark    123456789" in text


def test_a_wide_terminal_gets_the_tables() -> None:
    text = _render(250)
    header = next(line for line in text.splitlines() if "partition" in line)
    for column in ("leader", "epoch", "replicas", "in sync", "high watermark", "follower lag"):
        assert column in header


def test_rows_view_chooses_by_the_console_width() -> None:
    rows = [("a" * 30, "b" * 30, "c" * 30)]
    narrow = Console(file=io.StringIO(), width=80)
    wide = Console(file=io.StringIO(), width=120)
    assert isinstance(rows_view(wide, ("x", "y", "z"), rows), Table)
    assert not isinstance(rows_view(narrow, ("x", "y", "z"), rows), Table)

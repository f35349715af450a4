"""Rows that stay readable in any terminal: a table when it fits the console's width
unwrapped, else one block of ``column  value`` lines per row (the layout `kubectl describe`
uses), so no cell is cut down to an ellipsis or folded letter by letter at 80 columns."""

from __future__ import annotations

from collections.abc import Sequence

from rich.console import Console, Group, RenderableType
from rich.measure import Measurement
from rich.table import Table
from rich.text import Text

_UNLIMITED = 1_000_000


def rows_view(
    console: Console, headers: Sequence[str], rows: Sequence[Sequence[str]]
) -> RenderableType:
    """``rows`` under ``headers`` as a table if it fits ``console``'s width, else as blocks:
    the first column's value as the block's title, then one indented line per other
    column."""
    table = Table(*headers)
    for row in rows:
        table.add_row(*row)
    # Measured without the console's limit (it would clamp the answer to its width).
    natural = Measurement.get(console, console.options.update_width(_UNLIMITED), table)
    if natural.maximum <= console.width:
        return table
    blocks: list[RenderableType] = []
    for index, row in enumerate(rows):
        if index:
            blocks.append(Text(""))
        blocks.append(Text(f"{headers[0]} {row[0]}", style="bold"))
        fields = Table.grid(padding=(0, 2))
        fields.add_column(no_wrap=True)  # the names are short: never wrapped
        fields.add_column(overflow="fold")  # a long value wraps onto the next line, whole
        for header, value in zip(headers[1:], row[1:], strict=True):
            fields.add_row(f"  {header}", value)
        blocks.append(fields)
    return Group(*blocks)

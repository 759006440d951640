"""Tables that fit the terminal: leave out the least needed columns rather than squash every
cell of a table too wide for the console into ``1,2…``.

A ``FittedTable`` is built from column descriptions and rows; when rendered it measures the
full table against the console's width and, while it does not fit, drops the optional columns
(highest ``drop_order`` first), then says which it left out. ``--json`` and a wider terminal
show everything.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from rich.console import Console, ConsoleOptions, RenderableType, RenderResult
from rich.measure import Measurement
from rich.table import Table
from rich.text import Text

_UNBOUNDED = 100_000
"""A console width no table reaches, to measure the width a table would take unconstrained."""


@dataclass(frozen=True)
class Column:
    """One column of a ``FittedTable``."""

    header: str
    """Header text (``\\n`` for two lines)."""
    justify: Any = "left"
    """``left`` or ``right`` (numbers)."""
    style: str | None = None
    """Rich style of its cells."""
    no_wrap: bool = False
    """Keep each cell on one line."""
    drop_order: int = 0
    """0: always shown; otherwise left out on a narrow console, the highest first."""


class FittedTable:
    """A table that leaves out optional columns when the console is too narrow for all."""

    def __init__(
        self,
        columns: Sequence[Column],
        rows: Sequence[Sequence[RenderableType]],
        *,
        title: str | None = None,
        caption: str | None = None,
    ) -> None:
        self.columns = tuple(columns)
        self.rows = [tuple(row) for row in rows]
        self.title = title
        self.caption = caption

    def table(self, left_out: frozenset[int] = frozenset()) -> Table:
        """The table without the columns at the indices ``left_out``."""
        table = Table(
            title=self.title, title_justify="left", header_style="bold", caption=self.caption
        )
        kept = [i for i in range(len(self.columns)) if i not in left_out]
        for i in kept:
            c = self.columns[i]
            table.add_column(c.header, justify=c.justify, style=c.style, no_wrap=c.no_wrap)
        for row in self.rows:
            table.add_row(*(row[i] for i in kept))
        return table

    def _fitting(self, console: Console, options: ConsoleOptions) -> tuple[Table, list[int]]:
        left_out: set[int] = set()
        table = self.table()
        orders = sorted({c.drop_order for c in self.columns if c.drop_order}, reverse=True)
        unbounded = options.update_width(_UNBOUNDED)  # a measure at the width it asks for
        for order in orders:
            if Measurement.get(console, unbounded, table).maximum <= options.max_width:
                break
            left_out |= {i for i, c in enumerate(self.columns) if c.drop_order == order}
            table = self.table(frozenset(left_out))
        return table, sorted(left_out)

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        table, left_out = self._fitting(console, options)
        yield table
        if left_out:
            names = ", ".join(self.columns[i].header.replace("\n", " ") for i in left_out)
            yield Text(
                f"Left out to fit {options.max_width} columns: {names} (a wider terminal or "
                "--json shows them).",
                style="dim",
            )

"""Tables on a narrow terminal leave out whole columns, and say so, rather than cut numbers."""

from __future__ import annotations

import io
import re

from rich.console import Console

from whichgpu.catalog import load_catalog
from whichgpu.report.layout import Column, FittedTable
from whichgpu.report.terminal import gpu_table


def _render(renderable: object, width: int) -> str:
    out = io.StringIO()
    Console(width=width, file=out).print(renderable)
    return out.getvalue()


def test_a_narrow_console_drops_optional_columns_in_order_and_says_which() -> None:
    table = FittedTable(
        [
            Column("name"),
            Column("kept number", "right", no_wrap=True),
            Column("first to go " * 3, drop_order=2),
            Column("second to go " * 3, drop_order=1),
        ],
        [("a", "1,234,567", "x", "y")],
    )
    wide = _render(table, 200)
    assert "first to go" in wide and "second to go" in wide and "Left out" not in wide
    narrow = _render(table, 60)
    assert "first to go" not in narrow.split("Left out")[0] and "second to go" in narrow
    assert "1,234,567" in narrow and "Left out to fit 60 columns: first to go" in narrow
    tiny = _render(table, 30)
    assert "1,234,567" in tiny and "second to go" in tiny.split("Left out")[1]


def test_gpu_table_on_80_columns_keeps_every_number_whole() -> None:
    catalog = load_catalog()
    specs = [catalog.get(i) for i in ("rtx-4090", "b300", "rtx-pro-6000-blackwell-server")]
    text = _render(gpu_table(specs, "GPUs"), 80)
    assert "…" not in text.split("Left out")[0]
    for figure in ("7,700", "2,250", "1,008", "165"):
        assert re.search(rf"\b{figure}\b", text)
    assert "rtx-pro-6000-blackwell-server" in text and "Left out to fit 80 columns: name" in text


def test_numbers_keep_three_figures_and_never_go_scientific() -> None:
    from whichgpu.numbers import significant

    assert significant(2628.4) == "2,628" and significant(12_345_678) == "12,345,678"
    assert significant(47.38) == "47.4" and significant(0.17731) == "0.177"
    assert significant(7.3, 4) == "7.300" and significant(7.3, 4, trim=True) == "7.3"
    assert significant(None) == "-" and significant(0) == "0" and significant(-0.5) == "-0.500"

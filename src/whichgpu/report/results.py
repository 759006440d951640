"""Renderings of measured results: terminal tables and detail views, documents for ``--json``.

Used by ``whichgpu results`` and ``whichgpu bench``. Nothing is computed here: the Lambda-style
arrangement comes ready from ``whichgpu.store.pivot_results``, and these functions only choose
what to show and how.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

from rich.console import Group, RenderableType
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from whichgpu.numbers import count_si, significant
from whichgpu.report.layout import Column, FittedTable
from whichgpu.report.terminal import fmt
from whichgpu.schema import SCHEMA_VERSION, BenchEnvironment, BenchResult
from whichgpu.store import (
    ExportSummary,
    ImportSummary,
    PivotCell,
    PivotRow,
    ResultPivot,
    device_label,
)
from whichgpu.units import bytes_to_gib

ID_CHARS = 8
"""Characters of a result id shown in tables (any unique prefix is accepted as an id)."""

_SHOWN_APART = ("run", "per_rank", "notes", "environment")
"""``BenchResult`` fields ``result_detail`` shows in their own sections."""


# --- JSON ---------------------------------------------------------------------------------------


def result_doc(result: BenchResult) -> dict[str, Any]:
    """``results show --json``: every field of the result, and ``schema_version``.

    Byte counts are in bytes, times in seconds, power in W, ``created_at`` in ISO 8601 (UTC).
    ``whichgpu results import`` reads the document back.
    """
    doc: dict[str, Any] = result.model_dump(mode="json")
    doc["schema_version"] = SCHEMA_VERSION
    return doc


def results_doc(results: Iterable[BenchResult]) -> list[dict[str, Any]]:
    """``results list --json``: one ``result_doc`` per result, in the order given."""
    return [result_doc(r) for r in results]


def pivot_doc(pivot: ResultPivot) -> dict[str, Any]:
    """``results table --json``: devices, rows with a cell per device, reference and notes."""
    doc: dict[str, Any] = pivot.model_dump(mode="json")
    doc["schema_version"] = SCHEMA_VERSION
    return doc


def export_doc(summary: ExportSummary) -> dict[str, Any]:
    """``results export --json``: the file written, its format and how many results."""
    doc: dict[str, Any] = summary.model_dump(mode="json")
    doc["schema_version"] = SCHEMA_VERSION
    return doc


def import_doc(summary: ImportSummary) -> dict[str, Any]:
    """``results import --json``: the file read, records in it, added and already present."""
    doc: dict[str, Any] = summary.model_dump(mode="json")
    doc["schema_version"] = SCHEMA_VERSION
    return doc


# --- Cells ----------------------------------------------------------------------------------------


def _gib(n_bytes: int | None) -> str:
    return "—" if n_bytes is None else f"{bytes_to_gib(n_bytes):.2f}"


def _ms(seconds: float | None) -> str:
    return "—" if seconds is None else f"{seconds * 1000:,.1f}"


def _step(result: BenchResult) -> str:
    """Median step time ± interquartile range, in ms."""
    if result.step_time_s is None:
        return "—"
    if result.step_time_iqr_s is None:
        return _ms(result.step_time_s)
    return f"{_ms(result.step_time_s)} ± {_ms(result.step_time_iqr_s)}"


def _throughput(value: float | None, unit: str = "") -> Text:
    if value is None:
        return Text("did not fit", style="red")
    text = significant(value)
    return Text(f"{text} {unit}".rstrip())


def _percent(value: float | None) -> str:
    return "—" if value is None else f"{value:.0%}"


def _when(result: BenchResult) -> str:
    return result.created_at.strftime("%Y-%m-%d %H:%M")


def _device(result: BenchResult) -> str:
    """The device as tables name it, with the reported name when the label is a catalog id."""
    label = device_label(result)
    return label if result.gpu is None else f"{label} ({result.device_name})"


# --- Tables ---------------------------------------------------------------------------------------


def results_table(results: Sequence[BenchResult], title: str | None = None) -> FittedTable:
    """One row per result, in the order given: what ran where, how fast, with how much memory;
    on a narrow terminal the columns a scan needs least are left out before any is cut."""
    columns = [
        Column("id", style="cyan", no_wrap=True),
        Column("measured (UTC)", no_wrap=True, drop_order=6),
        Column("workload"),
        Column("device"),
        Column("precision", drop_order=3),
        Column("batch", "right", no_wrap=True),
        Column("max\nbatch", "right", no_wrap=True, drop_order=1),
        Column("throughput", "right", no_wrap=True),
        Column("step ms\n± IQR", "right", no_wrap=True, drop_order=4),
        Column("peak memory\nGiB", "right", no_wrap=True, drop_order=2),
        Column("MFU", "right", no_wrap=True, drop_order=5),
        Column("power\nW", "right", no_wrap=True, drop_order=5),
    ]
    rows = [
        (
            r.id[:ID_CHARS],
            _when(r),
            escape(r.workload),
            escape(device_label(r)),
            escape(r.precision),
            f"{r.batch_size}" + (f" x {r.seq_len}" if r.seq_len else ""),
            fmt(r.max_batch_size),
            _throughput(r.throughput, r.throughput_unit),
            _step(r),
            _peak_memory(r),
            _percent(r.mfu),
            fmt(r.power_w),
        )
        for r in results
    ]
    caption = None
    if any(r.peak_reserved_bytes is None and r.peak_allocated_bytes for r in results):
        caption = "t: peak of live tensor bytes (the device has no caching allocator)"
    return FittedTable(columns, rows, title=title, caption=caption)


def _peak_memory(r: BenchResult) -> str:
    """Peak reserved bytes (what a GPU must hold); where the device has no allocator to
    reserve (CPU, MPS), the peak of live tensor bytes, marked ``t``."""
    if r.peak_reserved_bytes is not None:
        return _gib(r.peak_reserved_bytes)
    if r.peak_allocated_bytes is not None:
        return _gib(r.peak_allocated_bytes) + " t"
    return _gib(None)


def _value(name: str, value: Any, result: BenchResult) -> str | Text:
    """A measurement field with its unit, for the detail view."""
    if value is None:
        return "—"
    if name.endswith("_bytes"):
        return f"{bytes_to_gib(value):.2f} GiB ({value:,} B)"
    if name.endswith("_s") and isinstance(value, float):
        return f"{value * 1000:,.2f} ms" if value < 1 else f"{value:,.2f} s"
    if name == "throughput":
        return _throughput(value, result.throughput_unit)
    if name in ("mfu", "utilization", "scaling_efficiency"):
        return f"{value:.1%}"
    if name == "flops_per_step":
        return f"{count_si(value)}FLOP"  # whole steps: always past 1,000 (a prefix)
    units = {"_w": "W", "_mhz": "MHz", "_c": "°C", "_j_per_sample": "J"}
    for suffix, unit in units.items():
        if name.endswith(suffix):
            return f"{fmt(value)} {unit}"
    if name == "created_at":
        return str(value.isoformat())
    return fmt(value)


def _facts(title: str, pairs: Iterable[tuple[str, str | Text]]) -> Table:
    """A two-column table of names and values (values are shown as they are, never as markup)."""
    table = Table(title=title, title_justify="left", show_header=False, box=None)
    table.add_column(style="bold", no_wrap=True)
    table.add_column()
    for key, value in pairs:
        table.add_row(key, Text(value) if isinstance(value, str) else value)
    return table


def _environment(env: BenchEnvironment) -> Table:
    pairs: list[tuple[str, str | Text]] = []
    for name in BenchEnvironment.model_fields:
        value = getattr(env, name)
        if name == "libraries":
            text = ", ".join(f"{k} {v}" for k, v in sorted(value.items())) or "—"
        elif name.endswith("_bytes") and value is not None:
            text = f"{bytes_to_gib(value):.2f} GiB ({value:,} B)"
        elif name.endswith("_w") and value is not None:
            text = f"{fmt(value)} W"
        else:
            text = fmt(value)
        pairs.append((name, text))
    return _facts("Environment", pairs)


def result_detail(result: BenchResult) -> RenderableType:
    """``results show``: every field of one result, the run, per-rank figures, the environment."""
    head = Text.assemble(
        (result.id, "bold cyan"),
        f"  {result.workload} on {_device(result)}, measured {_when(result)} UTC",
    )
    measured = _facts(
        "Measurement",
        (
            (name, _value(name, getattr(result, name), result))
            for name in BenchResult.model_fields
            if name not in _SHOWN_APART and name != "id"
        ),
    )
    run = _facts(
        "Run", ((name, fmt(getattr(result.run, name))) for name in result.run.model_fields)
    )
    parts: list[RenderableType] = [head, measured, run]
    if result.per_rank:
        ranks = Table(title="Per rank", title_justify="left", header_style="bold")
        keys = sorted({key for rank in result.per_rank for key in rank})
        ranks.add_column("rank", justify="right")
        for key in keys:
            ranks.add_column(key, justify="right")
        for i, rank in enumerate(result.per_rank):
            ranks.add_row(str(i), *(fmt(rank.get(key)) for key in keys))
        parts.append(ranks)
    parts.append(_environment(result.environment))
    if result.notes:
        parts.append(Text("Notes: " + "; ".join(result.notes) + ".", style="dim"))
    return Group(*parts)


_Cell = Callable[[PivotRow, PivotCell], str | Text]


def _pivot_table(pivot: ResultPivot, title: str, cell: _Cell) -> RenderableType:
    """A heading (free to be wider than the table) and one row per workload setting."""
    table = Table(header_style="bold")
    table.add_column("workload")
    for device in pivot.devices:
        table.add_column(escape(device), justify="right")
    for row in pivot.rows:
        table.add_row(
            escape(row.label),
            *(cell(row, row.cells[d]) if d in row.cells else "" for d in pivot.devices),
        )
    return Group(Text(title, style="bold"), table)


def lambda_tables(pivot: ResultPivot) -> RenderableType:
    """``results table``: Lambda-style tables — largest batch, throughput, relative throughput.

    Rows are workload settings, columns devices; the relative table divides each row by the
    reference device's throughput.
    """
    if not pivot.rows:
        return Text("No results to tabulate.")
    max_batch = _pivot_table(
        pivot,
        "Largest batch that ran, per device (—: the batch was given, not searched; 0: not "
        "even batch 1 fits)",
        lambda row, c: fmt(c.max_batch_size),
    )
    speed = _pivot_table(
        pivot,
        "Throughput over all devices of a run (at the batch in brackets)",
        lambda row, c: _throughput(c.throughput, row.throughput_unit) + f" ({c.batch_size})",
    )
    parts: list[RenderableType] = [max_batch, speed]
    if pivot.reference is not None:
        how = "" if pivot.reference_chosen else " (the device measured most; see --reference)"
        parts.append(
            _pivot_table(
                pivot,
                f"Throughput relative to {pivot.reference}{how}",
                lambda row, c: (
                    "—" if c.relative_throughput is None else f"{c.relative_throughput:.2f}"
                ),
            )
        )
    if pivot.notes:
        parts.append(Text("Notes: " + "; ".join(pivot.notes) + ".", style="dim"))
    return Group(*parts)

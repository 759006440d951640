"""Renderings of the cost results: terminal views (rich) and JSON documents.

``whichgpu cost breakeven | value | build | energy`` print these. JSON documents are the
results' fields (units in every key) plus ``schema_version``; nothing is computed here.
"""

from __future__ import annotations

from typing import Any

from rich.console import Group, RenderableType
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from whichgpu.numbers import significant
from whichgpu.schema import (
    SCHEMA_VERSION,
    Breakeven,
    BuildReport,
    CheckStatus,
    JobEnergy,
    ValueTable,
)

_STATUS_STYLE: dict[CheckStatus, str] = {"ok": "green", "warn": "yellow", "fail": "bold red"}
BAR_WIDTH = 10
"""Characters of the longest bar in the value table."""


def _doc(result: Breakeven | BuildReport | JobEnergy | ValueTable) -> dict[str, Any]:
    doc: dict[str, Any] = result.model_dump(mode="json")
    doc["schema_version"] = SCHEMA_VERSION
    return doc


def breakeven_doc(result: Breakeven) -> dict[str, Any]:
    """``cost breakeven --json``: inputs, yearly figures, break-even, totals, curve."""
    return _doc(result)


def build_doc(report: BuildReport) -> dict[str, Any]:
    """``cost build --json``: the power budget, the fit and every check."""
    return _doc(report)


def value_doc(table: ValueTable) -> dict[str, Any]:
    """``cost value --json``: rows best first, each with ``relative`` to the reference."""
    return _doc(table)


def energy_doc(job: JobEnergy) -> dict[str, Any]:
    """``cost energy --json``."""
    return _doc(job)


def _usd(value: float | None) -> str:
    return "—" if value is None else f"${value:,.2f}" if abs(value) < 100 else f"${value:,.0f}"


def _years(years: float) -> str:
    return "1 year" if years == 1 else f"{years:g} years"


def _notes(title: str, lines: tuple[str, ...]) -> Text:
    text = Text(title + ":\n", style="bold")
    for line in lines:
        text.append(f"- {line}\n", style="")
    return text


def breakeven_view(result: Breakeven) -> RenderableType:
    """``whichgpu cost breakeven``: inputs with where they came from, then the answers."""
    inputs = Table(title="Inputs", title_justify="left", header_style="bold")
    inputs.add_column("")
    inputs.add_column("value", justify="right")
    inputs.add_column("from")
    rows = (
        ("system cost", _usd(result.system_cost_usd), "system_cost_usd"),
        ("GPU power", f"{result.gpu_w:,.0f} W", "gpu_w"),
        ("CPU and rest", f"{result.cpu_w:,.0f} W", "cpu_w"),
        ("utilisation", f"{result.utilization:.0%}", "utilization"),
        ("electricity", f"${result.electricity_usd_per_kwh:.3f}/kWh", "electricity_usd_per_kwh"),
        ("cloud rate", f"${result.cloud_usd_per_hour:.2f}/h", "cloud_usd_per_hour"),
        ("years", f"{result.years:g}", "years"),
        ("resale after them", _usd(result.resale_usd), "resale_usd"),
    )
    for label, value, key in rows:
        inputs.add_row(label, value, escape(result.inputs.get(key, "")))
    answers = Table(title="Cloud vs own", title_justify="left", header_style="bold")
    answers.add_column("")
    answers.add_column("value", justify="right")
    answers.add_row("energy per year", f"{result.energy_kwh_per_year:,.1f} kWh")
    answers.add_row("electricity per year", _usd(result.electricity_usd_per_year))
    answers.add_row("cloud rent per year", _usd(result.cloud_usd_per_year))
    answers.add_row(f"owning per year (over {result.years:g} years)", _usd(result.own_usd_per_year))
    if result.breakeven_days is None:
        answers.add_row("break-even", "never: renting costs less per day than the electricity")
    else:
        answers.add_row(
            "break-even",
            f"after {result.breakeven_days:,.0f} days "
            f"({result.breakeven_use_hours or 0:,.0f} hours of use)",
        )
    answers.add_row(f"own, {_years(result.years)} (after resale)", _usd(result.own_tco_usd))
    answers.add_row(f"cloud, {_years(result.years)}", _usd(result.cloud_tco_usd))
    cheaper = "owning" if result.own_tco_usd < result.cloud_tco_usd else "renting"
    answers.add_row(
        "cheaper over the period",
        f"{cheaper}, by {_usd(abs(result.cloud_tco_usd - result.own_tco_usd))}",
    )
    if result.co2_kg_per_year is not None:
        answers.add_row(
            "CO2 of the electricity per year",
            f"{result.co2_kg_per_year:,.0f} kg (at {result.grid_gco2_per_kwh:g} g/kWh)",
        )
    return Group(inputs, answers, _notes("Assumptions", result.assumptions))


def build_view(report: BuildReport) -> RenderableType:
    """``whichgpu cost build``: one line per check with its verdict and reason."""
    head = Text.assemble(
        (f"{report.count} x {report.gpu_name}", "bold"),
        f" in a {report.build_label}",
    )
    table = Table(header_style="bold", show_lines=True)
    table.add_column("check")
    table.add_column("status")
    table.add_column("why")
    for check in report.checks:
        style = _STATUS_STYLE[check.status]
        table.add_row(check.name, f"[{style}]{check.status}[/{style}]", escape(check.reason))
    style = _STATUS_STYLE[report.status]
    verdict = Text.assemble("Overall: ", (report.status, style))
    return Group(head, table, verdict, _notes("Assumptions", report.assumptions))


def value_view(table: ValueTable, limit: int | None = None) -> RenderableType:
    """``whichgpu cost value``: best value first, with a bar of the value relative to the
    reference."""
    cloud = table.price_kind in ("cloud", "cloud-spot")
    what = f"{table.count} x GPU machines" if table.count else "the GPU alone"
    if cloud:
        what = f"{table.count or 1} rented GPU(s)"
    title = (
        f"Performance per dollar of {what}, {table.price_kind} prices, "
        f"relative to {table.reference}"
    )
    out = Table(title=title, title_justify="left", header_style="bold")
    out.add_column("gpu", style="cyan", no_wrap=True)
    out.add_column("price used", min_width=18)
    if cloud:
        out.add_column("USD/h", justify="right")
    else:
        out.add_column("total USD", justify="right")
    unit = table.rows[0].throughput_unit if table.rows else ""
    out.add_column(f"throughput\n{unit}", justify="right")
    out.add_column(f"USD per M\n{unit.split('/')[0]}" if cloud else "per $1,000", justify="right")
    out.add_column("relative", justify="right")
    out.add_column("", no_wrap=True, min_width=BAR_WIDTH)
    rows = table.rows[:limit] if limit else table.rows
    top = max((r.relative for r in rows), default=1.0)
    for row in rows:
        price = _usd(row.usd_per_hour) if cloud else _usd(row.total_usd)
        figure = (
            significant(row.usd_per_million_units)
            if row.usd_per_million_units is not None
            else significant(row.throughput_per_kusd)
        )
        bar = "█" * max(1, round(BAR_WIDTH * row.relative / top))
        style = "bold" if row.gpu == table.reference else ""
        out.add_row(
            row.gpu,
            escape(row.price_note.split(" (")[0]),
            price,
            significant(row.throughput, 4),
            figure,
            f"[{style}]{row.relative:.2f}[/{style}]" if style else f"{row.relative:.2f}",
            bar,
        )
    parts: list[RenderableType] = [out]
    if limit and len(table.rows) > limit:
        parts.append(Text(f"({len(table.rows) - limit} more rows: --limit 0 or --json for all)"))
    if table.skipped:
        parts.append(Text(f"Left out ({len(table.skipped)}): " + "; ".join(table.skipped[:8])))
    parts.append(_notes("Assumptions", table.assumptions))
    return Group(*parts)


def energy_view(job: JobEnergy) -> RenderableType:
    """``whichgpu cost energy``."""
    table = Table(title="Energy of the job", title_justify="left", header_style="bold")
    table.add_column("")
    table.add_column("value", justify="right")
    table.add_row("power", f"{job.power_w:,.0f} W")
    table.add_row("run time", f"{significant(job.hours, 4)} h")
    table.add_row("energy", f"{significant(job.energy_kwh, 4)} kWh")
    if job.electricity_usd is not None:
        table.add_row(
            "electricity", f"{_usd(job.electricity_usd)} (at ${job.electricity_usd_per_kwh:g}/kWh)"
        )
    else:
        table.add_row("electricity", "[yellow]unknown (--electricity)[/yellow]")
    if job.co2_kg is not None:
        co2 = significant(job.co2_kg, 4, trim=True)
        table.add_row("CO2", f"{co2} kg (at {job.grid_gco2_per_kwh:g} g/kWh)")
    else:
        table.add_row("CO2", "[yellow]unknown (--grid-gco2)[/yellow]")
    if job.region:
        table.add_row("region", job.region)
    return Group(table, _notes("Assumptions", job.assumptions))

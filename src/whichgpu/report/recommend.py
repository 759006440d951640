"""Renderings of ``whichgpu recommend``: the answer, the ranking with reasons, the exclusions.

The JSON document is the ``Ranking``'s fields (``ranking``, ``excluded`` …) plus
``schema_version``; nothing is computed here.
"""

from __future__ import annotations

from typing import Any

from rich.console import Group, RenderableType
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from whichgpu.numbers import significant
from whichgpu.schema import EXCLUSION_LABELS, SCHEMA_VERSION, Ranking, Vendor

NAMES_SHOWN = 4
"""Exclusions listed per kind in the terminal (the JSON has all)."""


def recommend_doc(ranking: Ranking) -> dict[str, Any]:
    """``recommend --json``: the answer, ranked candidates with reasons, exclusions."""
    doc: dict[str, Any] = ranking.model_dump(mode="json")
    doc["schema_version"] = SCHEMA_VERSION
    return doc


def _money(usd: float | None) -> str:
    return "-" if usd is None else f"${usd:,.0f}" if usd >= 100 else f"${usd:,.2f}"


def recommend_view(ranking: Ranking) -> RenderableType:
    """The answer first, then one row per candidate and its reasons, then what was left out."""
    run = ranking.run
    what = f"{ranking.workload}: {run.describe()}"
    question = f"{ranking.mode}"
    if ranking.budget_usd is not None:
        question += f", budget ${ranking.budget_usd:,.0f}"
    if ranking.job is not None:
        question += f", job: {ranking.job.describe()}"
    if ranking.within_hours is not None:
        question += f" within {ranking.within_hours:,.0f} h"
    if ranking.preset:
        question += f", preset {ranking.preset}"
    if ranking.vendor:
        question += f", {Vendor(ranking.vendor).label} only"
    parts: list[RenderableType] = [
        Text.assemble((escape(what), "bold"), f"  ({question}; ranked by {ranking.metric})"),
        Text(ranking.answer, style="bold green" if ranking.ranking else "bold red"),
    ]
    if ranking.ranking:
        table = Table(header_style="bold")
        unit = ranking.ranking[0].throughput_unit
        if run.mode == "inference" and unit == "tokens/s":  # see GENERATED_RATE_NOTE
            unit = "generated tokens/s"
        columns = ["#", "GPU", "batch", unit, "source"]
        columns += ["time h"] if ranking.job is not None and ranking.job.hours is None else []
        # renting with no job: the cost is the machine's hourly rate
        hourly = ranking.mode == "rent" and ranking.job is None
        columns += ["cost $/h" if hourly else "cost", ranking.ranking[0].perf_per_dollar_unit]
        for column in columns:
            table.add_column(column, justify="left" if column in ("GPU", "source") else "right")
        for c in ranking.ranking:
            name = c.label()
            cells = [
                str(c.rank),
                escape(name),
                str(c.batch_size),
                significant(c.throughput, 4),
                c.throughput_source,
            ]
            if ranking.job is not None and ranking.job.hours is None:
                cells.append(f"{(c.time_s or 0) / 3600:,.1f}")
            # a price past its staleness threshold is marked where it is used
            cost = _money(c.cost_usd) + (" stale" if c.price_stale else "")
            cells += [cost, significant(c.perf_per_dollar)]
            table.add_row(*cells)
        parts.append(table)
        for c in ranking.ranking[:3]:
            name = c.label()
            parts.append(Text(f"#{c.rank} {name}", style="bold"))
            parts.extend(Text(f"  - {escape(r)}") for r in c.reasons)
    if ranking.closeness:
        parts.append(
            Text(
                ranking.closeness_text
                + " Measure one (whichgpu bench) or decide on other grounds.",
                style="yellow",
            )
        )
    if ranking.excluded:
        parts.append(Text(f"Left out ({len(ranking.excluded)}):", style="bold"))
        for kind, title in EXCLUSION_LABELS.items():
            some = [e for e in ranking.excluded if e.kind == kind]
            if not some:
                continue
            parts.append(Text(f"  {title} ({len(some)}):", style="dim"))
            for e in some[:NAMES_SHOWN]:
                name = f"{e.count} x {e.gpu_name}" if e.count > 1 else e.gpu_name
                parts.append(Text(f"    - {escape(name)}: {escape(e.reason)}", style="dim"))
            if len(some) > NAMES_SHOWN:
                parts.append(
                    Text(
                        f"    … and {len(some) - NAMES_SHOWN} more (--json lists all)", style="dim"
                    )
                )
    parts.append(Text("Assumptions: " + "; ".join(ranking.assumptions) + ".", style="dim"))
    return Group(*parts)

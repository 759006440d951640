"""``whichgpu report``: one self-contained HTML page (``render_html``) and its JSON
(``report_doc``).

Over 600 lines because the page's sections are laid out in order, each with its tables; the
charts are apart (``report.charts``, ``report.serving_charts``).

Everything shown was computed by ``whichgpu.api.report`` (a ``ReportData``); this module only
lays it out. The page needs nothing from the network: the style sheet and the one small script
(table sorting) are inline, the charts are inline SVG (``report.charts``), and the fonts are
the reader's own. Every string that comes from the user or the data is escaped.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from whichgpu.numbers import significant as num
from whichgpu.report.charts import (
    batch_chart,
    breakeven_chart,
    duration,
    esc,
    gib,
    lead_label,
    memory_chart,
    results_chart,
    speed_chart,
    usd,
    value_chart,
)
from whichgpu.report.serving import NO_TPOT
from whichgpu.report.serving_charts import (
    LATENCY_GPUS,
    NO_PRICE,
    cost_chart,
    has_price,
    latency_chart,
    served,
)
from whichgpu.report_data import ReportData
from whichgpu.schema import SCHEMA_VERSION, ServingSpeed, ThroughputEstimate


def report_doc(data: ReportData) -> dict[str, Any]:
    """``report --json``: the ``ReportData`` fields plus ``schema_version``."""
    doc: dict[str, Any] = data.model_dump(mode="json")
    doc["schema_version"] = SCHEMA_VERSION
    return doc


# --- tables ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Cell:
    """One table cell: the text shown and the value it sorts by (None: sort by the text)."""

    text: str
    sort: float | None = None
    raw_html: bool = False
    """Whether ``text`` is already markup made here (never user text)."""


@dataclass(frozen=True)
class Column:
    """A table column: its heading and whether it holds numbers (right-aligned, numeric sort)."""

    heading: str
    numeric: bool = False
    label: bool = False
    """Whether it names the row (a GPU, a workload): kept wide enough that a name wraps onto
    two lines at most (class ``label``)."""

    @property
    def css(self) -> str:
        return ("num" if self.numeric else "txt") + (" label" if self.label else "")


def html_table(
    columns: Sequence[Column], rows: Sequence[Sequence[Cell]], caption: str, table_id: str
) -> str:
    """A sortable table (click a heading; without JavaScript it stays in the given order),
    in a box that scrolls sideways on its own where the page is narrower than the table."""
    head = "".join(
        f'<th scope="col" class="{c.css}"'
        f' data-type="{"num" if c.numeric else "txt"}">{esc(c.heading)}</th>'
        for c in columns
    )
    body = []
    for row in rows:
        cells = []
        for column, cell in zip(columns, row, strict=True):
            shown = cell.text if cell.raw_html else esc(cell.text)
            key = f' data-v="{cell.sort!r}"' if cell.sort is not None else ""
            cells.append(f'<td class="{column.css}"{key}>{shown}</td>')
        body.append("<tr>" + "".join(cells) + "</tr>")
    return (
        f'<div class="table-wrap"><table class="sortable" id="{esc(table_id)}">'
        f"<caption>{esc(caption)}</caption><thead><tr>{head}</tr></thead><tbody>\n"
        + "\n".join(body)
        + "\n</tbody></table></div>"
    )


# --- the page ----------------------------------------------------------------------------------


def _answer(data: ReportData) -> str:
    r = data.ranking
    units = {c.perf_per_dollar_unit for c in r.ranking}
    shared_unit = units.pop() if len(units) == 1 else None  # said once, in the heading
    run = data.run
    # samples per optimizer step (micro-batch x accumulation x GPUs), where not the batch
    accumulating = run.mode == "train" and (
        run.grad_accum > 1 or any(c.count > 1 for c in r.ranking)
    )
    columns = [
        Column("#", True),
        Column("GPU", label=True),
        Column("GPUs", True),
        Column(f"throughput ({r.ranking[0].throughput_unit if r.ranking else ''})", True),
        Column("band", True),
        Column("source"),
        Column("time", True),
        Column("cost", True),
        Column(f"per dollar ({shared_unit})" if shared_unit else "per dollar", True),
        Column("batch", True),
        *([Column("global batch", True)] if accumulating else []),
        Column("largest batch", True),
    ]
    rows = [
        [
            Cell(str(c.rank), c.rank),
            Cell(c.gpu_name),
            Cell(str(c.count), c.count),
            Cell(num(c.throughput), c.throughput),
            Cell(f"{num(c.throughput_low)}-{num(c.throughput_high)}", c.throughput_low),
            Cell(c.throughput_source),
            Cell(duration(c.time_s), c.time_s),
            Cell(usd(c.cost_usd), c.cost_usd),
            Cell(
                num(c.perf_per_dollar)
                if shared_unit
                else f"{num(c.perf_per_dollar)} {c.perf_per_dollar_unit}",
                c.perf_per_dollar,
            ),
            Cell(str(c.batch_size), c.batch_size),
            *([_global_batch(data, c.batch_size, c.count)] if accumulating else []),
            Cell(str(c.max_batch_size), c.max_batch_size),
        ]
        for c in r.ranking
    ]
    parts = [f'<p class="answer">{esc(r.answer)}</p>']
    for c in r.ranking[:3]:
        reasons = "".join(f"<li>{esc(x)}</li>" for x in c.reasons)
        parts.append(
            f'<div class="reasons"><h3>{c.rank}. {esc(c.gpu_name)}'
            f"{' x ' + str(c.count) if c.count > 1 else ''}</h3><ul>{reasons}</ul></div>"
        )
    if r.closeness:
        parts.append("<p><strong>Too close to call.</strong> " + esc(r.closeness_text) + "</p>")
    if r.ranking:
        parts.append(html_table(columns, rows, "Candidates, best first", "ranking"))
    if r.excluded:
        by_reason: dict[str, list[str]] = {}
        for e in r.excluded:
            name = f"{e.gpu_name}{' x ' + str(e.count) if e.count > 1 else ''}"
            by_reason.setdefault(e.reason, []).append(name)
        items = "".join(
            f"<li><strong>{esc(reason)}</strong>: {esc(', '.join(names))}</li>"
            for reason, names in by_reason.items()
        )
        parts.append(f'<h3>Left out ({len(r.excluded)})</h3><ul class="left-out">{items}</ul>')
    return _section("answer", "The answer", "".join(parts))


def _global_batch(data: ReportData, batch_size: int, count: int) -> Cell:
    """A candidate's global batch (``RunConfig.global_batch_size`` at its batch and count)."""
    size = data.run.model_copy(update={"gpus": count}).global_batch_size(batch_size)
    return Cell("-" if size is None else str(size), size)


def _speed(data: ReportData) -> str:
    band = data.provenance.throughput_error_band
    run = data.run
    who = "one GPU "
    if run.model_parallel() > 1:  # no GPU runs the model alone
        who = f"the {run.gpus} GPUs together ({run.model_parallel_words()}) "
    intro = (
        f"<p>Throughput of {esc(who)}"
        + (
            f"at batch {data.run.batch_size}"
            if data.run.batch_size is not None
            else "at its largest batch"
        )
        + f", divided by {esc(data.reference_name)}'s. "
        f"Blue bars are predictions; their whiskers are the model's band (±{band:.0%}, the "
        "80th percentile of its out-of-sample error for this kind of workload: on a new GPU "
        "for a workload it was fitted on, on a new workload for any other). Red bars marked "
        "<em>measured</em> come from your own stored benchmark of the same run.</p>"
    )
    columns = [
        Column("GPU", label=True),
        Column(f"throughput ({data.speeds[0].throughput_unit})", True),
        Column("low", True),
        Column("high", True),
        Column(f"x {data.reference_name}", True),
        Column("batch", True),
        Column("source"),
    ]
    rows = [
        [
            Cell(p.gpu_name),
            Cell(num(p.throughput), p.throughput),
            Cell(num(p.low), p.low),
            Cell(num(p.high), p.high),
            Cell(num(p.relative), p.relative),
            Cell(str(p.batch_size), p.batch_size),
            Cell(p.source),
        ]
        for p in data.speeds
    ]
    return _section(
        "speed",
        "Speed per GPU",
        intro
        + _figure(speed_chart(data))
        + html_table(columns, rows, "Throughput per GPU", "speeds")
        + _assumptions(
            ThroughputEstimate.merged_assumptions(data.throughput), "What the predictions assume"
        )
        + _serving(data),
    )


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else num(seconds * 1000)


def _serving(data: ReportData) -> str:
    """With a serving engine (``--serving``): its figures per GPU, TPOT (TTFT of prefill-only
    requests) against the concurrency, and its dollars per million tokens; else nothing."""
    pairs = served(data)
    if not pairs:
        return ""
    first = pairs[0][1]
    prefill = first.new_tokens == 0
    targets = first.max_concurrency_within_targets is not None
    tokens = "prompt" if prefill else "output"
    columns = [
        Column("GPU", label=True),
        Column("GPUs", True),
        Column("concurrency", True),
        Column("TTFT ms (latency)" if prefill else "TTFT ms", True),
        Column("TPOT ms", True),
        *(
            [Column("requests/s", True), Column("prompt tokens/s", True)]
            if prefill
            else [Column("output tokens/s", True)]
        ),
        Column("step bound" if prefill else "decode bound"),
        Column("max concurrency", True),
        *([Column("within targets", True)] if targets else []),
        Column(f"$ / M {tokens} tokens", True),
        *([Column("$ / 1k requests", True)] if prefill else []),
        Column("price"),
    ]
    rows = [_serving_row(e, s, prefill, targets) for e, s in pairs]
    what = (
        f"{first.context} prompt tokens per request, prefill only"
        if prefill
        else f"{first.context} prompt + {first.new_tokens} new tokens per request"
    )
    intro = (
        f"<p>Served by {esc(first.engine_label)}: {esc(what)}. The ranking above rates the "
        f"GPUs by the engine's {tokens} tokens/s; the throughput chart above is plain "
        "PyTorch generation. "
        + (
            f"Prefill-only requests (--new-tokens 0) generate no token: TPOT is {NO_TPOT}, TTFT "
            "is the request's whole latency, and the cost is per million prompt tokens. "
            if prefill
            else ""
        )
        + f"Costs rent the GPU at the catalog's cheapest on-demand rate and keep the engine "
        f"busy; a GPU without a rent says {esc(NO_PRICE)}.</p>"
    )
    curves = [e.gpu_name for e, s in pairs[:LATENCY_GPUS] if s.by_concurrency]
    figures = _figure(latency_chart(data)) if curves else ""
    if has_price(data):
        figures += _figure(cost_chart(data))
    assumptions: list[str] = []
    for _, s in pairs:
        assumptions.extend(a for a in s.assumptions if a not in assumptions)
    return (
        f'<div id="serving"><h3>Served by {esc(first.engine_label)}</h3>'
        + intro
        + figures
        + html_table(columns, rows, f"{first.engine_label} per GPU", "serving-table")
        + _assumptions(assumptions, "What the engine's figures assume")
        + "</div>"
    )


def _serving_row(
    e: ThroughputEstimate, s: ServingSpeed, prefill: bool, targets: bool
) -> list[Cell]:
    cost = s.usd_per_million_prompt_tokens if prefill else s.usd_per_million_output_tokens
    return [
        Cell(e.gpu_name),
        Cell(str(s.gpus), s.gpus),
        Cell(str(s.concurrency), s.concurrency),
        Cell(_ms(s.ttft_s), s.ttft_s),
        Cell(NO_TPOT, None) if prefill else Cell(_ms(s.tpot_s), s.tpot_s),
        *(
            [
                Cell(num(s.requests_per_s), s.requests_per_s),
                Cell(num(s.prompt_tokens_per_s), s.prompt_tokens_per_s),
            ]
            if prefill
            else [Cell(num(s.output_tokens_per_s), s.output_tokens_per_s)]
        ),
        Cell((s.step_bound if prefill else s.decode_bound) or "-"),
        Cell("-" if s.max_concurrency is None else str(s.max_concurrency), s.max_concurrency),
        *(
            [
                Cell(
                    str(s.max_concurrency_within_targets),
                    s.max_concurrency_within_targets,
                )
            ]
            if targets
            else []
        ),
        Cell(NO_PRICE if cost is None else f"${num(cost)}", cost),
        *(
            [Cell(_usd_or_none(s.usd_per_thousand_requests), s.usd_per_thousand_requests)]
            if prefill
            else []
        ),
        Cell(s.price_source or "-"),
    ]


def _usd_or_none(value: float | None) -> str:
    return NO_PRICE if value is None else f"${num(value)}"


def _memory(data: ReportData) -> str:
    what = "concurrency" if data.run.mode == "inference" else "batch"
    run = data.run
    split = "tensor parallel" if run.mode == "inference" else _SHARDING_WORDS[run.sharding]
    if run.model_parallel() > 1:
        split = f"{run.model_parallel_words()}, {split}"
    together = f" of {run.gpus} working together ({split})" if run.gpus > 1 else ""
    intro = (
        f"<p>The largest {what} that fits on each GPU{esc(together)}, and where the memory "
        "goes at that size: the stacked bar is everything the process holds on the device "
        "(model weights, gradients, optimizer state, activations, temporaries, and the CUDA "
        "context, library workspaces and allocator cache as <em>overhead</em>); the black "
        "line is what the GPU offers.</p>"
    )
    columns = [
        Column("GPU", label=True),
        Column(f"largest {what}", True),
        Column("longest sequence", True),
        Column(f"at {what}", True),
        Column("on device", True),
        Column("capacity", True),
        Column("headroom", True),
        Column("fits"),
    ]
    rows = [
        [
            Cell(m.gpu_name),
            Cell(f"{m.max_batch_size}{'+' if m.max_batch_capped else ''}", m.max_batch_size),
            Cell(str(m.max_seq_len) if m.max_seq_len else "-", m.max_seq_len),
            Cell(str(m.batch_size), m.batch_size),
            Cell(gib(m.device_total_bytes), m.device_total_bytes),
            Cell(gib(m.capacity_bytes), m.capacity_bytes),
            Cell(gib(m.headroom_bytes), m.headroom_bytes),
            Cell("yes" if m.fits else "no"),
        ]
        for m in data.memory
    ]
    notes = _assumptions(data.memory[0].assumptions if data.memory else ())
    return _section(
        "memory",
        f"Largest {what} and memory per GPU",
        intro
        + _figure(batch_chart(data))
        + _figure(memory_chart(data))
        + html_table(columns, rows, "Memory per GPU", "memory-table")
        + notes,
    )


def _value(data: ReportData) -> str:
    parts = [
        "<p>Throughput per dollar, relative to the first GPU of each table (1.0 = as good; "
        "higher is better). Speeds are the predictions above; machines add the base system of "
        "their build class and assume linear scaling; rents are the cheapest on-demand rate "
        "in the catalog.</p>"
    ]
    alone = [t for t in data.value if t.count is None and not t.price_kind.startswith("cloud")]
    cloud = [t for t in data.value if t.price_kind.startswith("cloud")]
    machines = [t for t in data.value if t.count is not None]
    parts.extend(_figure(value_chart(table, "value")) for table in alone)
    if machines:
        counts = [t.count or 1 for t in machines]
        names: dict[str, str] = {}
        cells: dict[tuple[str, int], float | None] = {}
        for t in machines:
            for r in t.rows:
                names.setdefault(r.gpu, r.gpu_name)
                cells[(r.gpu, r.count)] = r.throughput_per_kusd
        unit = machines[0].rows[0].throughput_unit if machines[0].rows else ""
        columns = [
            Column("GPU", label=True),
            *(Column(f"{n} GPU{'s' if n > 1 else ''}", True) for n in counts),
        ]
        rows = [
            [Cell(name)] + [Cell(num(cells.get((gid, n))), cells.get((gid, n))) for n in counts]
            for gid, name in names.items()
        ]
        parts.append(
            html_table(columns, rows, f"Machines bought: {unit} per $1,000 of machine", "machines")
        )
    for table in cloud:
        parts.append(_figure(value_chart(table, "rent")))
        columns = [
            Column("GPU", label=True),
            Column("$/h", True),
            Column("units per $", True),
            Column("$ per million units", True),
            Column("relative", True),
            Column("price"),
        ]
        rows = [
            [
                Cell(r.gpu_name),
                Cell(usd(r.usd_per_hour), r.usd_per_hour),
                Cell(num(r.units_per_usd), r.units_per_usd),
                Cell(usd(r.usd_per_million_units), r.usd_per_million_units),
                Cell(num(r.relative), r.relative),
                Cell(r.price_note),
            ]
            for r in table.rows
        ]
        parts.append(html_table(columns, rows, "Rented: value per dollar of rent", "rent"))
    if data.breakeven is not None:
        b = data.breakeven
        days = "never (renting stays cheaper)"
        if b.breakeven_days is not None:
            days = f"day {b.breakeven_days:,.0f} ({num(b.breakeven_days / 365)} years)"
        parts.append(
            f"<h3>Cloud or own: {esc(lead_label(data))}</h3>"
            f"<p>Owning costs {esc(usd(b.system_cost_usd))} up front and "
            f"{esc(usd(b.electricity_usd_per_year))} of electricity a year at "
            f"{b.utilization:.0%} use; renting costs {esc(usd(b.cloud_usd_per_hour))}/h, "
            f"{esc(usd(b.cloud_usd_per_year))} a year. Owning becomes cheaper on {esc(days)}. "
            f"Over {num(b.years)} years: own {esc(usd(b.own_tco_usd))} (after "
            f"{esc(usd(b.resale_usd))} resale), rent {esc(usd(b.cloud_tco_usd))}.</p>"
        )
        parts.append(_figure(breakeven_chart(b, lead_label(data))))
        parts.append(_assumptions(b.assumptions))
    return _section("value", "Performance per dollar, cloud or own", "".join(parts))


def _results(data: ReportData) -> str:
    pivot = data.results
    if pivot is None:
        body = "<p>No stored benchmark results to show.</p>"
        return _section("results", "Your benchmark results", body)
    columns = [Column("workload", label=True), *(Column(d, True) for d in pivot.devices)]
    rows = []
    for row in pivot.rows:
        cells = [Cell(row.label)]
        for device in pivot.devices:
            cell = row.cells.get(device)
            if cell is None or cell.throughput is None:
                cells.append(Cell("-"))
                continue
            text = f"{num(cell.throughput)} {row.throughput_unit}"
            if cell.relative_throughput is not None:
                text += f" ({num(cell.relative_throughput)} x)"
            cells.append(Cell(text, cell.throughput))
        rows.append(cells)
    batch_rows = [
        [Cell(row.label)]
        + [
            Cell(str(row.cells[d].max_batch_size), row.cells[d].max_batch_size)
            if d in row.cells and row.cells[d].max_batch_size is not None
            else Cell("-")
            for d in pivot.devices
        ]
        for row in pivot.rows
    ]
    parts = [
        f"<p>{data.results_count} stored results; the newest per workload and device is shown, "
        f"relative to {esc(pivot.reference or '-')}.</p>",
        html_table(columns, rows, "Throughput (relative to the reference)", "results-speed"),
        html_table(
            columns,
            batch_rows,
            "Largest batch that ran (-: not searched, the batch was given; 0: not even 1)",
            "results-batch",
        ),
    ]
    parts.extend(_figure(results_chart(pivot, i)) for i in range(len(pivot.rows)))
    parts.append(_assumptions(pivot.notes))
    return _section("results", "Your benchmark results", "".join(parts))


_TRAINING_ONLY = frozenset(
    {
        "optimizer",
        "optimizer_impl",
        "loss_kernel",
        "grad_accum",
        "checkpointing",
        "checkpointing_policy",
        "method",
        "lora_rank",
        "lora_targets",
        "sharding",
    }
)
"""Settings of the run that only training uses."""
_INFERENCE_ONLY = frozenset({"context", "new_tokens", "concurrency"})
"""Settings of the run that only inference uses."""


def applicable_settings(data: ReportData) -> dict[str, str]:
    """The run's settings as the provenance lists them, without those that do not apply to
    it: training options of an inference run and the reverse, the LoRA rank and targets of a
    full fine-tune, the checkpointing policy of a run without checkpointing, the sharding of
    one GPU. (``report --json`` keeps them all.)"""
    run = data.run
    skip: set[str] = set(_INFERENCE_ONLY if run.mode == "train" else _TRAINING_ONLY)
    if run.method == "full":
        skip |= {"lora_rank", "lora_targets"}
    if not run.checkpointing:
        skip.add("checkpointing_policy")
    if run.gpus == 1:
        skip.add("sharding")
    return {k: v for k, v in data.provenance.run.items() if k not in skip}


_SHARDING_WORDS = {
    "ddp": "DDP, nothing sharded",
    "zero1": "ZeRO-1, optimizer state sharded",
    "zero2": "ZeRO-2, gradients and optimizer state sharded",
    "zero3": "ZeRO-3, parameters, gradients and optimizer state sharded",
    "fsdp": "FSDP, parameters, gradients and optimizer state sharded",
    "hsdp": "HSDP, parameters, gradients and optimizer state sharded within each node",
}
"""What each ``--sharding`` splits across the GPUs, as the header says it."""


def global_batch_words(data: ReportData) -> str:
    """Training: the samples of one optimizer step, micro-batch x accumulation x GPUs, with
    its size where the batch is given (``RunConfig.global_batch_size``); empty for inference
    and for one GPU without accumulation (the global batch is then the batch)."""
    run = data.run
    if run.mode != "train" or (run.grad_accum == 1 and run.gpus == 1):
        return ""
    copies = run.data_parallel()
    if run.model_parallel() > 1:
        together = f"{copies} data-parallel cop{'ies' if copies > 1 else 'y'}"
    else:
        together = f"{copies} GPU{'s' if copies > 1 else ''}"
    words = f"global batch = micro-batch x {run.grad_accum} accumulated x {together}"
    size = run.global_batch_size()
    return words + (f" = {size}" if size is not None else "")


def run_summary(data: ReportData) -> str:
    """The run in words for the page's header: ``RunConfig.describe`` (precision, optimizer
    and its implementation, loss kernel, checkpointing policy, accumulation, compile), then
    the GPUs working together with their sharding, and the global batch."""
    run = data.run
    parts = [run.describe()]
    lead = data.ranking.ranking[0] if data.ranking.ranking else None
    copies = ""
    if run.model_parallel() > 1:  # describe() names the split
        copies = f", {run.data_parallel()} copies"
    if lead is not None and lead.machines > 1:
        parts.append(
            f"{run.gpus} GPUs in {lead.machines} machines of {lead.count // lead.machines} "
            f"joined by {lead.network}{copies}, data parallel "
            f"({_SHARDING_WORDS[run.sharding]})"
        )
    elif run.gpus > 1:
        parts.append(f"{run.gpus} GPUs{copies} data parallel ({_SHARDING_WORDS[run.sharding]})")
    batch = global_batch_words(data)
    if batch:
        parts.append(batch)
    return ", ".join(parts)


def _provenance(data: ReportData) -> str:
    p = data.provenance
    facts = [
        ("whichgpu", p.tool_version),
        ("JSON schema", str(p.schema_version)),
        ("catalog data", p.catalog_version),
        ("computed", p.generated_at),
        ("speed model", p.throughput_model),
        ("fitted on", f"{p.throughput_fitted_on} ({p.throughput_fitted_date})"),
        (
            "speed model's error",
            f"±{p.throughput_error_band:.0%} (P80, {p.throughput_error_basis})",
        ),
        ("memory", p.memory_method),
        ("your prices", "used" if p.user_prices else "none"),
    ]
    if p.store:
        facts.append(("results store", p.store))
    facts_html = "".join(f"<dt>{esc(k)}</dt><dd>{esc(v)}</dd>" for k, v in facts)
    run_html = "".join(
        f"<dt>{esc(k)}</dt><dd>{esc(v)}</dd>" for k, v in applicable_settings(data).items()
    )
    prices = html_table(
        [Column("GPU", label=True), Column("price dates")],
        [[Cell(g), Cell(d)] for g, d in p.price_dates.items()],
        "Dates of the prices used",
        "price-dates",
    )
    assumptions = _assumptions(data.ranking.assumptions, "What the ranking assumes")
    notes = _assumptions(data.notes, "Not shown")
    return _section(
        "provenance",
        "Where the numbers come from",
        f'<div class="two"><dl>{facts_html}</dl><dl>{run_html}</dl></div>'
        + prices
        + assumptions
        + notes,
    )


def _assumptions(lines: Sequence[str], title: str = "Assumptions") -> str:
    if not lines:
        return ""
    items = "".join(f"<li>{esc(x)}</li>" for x in lines)
    return f'<div class="notes"><h4>{esc(title)}</h4><ul>{items}</ul></div>'


def _figure(svg: str) -> str:
    return f'<figure class="chart">{svg}</figure>'


def _section(section_id: str, title: str, body: str) -> str:
    return f'<section id="{section_id}"><h2>{esc(title)}</h2>{body}</section>'


_CSS = """
:root{--ink:#1b1b1b;--muted:#5a5a5a;--rule:#e3e3e3;--accent:#4c78a8}
*{box-sizing:border-box}
body{margin:0;font:15px/1.5 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;color:var(--ink);
background:#fafafa}
main{max-width:1040px;margin:0 auto;padding:24px 28px 60px;background:#fff;
overflow-wrap:break-word}
header h1{font-size:26px;margin:0 0 4px;overflow-wrap:anywhere}
header p{margin:0;color:var(--muted)}
nav{margin:14px 0 6px;font-size:14px}
nav a{margin-right:14px;color:var(--accent);text-decoration:none}
h2{font-size:20px;border-bottom:2px solid var(--rule);padding-bottom:4px;margin-top:36px}
h3{font-size:16px;margin:18px 0 6px}
h4{font-size:14px;margin:10px 0 4px;color:var(--muted)}
.answer{font-size:18px;font-weight:600;background:#eef4fb;border-left:4px solid var(--accent);
padding:10px 14px}
.reasons{display:inline-block;vertical-align:top;width:32%;min-width:260px;padding-right:12px}
.reasons ul,.notes ul{margin:0;padding-left:18px;font-size:13.5px}
ul.left-out{font-size:13.5px}
figure.chart{margin:14px 0}
figure.chart svg{max-width:100%;height:auto}
.table-wrap{overflow-x:auto;margin:10px 0 18px}
table{border-collapse:collapse;width:100%;margin:0;font-size:13.5px}
caption{text-align:left;font-weight:600;padding:4px 0}
th,td{padding:4px 8px;border-bottom:1px solid var(--rule)}
td{vertical-align:top}
td.num{white-space:nowrap}
td.label{min-width:12em;overflow-wrap:anywhere}
th{background:#f3f3f3;cursor:pointer;user-select:none;vertical-align:bottom}
th.num,td.num{text-align:right;font-variant-numeric:tabular-nums}
th.txt,td.txt{text-align:left}
th[aria-sort=ascending]::after{content:" \\25B2"}
th[aria-sort=descending]::after{content:" \\25BC"}
tbody tr:hover{background:#f7f9fc}
.notes{font-size:13px;color:var(--muted)}
.two{display:flex;gap:32px;flex-wrap:wrap}
.two dl{flex:1;min-width:300px}
dl{display:grid;grid-template-columns:max-content minmax(0,1fr);gap:2px 14px;font-size:13.5px}
dt{font-weight:600}
dd{margin:0;overflow-wrap:anywhere}
footer{margin-top:40px;color:var(--muted);font-size:12.5px}
@media (max-width:640px){
 main{padding:16px 12px 40px}
 header h1{font-size:22px}
 .reasons{display:block;width:auto;min-width:0;padding-right:0}
 td.label{min-width:8em}
 .two{gap:0}
 .two dl{min-width:0;flex-basis:100%}
 dl{grid-template-columns:minmax(0,max-content) minmax(0,1fr)}
}
@media print{
 body{background:#fff;font-size:11pt}
 main{max-width:none;padding:0}
 nav{display:none}
 section{break-inside:auto}
 .table-wrap{overflow:visible}
 figure.chart,table,.reasons{break-inside:avoid}
 h2,h3{break-after:avoid}
 th{cursor:auto}
 tbody tr:hover{background:none}
}
"""

_SCRIPT = """
(function(){
document.querySelectorAll("table.sortable").forEach(function(table){
 var heads=table.tHead.rows[0].cells;
 Array.prototype.forEach.call(heads,function(th,col){
  th.tabIndex=0;
  function sort(){
   var asc=th.getAttribute("aria-sort")!=="ascending";
   Array.prototype.forEach.call(heads,function(h){h.removeAttribute("aria-sort");});
   th.setAttribute("aria-sort",asc?"ascending":"descending");
   var num=th.getAttribute("data-type")==="num";
   var body=table.tBodies[0];
   var rows=Array.prototype.slice.call(body.rows);
   rows.sort(function(a,b){
    var x=a.cells[col],y=b.cells[col];
    var c;
    if(num){
     var p=parseFloat(x.getAttribute("data-v")),q=parseFloat(y.getAttribute("data-v"));
     if(isNaN(p))p=-Infinity;if(isNaN(q))q=-Infinity;c=p-q;
    }else{c=x.textContent.localeCompare(y.textContent);}
    return asc?c:-c;
   });
   rows.forEach(function(r){body.appendChild(r);});
  }
  th.addEventListener("click",sort);
  th.addEventListener("keydown",function(e){if(e.key==="Enter"){sort();}});
 });
});
})();
"""


def render_html(data: ReportData) -> str:
    """The whole report as one HTML document that needs nothing from the network."""
    summary = run_summary(data)
    summary += f"; {data.ranking.mode}"
    if data.ranking.job is not None:
        summary += f", job: {data.ranking.job.describe()}"
    if data.ranking.budget_usd is not None:
        summary += f", budget {usd(data.ranking.budget_usd)}"
    sections = [_answer(data), _speed(data), _memory(data), _value(data)]
    links = [("answer", "Answer"), ("speed", "Speed"), ("memory", "Memory"), ("value", "Value")]
    if served(data):
        links.insert(2, ("serving", "Serving"))
    if data.results is not None or data.provenance.store is not None:
        sections.append(_results(data))
        links.append(("results", "Your results"))
    sections.append(_provenance(data))
    links.append(("provenance", "Provenance"))
    nav = "".join(f'<a href="#{k}">{esc(v)}</a>' for k, v in links)
    p = data.provenance
    return (
        "<!DOCTYPE html>\n"
        '<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>Which GPU for {esc(data.title)}? - whichgpu report</title>"
        f"<style>{_CSS}</style></head>\n<body><main>"
        f"<header><h1>Which GPU for {esc(data.title)}?</h1><p>{esc(summary)}</p></header>"
        f"<nav>{nav}</nav>\n" + "\n".join(sections) + "\n<footer>Written by whichgpu "
        f"{esc(p.tool_version)} on {esc(p.generated_at)} from catalog data "
        f"{esc(p.catalog_version)}. Predictions carry the band shown; check the provenance "
        f"before you spend.</footer></main><script>{_SCRIPT}</script></body></html>\n"
    )

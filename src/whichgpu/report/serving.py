"""Terminal view of a serving engine's speed (``predict --serving``): per GPU the engine's
TTFT, TPOT, output tokens/s, what bounds the decode step and the cost per million output
tokens, then how TPOT and TTFT grow with the concurrency on the fastest GPU. Prefill-only
requests (``--new-tokens 0``) show requests/s, prompt tokens/s and the cost per million prompt
tokens and per thousand requests instead, TPOT as "—". No computation: every figure is a
field of ``ServingSpeed``.
"""

from __future__ import annotations

from collections.abc import Sequence

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from whichgpu.numbers import significant
from whichgpu.report.layout import Column, FittedTable
from whichgpu.schema import ServingSpeed, ThroughputEstimate


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else significant(seconds * 1000)


def serving_speed_view(estimates: Sequence[ThroughputEstimate]) -> RenderableType:
    """The engine's answer per GPU (fastest first) and its concurrency curve."""
    served = [(e, e.serving_speed) for e in estimates if e.serving_speed is not None]
    if not served:
        return Text("No GPU holds the sequences in the engine's KV cache.")
    first = served[0][1]
    if first.new_tokens == 0:
        return _prefill_only_view(served)
    targets = first.max_concurrency_within_targets is not None
    columns = [
        Column("GPU", style="bold", no_wrap=True),
        Column("GPUs", justify="right"),
        Column("concurrency", justify="right"),
        Column("TTFT ms", justify="right"),
        Column("TPOT ms", justify="right"),
        Column("output\ntokens/s", justify="right"),
        Column("decode\nbound", drop_order=3),
        Column("bandwidth-\nbound TPOT ms", justify="right", drop_order=4),
        Column("max\nconcurrency", justify="right", drop_order=2),
        *([Column("within\ntargets", justify="right")] if targets else []),
        Column("$ / M output\ntokens", justify="right", drop_order=1),
    ]
    rows = []
    for e, s in served:
        rows.append(
            [
                e.gpu_name,
                str(s.gpus),
                str(s.concurrency),
                _ms(s.ttft_s),
                _ms(s.tpot_s),
                _rate(s.output_tokens_per_s),
                s.decode_bound or "-",
                _ms(s.bandwidth_bound_tpot_s),
                "-" if s.max_concurrency is None else str(s.max_concurrency),
                *([str(s.max_concurrency_within_targets)] if targets else []),
                "-"
                if s.usd_per_million_output_tokens is None
                else f"${significant(s.usd_per_million_output_tokens)}",
            ]
        )
    title = (
        f"{first.engine_label}: {first.context} prompt + {first.new_tokens} new tokens per request"
    )
    table = FittedTable(columns, rows, title=title)
    parts: list[RenderableType] = [table]
    if first.benchmark is not None:
        parts.append(_benchmark_table(served))
    return Group(*parts, _curve(served[0][0].gpu_name, first), _notes(first))


def _benchmark_table(served: list[tuple[ThroughputEstimate, ServingSpeed]]) -> RenderableType:
    """The simulated closed-loop benchmark per GPU (``ServingSpeed.benchmark``)."""
    columns = [
        Column("GPU", style="bold", no_wrap=True),
        Column("mean\nTTFT ms", justify="right"),
        Column("median\nTTFT ms", justify="right"),
        Column("mean\nTPOT ms", justify="right"),
        Column("output\ntokens/s", justify="right"),
        Column("duration s", justify="right", drop_order=2),
        Column("running\nat most", justify="right", drop_order=1),
    ]
    rows = []
    first = None
    for e, s in served:
        b = s.benchmark
        if b is None:
            continue
        first = first or b
        rows.append(
            [
                e.gpu_name,
                _ms(b.mean_ttft_s),
                _ms(b.median_ttft_s),
                _ms(b.mean_tpot_s),
                _rate(b.output_tokens_per_s),
                significant(b.duration_s),
                str(b.running_limit),
            ]
        )
    assert first is not None
    title = (
        f"A benchmark run: {first.requests} requests, {first.concurrency} in flight (closed "
        "loop, fixed lengths, the first wave arriving together; as vllm bench serve "
        f"--max-concurrency {first.concurrency} --num-prompts {first.requests} --request-rate "
        "inf reports it)"
    )
    return FittedTable(columns, rows, title=title)


NO_TPOT = "—"
"""What the TPOT cells of prefill-only requests show: they generate no token."""


def _usd(value: float | None) -> str:
    return "-" if value is None else f"${significant(value)}"


def _rate(value: float | None) -> str:
    return "-" if value is None else significant(value)


def _prefill_only_view(served: list[tuple[ThroughputEstimate, ServingSpeed]]) -> RenderableType:
    """Prefill-only requests (no new tokens): per GPU the latency (TTFT), requests/s, prompt
    tokens/s and cost per million prompt tokens and per thousand requests; no TPOT."""
    first = served[0][1]
    targets = first.max_concurrency_within_targets is not None
    columns = [
        Column("GPU", style="bold", no_wrap=True),
        Column("GPUs", justify="right"),
        Column("concurrency", justify="right"),
        Column("TTFT ms\n(latency)", justify="right"),
        Column("TPOT ms", justify="right", drop_order=5),
        Column("requests/s", justify="right"),
        Column("prompt\ntokens/s", justify="right"),
        Column("step\nbound", drop_order=4),
        Column("max\nconcurrency", justify="right", drop_order=3),
        *([Column("within\ntargets", justify="right")] if targets else []),
        Column("$ / M prompt\ntokens", justify="right", drop_order=1),
        Column("$ / 1k\nrequests", justify="right", drop_order=2),
    ]
    rows = []
    for e, s in served:
        rows.append(
            [
                e.gpu_name,
                str(s.gpus),
                str(s.concurrency),
                _ms(s.ttft_s),
                NO_TPOT,
                _rate(s.requests_per_s),
                _rate(s.prompt_tokens_per_s),
                s.step_bound or "-",
                "-" if s.max_concurrency is None else str(s.max_concurrency),
                *([str(s.max_concurrency_within_targets)] if targets else []),
                _usd(s.usd_per_million_prompt_tokens),
                _usd(s.usd_per_thousand_requests),
            ]
        )
    title = f"{first.engine_label}: {first.context} prompt tokens per request, prefill only"
    table = FittedTable(columns, rows, title=title)
    curve = Table(title=f"{served[0][0].gpu_name}: growth with concurrency", title_justify="left")
    for header in ("concurrency", "TTFT ms", "TPOT ms", "requests/s", "prompt tokens/s"):
        curve.add_column(header, justify="right")
    for p in first.by_concurrency:
        curve.add_row(
            str(p.concurrency),
            _ms(p.ttft_s),
            NO_TPOT,
            _rate(p.requests_per_s),
            _rate(p.prompt_tokens_per_s),
        )
    notes = _notes(first)
    notes.append(
        f"\n- TPOT {NO_TPOT}: prefill-only requests (--new-tokens 0) generate no token; TTFT is "
        "the request's whole latency"
    )
    return Group(table, curve, notes)


def _curve(name: str, speed: ServingSpeed) -> Table:
    """TTFT, TPOT and output tokens/s as the concurrency grows, on one GPU."""
    table = Table(title=f"{name}: growth with concurrency", title_justify="left")
    for header in ("concurrency", "TTFT ms", "TPOT ms", "output tokens/s"):
        table.add_column(header, justify="right")
    for p in speed.by_concurrency:
        table.add_row(
            str(p.concurrency), _ms(p.ttft_s), _ms(p.tpot_s), _rate(p.output_tokens_per_s)
        )
    return table


def _notes(speed: ServingSpeed) -> Text:
    lines = [f"- {a}" for a in speed.assumptions]
    if speed.price_source:
        lines.append(f"- price: {speed.price_source}")
    return Text("\n".join(lines), style="dim")

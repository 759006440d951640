"""The serving charts of ``whichgpu report --serving ENGINE``: how the time per output token
(TPOT) grows with the concurrency on the leading GPUs, and the engine's dollars per million
output tokens per GPU. Prefill-only requests (``--new-tokens 0``) generate no token: their
latency chart is the time to first token (TTFT, the request's latency) and their cost is per
million prompt tokens.

Every number drawn is a field of the estimates' ``ServingSpeed`` (``api.predict`` with the
engine); this module only lays them out, with the conventions of ``report.charts`` (sizes,
fonts, escaped text, ``<title>`` tooltips)."""

from __future__ import annotations

import math

from whichgpu.numbers import significant as num
from whichgpu.report.charts import (
    GRID,
    LINE,
    PREDICTED,
    SIDE,
    WIDTH,
    Bar,
    _centred,
    _legend,
    _svg_open,
    _ticks,
    _title,
    bar_chart,
    esc,
    fit_text,
    text_width,
    usd,
)
from whichgpu.report_data import ReportData
from whichgpu.schema import ServingSpeed, ServingSpeedPoint, ThroughputEstimate

LATENCY_GPUS = 5
"""GPUs of the ranking whose concurrency curves the latency chart draws."""
CURVE_COLORS = (PREDICTED, "#f58518", "#54a24b", "#e45756", "#b279a2", "#72b7b2")
"""A colour per curve, in ranking order."""


def served(data: ReportData) -> list[tuple[ThroughputEstimate, ServingSpeed]]:
    """The GPUs the engine serves on, with their engine speed: in the ranking's order (the
    leader first), then the other GPUs shown in the estimates' order."""
    speeds = [(e, e.serving_speed) for e in data.throughput if e.serving_speed is not None]
    order = {c.gpu: i for i, c in reversed(list(enumerate(data.ranking.ranking)))}
    return sorted(speeds, key=lambda pair: order.get(pair[0].gpu, len(order)))


def prefill_only(data: ReportData) -> bool:
    """Whether the requests are prefill-only (no new token, no TPOT)."""
    pairs = served(data)
    return bool(pairs) and pairs[0][1].new_tokens == 0


def _latency_s(point: ServingSpeedPoint, ttft: bool) -> float | None:
    return point.ttft_s if ttft else point.tpot_s


def latency_chart(data: ReportData) -> str:
    """TPOT against the concurrency (TTFT for prefill-only requests) on the leading GPUs, the
    concurrency on a doubling (log 2) axis; a dashed line at the estimates' target, if any."""
    pairs = served(data)
    ttft = prefill_only(data)
    what = "TTFT" if ttft else "TPOT"
    first = pairs[0][1]
    drawn = [(e, s) for e, s in pairs[:LATENCY_GPUS] if s.by_concurrency]
    missing = [e.gpu_name for e, s in pairs[:LATENCY_GPUS] if not s.by_concurrency]
    target_s = first.target_ttft_s if ttft else first.target_tpot_s
    title = f"{what} against concurrency: {first.engine_label}, {first.context} prompt" + (
        " tokens, prefill only" if ttft else f" + {first.new_tokens} new tokens"
    )
    title_svg, title_h = _title(title)
    curves = [
        (e, [(p.concurrency, _latency_s(p, ttft)) for p in s.by_concurrency]) for e, s in drawn
    ]
    values_ms = [v * 1000 for _, points in curves for _, v in points if v is not None]
    highest = max([*values_ms, (target_s or 0.0) * 1000, 1e-9])
    yticks = _ticks(highest)
    y_top = max(yticks[-1], highest)
    levels = sorted({c for _, points in curves for c, _ in points} or {1})
    low, high = math.log2(levels[0]), math.log2(levels[-1])
    left = max(50.0, max(text_width(f"{t:g}") for t in yticks) + 10 + SIDE)
    right, top_pad, bottom_pad, plot_h = 24.0, 50.0 + title_h, 44.0, 240.0
    plot_w = WIDTH - left - right
    legend, legend_h = _legend(
        [(e.gpu_name, CURVE_COLORS[i % len(CURVE_COLORS)]) for i, (e, _) in enumerate(curves)],
        SIDE,
        top_pad + plot_h + bottom_pad,
    )
    gap_note = f"No concurrency curve in the estimates of: {', '.join(missing)}." if missing else ""
    height = top_pad + plot_h + bottom_pad + legend_h + (LINE if gap_note else 0) + 4

    def px(concurrency: float) -> float:
        if high == low:
            return left + plot_w / 2
        return left + plot_w * (math.log2(concurrency) - low) / (high - low)

    def py(ms: float) -> float:
        return top_pad + plot_h * (1 - ms / y_top)

    name = "serving-latency"
    out = [_svg_open(height, title, name), title_svg]
    out.extend(
        f'<line x1="{left:.0f}" x2="{WIDTH - right:.0f}" y1="{py(t):.1f}" y2="{py(t):.1f}" '
        f'stroke="{GRID}"/><text x="{left - 6:.0f}" y="{py(t) + 4:.1f}" text-anchor="end" '
        f'fill="#555">{t:g}</text>'
        for t in yticks
    )
    shown_until = -math.inf
    for level in levels:  # a label where it does not run into the one before
        x = px(level)
        label = str(level)
        half = text_width(label) / 2
        out.append(
            f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{top_pad:.0f}" y2="{top_pad + plot_h:.0f}" '
            f'stroke="{GRID}"/>'
        )
        if x - half >= shown_until + 4:
            out.append(
                f'<text x="{x:.1f}" y="{top_pad + plot_h + 16:.0f}" text-anchor="middle" '
                f'fill="#555">{esc(label)}</text>'
            )
            shown_until = x + half
    out.append(
        _centred(
            "concurrency (requests in the engine at once; doubling steps)",
            left + plot_w / 2,
            top_pad + plot_h + 34,
        )
    )
    out.append(
        f'<text x="{SIDE}" y="{top_pad - 12:.0f}" fill="#555">'
        f"{esc(f'{what} ms' + (' (the request latency)' if ttft else ''))}</text>"
    )
    if target_s is not None:
        ty = py(target_s * 1000)
        flag = "--ttft-ms" if ttft else "--tpot-ms"
        label = f"target {what} {num(target_s * 1000)} ms ({flag})"
        out.append(
            f'<line class="target" x1="{left:.0f}" x2="{WIDTH - right:.0f}" y1="{ty:.1f}" '
            f'y2="{ty:.1f}" stroke="#333" stroke-dasharray="4 3"><title>{esc(label)}</title>'
            f'</line><text x="{WIDTH - right:.0f}" y="{ty - 4:.1f}" text-anchor="end" '
            f'fill="#333">{esc(label)}</text>'
        )
    for i, ((e, s), (_, points)) in enumerate(zip(drawn, curves, strict=True)):
        color = CURVE_COLORS[i % len(CURVE_COLORS)]
        kept = [(c, v) for c, v in points if v is not None]
        path = " ".join(f"{px(c):.1f},{py(v * 1000):.1f}" for c, v in kept)
        out.append(
            f'<g class="curve" data-gpu="{esc(e.gpu)}"><polyline class="line" points="{path}" '
            f'fill="none" stroke="{color}" stroke-width="2"/>'
        )
        for p in s.by_concurrency:
            value = _latency_s(p, ttft)
            if value is None:
                continue
            out.append(
                f'<circle class="point" cx="{px(p.concurrency):.1f}" cy="{py(value * 1000):.1f}" '
                f'r="3.5" fill="{color}" data-concurrency="{p.concurrency}" '
                f'data-value="{value * 1000!r}"><title>{esc(_point_tip(e, p, ttft))}</title>'
                "</circle>"
            )
        out.append("</g>")
    out.append(legend)
    if gap_note:
        y = top_pad + plot_h + bottom_pad + legend_h + 8
        out.append(
            f'<text x="{SIDE}" y="{y:.0f}" fill="#555">'
            f"{esc(fit_text(gap_note, WIDTH - 2 * SIDE))}</text>"
        )
    out.append("</svg>")
    return "".join(out)


def _point_tip(e: ThroughputEstimate, p: ServingSpeedPoint, ttft: bool) -> str:
    if ttft:
        rate = f"{num(p.requests_per_s)} requests/s" if p.requests_per_s is not None else ""
        return f"{e.gpu_name}: concurrency {p.concurrency}, TTFT {num(p.ttft_s * 1000)} ms" + (
            f", {rate}" if rate else ""
        )
    tpot = "-" if p.tpot_s is None else num(p.tpot_s * 1000)
    return (
        f"{e.gpu_name}: concurrency {p.concurrency}, TPOT {tpot} ms, TTFT "
        f"{num(p.ttft_s * 1000)} ms, {num(p.output_tokens_per_s)} output tokens/s"
    )


NO_PRICE = "no price"
"""What the cost chart writes beside a GPU the catalog has no rent for (no bar is drawn)."""


def cost_chart(data: ReportData) -> str:
    """The engine's dollars per million output tokens per GPU (prompt tokens for prefill-only
    requests), at the cheapest on-demand rent, the engine kept busy; a GPU without a rent is
    listed as "no price", not drawn."""
    pairs = served(data)
    ttft = prefill_only(data)
    tokens = "prompt" if ttft else "output"
    bars = [_cost_bar(e, s, ttft) for e, s in pairs]
    first = pairs[0][1]
    return bar_chart(
        bars,
        f"$ per million {tokens} tokens per GPU: {first.engine_label}, rented at the cheapest "
        "on-demand rate, kept busy at the concurrency served",
        f"$ per million {tokens} tokens (lower is better)",
        "serving-cost",
    )


def _cost_bar(e: ThroughputEstimate, s: ServingSpeed, ttft: bool) -> Bar:
    value = s.usd_per_million_prompt_tokens if ttft else s.usd_per_million_output_tokens
    tokens = "prompt" if ttft else "output"
    if value is None:
        return Bar(
            label=e.gpu_name,
            value=0.0,
            text=NO_PRICE,
            drawn=False,
            color="#bbbbbb",
            tooltip=f"{e.gpu_name}: no rent in the catalog, so no $ per million {tokens} tokens",
        )
    hourly = "" if s.usd_per_gpu_hour is None else f" at {usd(s.usd_per_gpu_hour)}/GPU-hour"
    return Bar(
        label=e.gpu_name,
        value=value,
        text=f"${num(value)}",
        tooltip=f"{e.gpu_name}: ${num(value)} per million {tokens} tokens at concurrency "
        f"{s.concurrency}{hourly}" + (f"; {s.price_source}" if s.price_source else ""),
    )


def has_price(data: ReportData) -> bool:
    """Whether any GPU served has a cost per million tokens (else the cost chart is left out)."""
    ttft = prefill_only(data)
    return any(
        (s.usd_per_million_prompt_tokens if ttft else s.usd_per_million_output_tokens) is not None
        for _, s in served(data)
    )


def serving_chart(data: ReportData, name: str) -> str:
    """One serving chart by its ``report --chart`` name (``serving-latency``,
    ``serving-cost``); LookupError when the report has no serving engine or no price."""
    if not served(data):
        raise LookupError(
            f"The report has no serving engine's figures for --chart {name}: add --serving vllm "
            "(with --mode inference of a language model)."
        )
    if name == "serving-cost":
        if not has_price(data):
            raise LookupError("No GPU of the report has a rent price, so no cost per token.")
        return cost_chart(data)
    return latency_chart(data)

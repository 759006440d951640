"""The charts of ``whichgpu report``: inline SVG drawn from a ``ReportData`` (bars with their
bands, the memory breakdown, value per dollar, break-even, measured results), readable without
JavaScript (hovering a bar or a point shows its values through the SVG ``<title>``), laid out
with text widths measured here so that labels fit in any reader's font. Every string that
comes from the user or the data is escaped (``esc``). ``chart_svg`` gives one chart as a
standalone document; ``report.html`` places them in the page."""

from __future__ import annotations

import html
from collections.abc import Sequence
from dataclasses import dataclass

from whichgpu.numbers import significant as num
from whichgpu.report_data import ReportData, SpeedPoint
from whichgpu.schema import Breakeven, ValueTable
from whichgpu.store import ResultPivot

CHARTS = ("throughput", "batch", "memory", "value", "rent", "breakeven")
"""Names of the single charts ``whichgpu report --format svg --chart NAME`` writes."""
SERVING_CHARTS = ("serving-latency", "serving-cost")
"""The single charts of a report with a serving engine (``--serving``) only."""

WIDTH = 760
"""Width of every chart, in SVG units (it scales to the page)."""
ROW = 22
"""Height of one bar's row."""
LABEL_W = 190
"""Widest the label column left of the bars grows to (longer labels end in an ellipsis;
the whole name stays in the bar's tooltip); it is as narrow as its longest label."""
SIDE = 8
"""Margin kept free at the left and right edges of a chart."""
FONT = 12
"""Font size of a chart's text; titles are this size, bold."""
LINE = 16
"""Height of one line of a chart's title or legend."""

# Advance widths, in em, of DejaVu Sans (the widest common fallback of ``system-ui`` and
# ``sans-serif``), rounded up: laying out with them leaves room for any narrower font.
_EM = {
    **dict.fromkeys(" .,:;'!|il", 0.34),
    **dict.fromkeys('()[]{}/\\-fjrt"', 0.42),
    **dict.fromkeys("abcdeghknopqsuvxyz0123456789$?_*", 0.65),
    **dict.fromkeys("ABCEFKLPRSTVXYZ", 0.71),
    **dict.fromkeys("DGHNOQU&", 0.8),
    **dict.fromkeys("mMW%@w+=<>#~±", 1.0),
    "I": 0.34,
    "J": 0.34,
}
_EM_OTHER = 1.0
"""Any character not listed (other scripts, symbols)."""
_BOLD = 1.1
"""How much wider bold text is."""


def text_width(text: str, size: float = FONT, bold: bool = False) -> float:
    """The width ``text`` takes in a chart, in SVG units, estimated on the generous side (the
    reader's fonts are not known when the page is written)."""
    em = sum(_EM.get(ch, _EM_OTHER) for ch in text)
    return em * size * (_BOLD if bold else 1.0)


def fit_text(text: str, width: float, size: float = FONT) -> str:
    """``text``, or as much of it as fits in ``width`` followed by an ellipsis."""
    if text_width(text, size) <= width:
        return text
    while text and text_width(text + "…", size) > width:
        text = text[:-1]
    return text.rstrip() + "…"


def wrap_text(text: str, width: float, size: float = FONT, bold: bool = False) -> list[str]:
    """``text`` broken between words into lines that each fit in ``width`` (a single word too
    long for a line is cut to fit)."""
    lines: list[str] = []
    line = ""
    for word in text.split():
        candidate = f"{line} {word}" if line else word
        if not line or text_width(candidate, size, bold) <= width:
            line = candidate
        else:
            lines.append(line)
            line = word
    lines.append(line)
    return [fit_text(x, width / (_BOLD if bold else 1.0), size) for x in lines]


PREDICTED = "#4c78a8"
MEASURED = "#e45756"
BAND = "#1b1b1b"
GRID = "#d9d9d9"
MEMORY_COLORS = {
    "weights": "#4c78a8",
    "gradients": "#72b7b2",
    "optimizer": "#f58518",
    "activations": "#54a24b",
    "temporaries": "#b279a2",
    "overhead": "#9d9da0",
}


def esc(text: object) -> str:
    """``text`` safe inside HTML or SVG text and attribute values."""
    return html.escape(str(text), quote=True)


# --- numbers in words --------------------------------------------------------------------------


def usd(value: float | None) -> str:
    """Dollars: whole above 100, cents below."""
    if value is None:
        return "-"
    if value == 0:
        return "$0"
    return f"${value:,.0f}" if abs(value) >= 100 else f"${value:,.2f}"


def gib(n_bytes: int | float | None) -> str:
    """Bytes as GiB with one decimal."""
    return "-" if n_bytes is None else f"{n_bytes / 2**30:,.1f} GiB"


def duration(seconds: float | None) -> str:
    """A time in the largest unit that keeps it above 1 (s, min, h, days)."""
    if seconds is None:
        return "-"
    for unit, size in (("days", 86400.0), ("h", 3600.0), ("min", 60.0)):
        if seconds >= size:
            return f"{num(seconds / size)} {unit}"
    return f"{num(seconds)} s"


# --- charts ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Bar:
    """One bar of a horizontal bar chart, with an optional band and a tooltip."""

    label: str
    value: float
    tooltip: str
    color: str = PREDICTED
    low: float | None = None
    high: float | None = None
    note: str = ""
    text: str | None = None
    """The value as written beside the bar (default: ``num(value)``)."""
    drawn: bool = True
    """False: no bar, only its label and ``text`` (a value that is not known, such as a GPU
    without a price, is listed rather than drawn as 0)."""


def _svg_open(height: float, title: str, name: str) -> str:
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" class="chart" data-chart="{esc(name)}" '
        f'viewBox="0 0 {WIDTH} {height:.0f}" width="{WIDTH}" height="{height:.0f}" '
        f'role="img" aria-label="{esc(title)}" font-family="system-ui, sans-serif" '
        f'font-size="12"><title>{esc(title)}</title>'
        f'<rect width="{WIDTH}" height="{height:.0f}" fill="#fff"/>'
    )


def _ticks(top: float, count: int = 5) -> list[float]:
    """Round tick values from 0 to about ``top``."""
    if top <= 0:
        return [0.0]
    raw = top / count
    power = 10 ** int(f"{raw:e}".split("e")[1])
    step = next(m * power for m in (1, 2, 2.5, 5, 10) if m * power >= raw)
    ticks = []
    value = 0.0
    while True:
        ticks.append(value)
        if value >= top * 0.9999:
            return ticks
        value += step


def _title(text: str, x: float = SIDE) -> tuple[str, float]:
    """A chart's bold title from ``x``, on as many lines as it needs within the chart; returns
    the markup and the height it takes."""
    lines = wrap_text(text, WIDTH - SIDE - x, bold=True)
    spans = "".join(
        f'<tspan x="{x:.0f}" dy="{0 if i == 0 else LINE}">{esc(line)}</tspan>'
        for i, line in enumerate(lines)
    )
    return f'<text y="18" font-weight="600">{spans}</text>', LINE * (len(lines) - 1)


def _centred(text: str, centre: float, y: float, fill: str = "#333") -> str:
    """``text`` centred on ``centre`` where it fits, else moved (or cut) to stay inside."""
    text = fit_text(text, WIDTH - 2 * SIDE)
    half = text_width(text) / 2
    centre = min(max(centre, SIDE + half), WIDTH - SIDE - half)
    return (
        f'<text x="{centre:.0f}" y="{y:.0f}" text-anchor="middle" fill="{fill}">{esc(text)}</text>'
    )


def _label_width(labels: Sequence[str]) -> float:
    """The label column: as wide as the longest label, at most ``LABEL_W``."""
    return min(max([text_width(x) for x in labels] + [40.0]) + SIDE + 6, LABEL_W)


def _label(label: str, label_w: float) -> str:
    """A bar's label as it fits the label column; a shortened one keeps the whole as its
    tooltip."""
    shown = fit_text(label, label_w - 6 - SIDE)
    return esc(shown) if shown == label else f"{esc(shown)}<title>{esc(label)}</title>"


def _legend(items: Sequence[tuple[str, str]], x0: float, y0: float) -> tuple[str, float]:
    """Colour keys with their labels from (``x0``, ``y0``), left to right, starting a new line
    where the next would not fit; returns the markup and the height it takes."""
    out: list[str] = []
    x, y = x0, y0
    for label, color in items:
        width = 14 + text_width(label) + 16
        if x > x0 and x + width - 16 > WIDTH - SIDE:
            x, y = x0, y + LINE
        out.append(
            f'<rect x="{x:.0f}" y="{y:.0f}" width="10" height="10" fill="{color}"/>'
            f'<text x="{x + 14:.0f}" y="{y + 9:.0f}">{esc(label)}</text>'
        )
        x += width
    return "".join(out), y - y0 + LINE


def bar_chart(
    bars: Sequence[Bar], title: str, axis: str, name: str, marker: float | None = None
) -> str:
    """Horizontal bars with optional uncertainty whiskers; ``marker`` draws a dashed line.

    The label column is as wide as the longest label (at most ``LABEL_W``) and the space right
    of the bars as wide as the longest value written there, so every text stays inside."""
    title_svg, title_h = _title(title)
    top_pad, bottom_pad = 30 + title_h, 34
    height = top_pad + bottom_pad + ROW * max(len(bars), 1)
    label_w = _label_width([b.label for b in bars])
    texts = [f"{b.text if b.text is not None else num(b.value)}{b.note}" for b in bars]
    right = max([text_width(t) for t in texts] + [20.0]) + 4 + SIDE
    plot_w = WIDTH - label_w - right
    highest = max([b.high or b.value for b in bars if b.drawn] + [marker or 0.0, 1e-12])
    ticks = _ticks(highest)
    scale_top = max(ticks[-1], highest)

    def x(v: float) -> float:
        return label_w + plot_w * v / scale_top

    out = [_svg_open(height, title, name), title_svg]
    base = height - bottom_pad
    out.extend(
        f'<line x1="{x(t):.1f}" x2="{x(t):.1f}" y1="{top_pad - 4}" y2="{base}" '
        f'stroke="{GRID}"/><text x="{x(t):.1f}" y="{base + 14}" text-anchor="middle" '
        f'fill="#555">{t:g}</text>'
        for t in ticks
    )
    out.append(_centred(axis, label_w + plot_w / 2, height - 4))
    for i, (b, text) in enumerate(zip(bars, texts, strict=True)):
        y = top_pad + i * ROW
        out.append(
            f'<g class="datum"><title>{esc(b.tooltip)}</title>'
            f'<text x="{label_w - 6:.0f}" y="{y + ROW * 0.65:.1f}" text-anchor="end">'
            f"{_label(b.label, label_w)}</text>"
        )
        if not b.drawn:
            out.append(
                f'<text class="missing" x="{label_w + 4:.1f}" y="{y + ROW * 0.65:.1f}" '
                f'fill="#555">{esc(text)}</text></g>'
            )
            continue
        out.append(
            f'<rect class="bar" x="{label_w:.0f}" y="{y + 3}" '
            f'width="{max(x(b.value) - label_w, 0.5):.1f}"'
            f' height="{ROW - 6}" fill="{b.color}" data-value="{b.value!r}"/>'
        )
        if b.low is not None and b.high is not None and b.high > b.low:
            mid = y + ROW / 2
            out.append(
                f'<path class="band" d="M{x(b.low):.1f},{mid:.1f}H{x(b.high):.1f}'
                f"M{x(b.low):.1f},{mid - 5:.1f}V{mid + 5:.1f}M{x(b.high):.1f},{mid - 5:.1f}"
                f'V{mid + 5:.1f}" stroke="{BAND}" stroke-width="1.2" fill="none"/>'
            )
        end = x(max(b.high or b.value, b.value))
        out.append(
            f'<text x="{end + 4:.1f}" y="{y + ROW * 0.65:.1f}" fill="#333">{esc(text)}</text></g>'
        )
    if marker is not None:
        out.append(
            f'<line x1="{x(marker):.1f}" x2="{x(marker):.1f}" y1="{top_pad - 4}" y2="{base}" '
            f'stroke="#333" stroke-dasharray="4 3"/>'
        )
    out.append("</svg>")
    return "".join(out)


def speed_chart(data: ReportData) -> str:
    """Throughput per GPU relative to the reference, with bands; measured bars in red."""
    bars = [
        Bar(
            label=p.gpu_name,
            value=p.relative,
            low=p.relative_low if p.source == "predicted" else None,
            high=p.relative_high if p.source == "predicted" else None,
            color=MEASURED if p.source == "measured" else PREDICTED,
            note=" measured" if p.source == "measured" else "",
            tooltip=_speed_tip(p),
        )
        for p in data.speeds
    ]
    unit = data.speeds[0].throughput_unit if data.speeds else ""
    return bar_chart(
        bars,
        f"Throughput relative to {data.reference_name} ({unit}, {_batch_words(data)})",
        f"x {data.reference_name} (1.0 = as fast); whiskers: the prediction's band",
        "throughput",
        marker=1.0,
    )


def _batch_words(data: ReportData) -> str:
    """The batch the speeds are at: the one asked, or each GPU's largest."""
    if data.run.batch_size is not None:
        return f"batch {data.run.batch_size}"
    return "batch = largest that fits"


def _speed_tip(p: SpeedPoint) -> str:
    tip = f"{p.gpu_name}: {num(p.throughput)} {p.throughput_unit} ({p.source}), "
    tip += f"{num(p.relative)} x reference, batch {p.batch_size}"
    if p.source == "predicted":
        tip += f"; band {num(p.low)}-{num(p.high)}"
    return tip


def batch_chart(data: ReportData) -> str:
    """Largest batch (concurrency for inference) per GPU."""
    what = "concurrency" if data.run.mode == "inference" else "batch"
    bars = [
        Bar(
            label=m.gpu_name,
            value=float(m.max_batch_size if m.fits else 0),
            text=f"{m.max_batch_size if m.fits else 0}{'+' if m.max_batch_capped else ''}",
            color=PREDICTED if m.fits else "#bbbbbb",
            note="" if m.fits else " (does not fit)",
            tooltip=f"{m.gpu_name}: largest {what} {m.max_batch_size}"
            + ("+" if m.max_batch_capped else "")
            + (f", longest sequence {m.max_seq_len}" if m.max_seq_len else "")
            + ("" if m.fits else " - does not fit"),
        )
        for m in sorted(data.memory, key=lambda m: -m.max_batch_size)
    ]
    return bar_chart(bars, f"Largest {what} per GPU", f"{what} per GPU", "batch")


def memory_chart(data: ReportData) -> str:
    """Memory per GPU at its headline batch, stacked by category, against its capacity."""
    estimates = list(data.memory)
    title = "Memory per GPU at its batch, by kind, against capacity (black line)"
    title_svg, title_h = _title(title)
    top_pad, bottom_pad = 30 + title_h, 40
    label_w = _label_width([m.gpu_name for m in estimates])
    verdicts = [
        f"{gib(m.device_total_bytes)} / {gib(m.capacity_bytes)} "
        + ("fits" if m.fits else "does not fit")
        for m in estimates
    ]
    right = max([text_width(v) for v in verdicts] + [20.0]) + 5 + SIDE
    plot_w = WIDTH - label_w - right
    highest = max([float(max(m.device_total_bytes, m.capacity_bytes)) for m in estimates] + [1.0])
    ticks = _ticks(highest / 2**30)
    scale_top = max(ticks[-1] * 2**30, highest)

    def x(n_bytes: float) -> float:
        return label_w + plot_w * n_bytes / scale_top

    base = top_pad + ROW * len(estimates)
    legend, legend_h = _legend(list(MEMORY_COLORS.items()), SIDE, base + bottom_pad)
    height = base + bottom_pad + legend_h + 4
    out = [_svg_open(height, title, "memory"), title_svg]
    for t in ticks:
        xt = x(t * 2**30)
        out.append(
            f'<line x1="{xt:.1f}" x2="{xt:.1f}" y1="{top_pad - 4}" y2="{base}" stroke="{GRID}"/>'
            f'<text x="{xt:.1f}" y="{base + 14}" text-anchor="middle" fill="#555">'
            f"{t:g}</text>"
        )
    out.append(_centred("GiB on the device", label_w + plot_w / 2, base + 30))
    for i, (m, verdict) in enumerate(zip(estimates, verdicts, strict=True)):
        y = top_pad + i * ROW
        out.append(
            f'<g class="datum"><text x="{label_w - 6:.0f}" y="{y + ROW * 0.65:.1f}" '
            f'text-anchor="end">{_label(m.gpu_name, label_w)}</text>'
        )
        start = 0.0
        for kind, n_bytes in m.breakdown.items():
            if n_bytes <= 0:
                continue
            out.append(
                f'<rect class="bar segment" x="{x(start):.1f}" y="{y + 3}" '
                f'width="{max(x(start + n_bytes) - x(start), 0.3):.1f}" height="{ROW - 6}" '
                f'fill="{MEMORY_COLORS.get(kind, "#888")}" data-value="{n_bytes}">'
                f"<title>{esc(m.gpu_name)}: {esc(kind)} {esc(gib(n_bytes))} at batch "
                f"{m.batch_size}</title></rect>"
            )
            start += n_bytes
        cap = x(m.capacity_bytes)
        out.append(
            f'<line class="capacity" x1="{cap:.1f}" x2="{cap:.1f}" y1="{y + 1}" '
            f'y2="{y + ROW - 1}" stroke="#000" stroke-width="2.5">'
            f"<title>{esc(m.gpu_name)}: capacity {esc(gib(m.capacity_bytes))} "
            f"({esc(m.capacity_note)})</title></line>"
        )
        out.append(
            f'<text x="{max(x(start), cap) + 5:.1f}" y="{y + ROW * 0.65:.1f}" fill="#333">'
            f"{esc(verdict)}</text></g>"
        )
    out.append(legend)
    out.append("</svg>")
    return "".join(out)


def value_chart(table: ValueTable, name: str) -> str:
    """Performance per dollar relative to the table's reference row."""
    bars = [
        Bar(
            label=r.gpu_name if r.count == 1 else f"{r.count} x {r.gpu_name}",
            value=r.relative,
            tooltip=f"{r.gpu_name}: {num(r.relative)} x reference; "
            + (
                f"{num(r.throughput_per_kusd)} {r.throughput_unit} per $1,000"
                if r.throughput_per_kusd is not None
                else f"{num(r.units_per_usd)} units per $ at {usd(r.usd_per_hour)}/h"
            )
            + f"; {r.price_note}",
        )
        for r in table.rows
    ]
    what = _value_title(table)
    ref = next((r.gpu_name for r in table.rows if r.gpu == table.reference), table.reference)
    return bar_chart(
        bars,
        f"Performance per dollar: {what}",
        f"x {ref} (higher is better)",
        name,
        marker=1.0,
    )


def _value_title(table: ValueTable) -> str:
    if table.price_kind.startswith("cloud"):
        return "rented, per dollar of rent"
    if table.count is None:
        return "the GPU alone, bought"
    return f"{table.count}-GPU machines, bought" + (
        f" ({table.build_class}, base {usd(table.base_system_usd)})" if table.build_class else ""
    )


def breakeven_chart(even: Breakeven, gpu_label: str) -> str:
    """Cumulative cost of renting and of owning, month by month, and the break-even day."""
    points = list(even.curve)
    title = f"Renting against owning {gpu_label}: money spent by then"
    title_svg, title_h = _title(title)
    max_days = max([p.days for p in points] + [1.0])
    max_usd = max([max(p.cloud_usd, p.own_usd) for p in points] + [1.0])
    yticks = _ticks(max_usd)
    y_top = max(yticks[-1], max_usd)
    left = max(80.0, max(text_width(usd(t)) for t in yticks) + 6 + SIDE)
    height, right, top_pad, bottom_pad = 320 + title_h, 30, 34 + title_h, 44
    plot_w, plot_h = WIDTH - left - right, height - top_pad - bottom_pad

    def px(days: float) -> float:
        return left + plot_w * days / max_days

    def py(amount: float) -> float:
        return top_pad + plot_h * (1 - amount / y_top)

    out = [_svg_open(height, title, "breakeven"), title_svg]
    out.extend(
        f'<line x1="{left:.0f}" x2="{WIDTH - right}" y1="{py(t):.1f}" y2="{py(t):.1f}" '
        f'stroke="{GRID}"/><text x="{left - 6:.0f}" y="{py(t) + 4:.1f}" text-anchor="end" '
        f'fill="#555">{esc(usd(t))}</text>'
        for t in yticks
    )
    out.extend(
        f'<text x="{px(t * 365):.1f}" y="{top_pad + plot_h + 16:.1f}" text-anchor="middle" '
        f'fill="#555">{t:g}</text>'
        for t in _ticks(max_days / 365.0, 6)
    )
    out.append(_centred("years", left + plot_w / 2, height - 6))
    for key, color, label in (("cloud_usd", PREDICTED, "rent"), ("own_usd", "#f58518", "own")):
        path = " ".join(f"{px(p.days):.1f},{py(getattr(p, key)):.1f}" for p in points)
        out.append(
            f'<polyline class="line" points="{path}" fill="none" stroke="{color}" '
            f'stroke-width="2"/>'
        )
        for p in points:
            value = getattr(p, key)
            out.append(
                f'<circle class="point" cx="{px(p.days):.1f}" cy="{py(value):.1f}" r="3.5" '
                f'fill="{color}" data-value="{value!r}"><title>{label}, day {p.days:.0f}: '
                f"{esc(usd(value))}</title></circle>"
            )
    if even.breakeven_days is not None and even.breakeven_days <= max_days:
        bx = px(even.breakeven_days)
        out.append(
            f'<line x1="{bx:.1f}" x2="{bx:.1f}" y1="{top_pad}" y2="{top_pad + plot_h}" '
            f'stroke="#333" stroke-dasharray="4 3"><title>break-even on day '
            f"{even.breakeven_days:.0f}</title></line>"
            + _beside(f"break-even: day {even.breakeven_days:,.0f}", bx, top_pad + 12)
        )
    lx = left + 10
    for color, label in ((PREDICTED, "rent"), ("#f58518", "own (purchase + electricity)")):
        out.append(
            f'<rect x="{lx:.0f}" y="{top_pad + 4}" width="12" height="3" fill="{color}"/>'
            f'<text x="{lx + 16:.0f}" y="{top_pad + 9}">{esc(label)}</text>'
        )
        lx += 16 + text_width(label) + 20
    out.append("</svg>")
    return "".join(out)


def _beside(text: str, x: float, y: float) -> str:
    """``text`` right of a vertical line at ``x``, or left of it where the right has no room."""
    if x + 4 + text_width(text) <= WIDTH - SIDE:
        return f'<text x="{x + 4:.1f}" y="{y:.0f}" fill="#333">{esc(text)}</text>'
    return f'<text x="{x - 4:.1f}" y="{y:.0f}" text-anchor="end" fill="#333">{esc(text)}</text>'


def results_chart(pivot: ResultPivot, index: int) -> str:
    """One row of the stored results: throughput per device, the reference marked at 1."""
    row = pivot.rows[index]
    bars = [
        Bar(
            label=device,
            value=cell.throughput or 0.0,
            color=MEASURED,
            tooltip=f"{device}: {num(cell.throughput)} {row.throughput_unit}, batch "
            f"{cell.batch_size}"
            + (
                f", {num(cell.relative_throughput)} x {pivot.reference}"
                if cell.relative_throughput is not None
                else ""
            ),
        )
        for device, cell in row.cells.items()
    ]
    title = f"Measured: {row.label}"
    return bar_chart(bars, title, row.throughput_unit, f"results-{index}")


def chart_svg(data: ReportData, name: str) -> str:
    """One chart of the report as a standalone SVG document (``name`` from ``CHARTS``)."""
    if name == "throughput":
        return speed_chart(data)
    if name == "batch":
        return batch_chart(data)
    if name == "memory":
        return memory_chart(data)
    if name in ("value", "rent"):
        cloud = name == "rent"
        for table in data.value:
            if table.price_kind.startswith("cloud") == cloud and (cloud or table.count is None):
                return value_chart(table, name)
        raise LookupError(f"The report has no {'rented' if cloud else 'purchase'} prices.")
    if name in SERVING_CHARTS:
        from whichgpu.report.serving_charts import serving_chart

        return serving_chart(data, name)
    if name == "breakeven":
        if data.breakeven is None:
            why = next((n for n in data.notes if n.startswith("Cloud against own for")), None)
            if why is None:
                why = "its leading candidate has no purchase or rent price"
            else:  # the advice names cost breakeven's options
                why = why.rstrip(".") + " (options of whichgpu cost breakeven)"
            raise LookupError(f"The report has no break-even curve: {why}.")
        return breakeven_chart(data.breakeven, lead_label(data))
    raise LookupError(
        f"No chart named '{name}'; choose one of {', '.join(CHARTS + SERVING_CHARTS)}."
    )


def lead_label(data: ReportData) -> str:
    name = next(
        (c.gpu_name for c in data.ranking.ranking if c.gpu == data.breakeven_gpu),
        data.breakeven_gpu or "",
    )
    return f"{data.breakeven_count} x {name}" if data.breakeven_count > 1 else name

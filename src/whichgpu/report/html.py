"""``whichgpu report``: one self-contained HTML page, and single charts as SVG.

Everything shown was computed by ``whichgpu.api.report`` (a ``ReportData``); this module only
lays it out. The page needs nothing from the network: the style sheet and the one small script
(table sorting) are inline, the charts are inline SVG drawn here (readable without JavaScript;
hovering a bar or a point shows its values through the SVG ``<title>``), and the fonts are the
reader's own. Every string that comes from the user or the data is escaped.
"""

from __future__ import annotations

import html
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from whichgpu.numbers import significant as num
from whichgpu.report_data import ReportData, SpeedPoint
from whichgpu.schema import SCHEMA_VERSION, Breakeven, ThroughputEstimate, ValueTable
from whichgpu.store import ResultPivot

CHARTS = ("throughput", "batch", "memory", "value", "rent", "breakeven")
"""Names of the single charts ``whichgpu report --format svg --chart NAME`` writes."""

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


def report_doc(data: ReportData) -> dict[str, Any]:
    """``report --json``: the ``ReportData`` fields plus ``schema_version``."""
    doc: dict[str, Any] = data.model_dump(mode="json")
    doc["schema_version"] = SCHEMA_VERSION
    return doc


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
    highest = max([b.high or b.value for b in bars] + [marker or 0.0, 1e-12])
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
    if name == "breakeven":
        if data.breakeven is None:
            why = next((n for n in data.notes if n.startswith("Cloud against own for")), None)
            if why is None:
                why = "its leading candidate has no purchase or rent price"
            else:  # the advice names cost breakeven's options
                why = why.rstrip(".") + " (options of whichgpu cost breakeven)"
            raise LookupError(f"The report has no break-even curve: {why}.")
        return breakeven_chart(data.breakeven, _lead_label(data))
    raise LookupError(f"No chart named '{name}'; choose one of {', '.join(CHARTS)}.")


def _lead_label(data: ReportData) -> str:
    name = next(
        (c.gpu_name for c in data.ranking.ranking if c.gpu == data.breakeven_gpu),
        data.breakeven_gpu or "",
    )
    return f"{data.breakeven_count} x {name}" if data.breakeven_count > 1 else name


# --- the page ----------------------------------------------------------------------------------


def _answer(data: ReportData) -> str:
    r = data.ranking
    units = {c.perf_per_dollar_unit for c in r.ranking}
    shared_unit = units.pop() if len(units) == 1 else None  # said once, in the heading
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


def _speed(data: ReportData) -> str:
    band = data.provenance.throughput_error_band
    intro = (
        "<p>Throughput of one GPU "
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
        ),
    )


def _memory(data: ReportData) -> str:
    what = "concurrency" if data.run.mode == "inference" else "batch"
    intro = (
        f"<p>The largest {what} that fits on each GPU, and where the memory goes at that "
        "size: the stacked bar is everything the process holds on the device (model weights, "
        "gradients, optimizer state, activations, temporaries, and the CUDA context, library "
        "workspaces and allocator cache as <em>overhead</em>); the black line is what the "
        "GPU offers.</p>"
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
            f"<h3>Cloud or own: {esc(_lead_label(data))}</h3>"
            f"<p>Owning costs {esc(usd(b.system_cost_usd))} up front and "
            f"{esc(usd(b.electricity_usd_per_year))} of electricity a year at "
            f"{b.utilization:.0%} use; renting costs {esc(usd(b.cloud_usd_per_hour))}/h, "
            f"{esc(usd(b.cloud_usd_per_year))} a year. Owning becomes cheaper on {esc(days)}. "
            f"Over {num(b.years)} years: own {esc(usd(b.own_tco_usd))} (after "
            f"{esc(usd(b.resale_usd))} resale), rent {esc(usd(b.cloud_tco_usd))}.</p>"
        )
        parts.append(_figure(breakeven_chart(b, _lead_label(data))))
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
    run = data.run
    summary = run.describe()
    summary += f"; {data.ranking.mode}"
    if data.ranking.job is not None:
        summary += f", job: {data.ranking.job.describe()}"
    if data.ranking.budget_usd is not None:
        summary += f", budget {usd(data.ranking.budget_usd)}"
    sections = [_answer(data), _speed(data), _memory(data), _value(data)]
    links = [("answer", "Answer"), ("speed", "Speed"), ("memory", "Memory"), ("value", "Value")]
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

"""Notebook views: results as HTML tables (``_repr_html_``) and as pandas DataFrames.

The value types of ``whichgpu.schema`` and the lists the API returns
(``whichgpu.tabular.ResultList``) call into this module when Jupyter shows them or when
``to_frame()`` is asked for. Nothing is computed here: a row is a result's own fields, with
nested parts flattened (``run.mode`` as ``mode``, the memory breakdown as ``weights_bytes`` …)
and long prose (assumptions, provenance) left to the result itself.

HTML needs nothing beyond the standard library and escapes every value and heading; frames
need pandas (the ``report`` extra).
"""

from __future__ import annotations

import datetime as dt
import html as html_lib
from collections.abc import Iterable, Mapping, Sequence
from enum import Enum
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel

from whichgpu.numbers import significant
from whichgpu.schema import (
    BenchResult,
    Breakeven,
    Comparison,
    GpuSpec,
    MemoryEstimate,
    Ranking,
    RunConfig,
    ThroughputEstimate,
    ValueTable,
)
from whichgpu.units import bytes_to_gib

if TYPE_CHECKING:
    from pandas import DataFrame

__all__ = ["frame", "html", "list_frame", "list_html", "row"]

PANDAS_MISSING = (
    "to_frame() needs pandas, which is not installed: pip install 'whichgpu[report]' "
    "(or pip install pandas)."
)

Row = dict[str, Any]

_LEFT_OUT = frozenset(
    {"assumptions", "provenance", "overheads", "run", "per_rank", "serving", "serving_speed"}
)
"""Fields a row leaves out: prose, nested records (flattened separately) and raw details."""

_HTML_COLUMNS: dict[type[BaseModel], tuple[str, ...]] = {
    MemoryEstimate: (
        "gpu_name",
        "workload",
        "mode",
        "precision",
        "gpus",
        "seq_len",
        "batch_size",
        "fits",
        "max_batch_size",
        "device_total_bytes",
        "capacity_bytes",
        "headroom_bytes",
        "method",
    ),
    ThroughputEstimate: (
        "gpu_name",
        "workload",
        "mode",
        "precision",
        "n_gpus",
        "seq_len",
        "batch_size",
        "fits",
        "throughput",
        "low",
        "high",
        "throughput_unit",
        "step_time_s",
        "mfu",
        "scaling_efficiency",
    ),
    BenchResult: (
        "id",
        "workload",
        "device_name",
        "gpu",
        "n_gpus",
        "mode",
        "precision",
        "seq_len",
        "batch_size",
        "throughput",
        "throughput_unit",
        "step_time_s",
        "peak_reserved_bytes",
        "power_w",
        "mfu",
        "created_at",
    ),
    GpuSpec: (
        "id",
        "name",
        "vendor",
        "segment",
        "architecture",
        "memory_gb",
        "memory_type",
        "memory_bandwidth_gbps",
        "fp16_tensor_tflops",
        "fp8_tensor_tflops",
        "tdp_w",
        "launch_date",
        "launch_price_usd",
    ),
}
"""The columns a list of each type shows in HTML (a frame has every column)."""

_CANDIDATE_COLUMNS = (
    "rank",
    "gpu_name",
    "count",
    "batch_size",
    "max_batch_size",
    "throughput",
    "throughput_unit",
    "throughput_source",
    "time_s",
    "cost_usd",
    "perf_per_dollar",
    "perf_per_dollar_unit",
    "reasons",
)

_VALUE_COLUMNS = (
    "gpu_name",
    "count",
    "gpu_price_usd",
    "total_usd",
    "usd_per_hour",
    "throughput",
    "throughput_unit",
    "throughput_per_kusd",
    "usd_per_million_units",
    "relative",
)


# --- rows ------------------------------------------------------------------------------------


def _scalar(value: Any) -> Any:
    """A field's value as a table cell holds it: enums by value, tuples of text joined."""
    if isinstance(value, Enum):
        return value.value
    if isinstance(value, tuple) and all(not isinstance(v, BaseModel | dict) for v in value):
        return "; ".join(str(_scalar(v)) for v in value)
    return value


def _flat(record: BaseModel, leave_out: Iterable[str] = ()) -> Row:
    """The record's plain fields in declaration order (nested records and mappings dropped)."""
    skip = _LEFT_OUT | set(leave_out)
    out: Row = {}
    for name in type(record).model_fields:
        if name in skip:
            continue
        value = getattr(record, name)
        if isinstance(value, BaseModel | dict) or (
            isinstance(value, tuple) and any(isinstance(v, BaseModel | dict) for v in value)
        ):
            continue
        out[name] = _scalar(value)
    return out


def _with_run(fields: Row, run: RunConfig, after: str = "workload") -> Row:
    """``fields`` with the run's mode and precision inserted after ``after``."""
    out: Row = {}
    for key, value in fields.items():
        out[key] = value
        if key == after:
            out["mode"] = run.mode
            out.setdefault("precision", run.precision)
    return out


def row(item: BaseModel) -> Row:
    """One result as a flat row: the columns of ``to_frame`` for it.

    Estimates and measurements gain their run's ``mode`` and ``precision``; a memory estimate
    its breakdown (``weights_bytes`` … ``overhead_bytes``) and, with ``--serving``, the
    engine's ``serving_max_concurrency``; a throughput estimate its time shares
    (``matrix_share`` …). A GPU's aliases are joined with ``; ``.
    """
    if isinstance(item, MemoryEstimate):
        out = _with_run(_flat(item), item.run)
        out.update({f"{k}_bytes": v for k, v in item.breakdown.items()})
        if item.serving is not None:
            out["serving_max_concurrency"] = item.serving.max_concurrency
        return out
    if isinstance(item, ThroughputEstimate):
        out = _with_run(_flat(item), item.run)
        out.update({f"{k}_share": v for k, v in item.time_shares.items()})
        return out
    if isinstance(item, BenchResult):
        return _with_run(_flat(item, ("notes",)), item.run)
    return _flat(item)


def _rows(obj: BaseModel) -> list[Row]:
    """The rows of one result's frame."""
    if isinstance(obj, Ranking):
        return [_flat(c) for c in obj.ranking]
    if isinstance(obj, ValueTable):
        return [_flat(r) for r in obj.rows]
    if isinstance(obj, Breakeven):
        return [_flat(p) for p in obj.curve]
    if isinstance(obj, Comparison):
        return _comparison_rows(obj)
    return [row(obj)]


def _comparison_rows(c: Comparison) -> list[Row]:
    out = []
    for r in c.rows:
        values: Row = {"quantity": r.label, "field": r.field, "unit": r.unit}
        values.update(zip(c.gpu_ids, r.values, strict=True))
        values.update({f"{g} ratio": x for g, x in zip(c.gpu_ids, r.ratios, strict=True)})
        out.append(values)
    return out


# --- frames ----------------------------------------------------------------------------------


def _pandas() -> Any:
    try:
        import pandas
    except ImportError as exc:
        raise ImportError(PANDAS_MISSING) from exc
    return pandas


def _frame(rows: Sequence[Row]) -> DataFrame:
    pd = _pandas()
    columns: dict[str, None] = {}
    for r in rows:
        columns.update(dict.fromkeys(r))
    return pd.DataFrame.from_records(list(rows), columns=list(columns))


def frame(obj: BaseModel) -> DataFrame:
    """One result as a DataFrame.

    A ranking: one row per candidate, best first. A value table: one row per GPU. A break-even:
    its cost curve (days, cloud_usd, own_usd). A comparison: one row per quantity, a column per
    GPU and one per ratio. Anything else: one row (as in a list of such results).
    """
    return _frame(_rows(obj))


def list_frame(items: Sequence[Any]) -> DataFrame:
    """A list of results as a DataFrame, one row per result."""
    return _frame([row(i) for i in items])


# --- HTML ------------------------------------------------------------------------------------


def _text(value: Any, column: str = "") -> str:
    """A cell as text: bytes as GiB, numbers rounded for reading, unknowns as a dash."""
    if value is None:
        return "—"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int) and column.endswith("_bytes"):
        return f"{bytes_to_gib(value):,.2f} GiB"
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        if column.endswith("_share") or column in ("mfu", "scaling_efficiency", "utilization"):
            return f"{value:.1%}"
        return significant(value)
    if isinstance(value, dt.datetime):
        return value.strftime("%Y-%m-%d %H:%M")
    if isinstance(value, dt.date):
        return value.isoformat()
    return str(_scalar(value))


def _esc(text: str) -> str:
    return html_lib.escape(text, quote=True)


def _table(rows: Sequence[Mapping[str, Any]], columns: Sequence[str]) -> str:
    head = "".join(f"<th>{_esc(c)}</th>" for c in columns)
    body = "".join(
        "<tr>" + "".join(f"<td>{_esc(_text(r.get(c), c))}</td>" for c in columns) + "</tr>"
        for r in rows
    )
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _fields(fields: Row, columns: Sequence[str] | None = None) -> str:
    """One record as a two-column table (field, value)."""
    keys = [c for c in columns if c in fields] if columns else list(fields)
    body = "".join(f"<tr><th>{_esc(k)}</th><td>{_esc(_text(fields[k], k))}</td></tr>" for k in keys)
    return f"<table><tbody>{body}</tbody></table>"


def _notes(title: str, lines: Iterable[str]) -> str:
    items = "".join(f"<li>{_esc(line)}</li>" for line in lines)
    return f"<details><summary>{_esc(title)}</summary><ul>{items}</ul></details>" if items else ""


def _block(title: str, *parts: str) -> str:
    return f'<div class="whichgpu"><p><strong>{_esc(title)}</strong></p>{"".join(parts)}</div>'


def _columns_for(items: Sequence[Any], rows: Sequence[Row]) -> list[str]:
    wanted = _HTML_COLUMNS.get(type(items[0]))
    present: dict[str, None] = {}
    for r in rows:
        present.update(dict.fromkeys(r))
    if wanted is None:
        return list(present)
    return [c for c in wanted if c in present]


def list_html(items: Sequence[Any]) -> str:
    """A list of results as one HTML table (a few headline columns per type)."""
    if not items:
        return _block("No results")
    rows = [row(i) for i in items]
    noun = type(items[0]).__name__
    title = f"{len(items)} × {noun}"
    return _block(title, _table(rows, _columns_for(items, rows)))


def html(obj: BaseModel) -> str:
    """One result as HTML: its headline figures, its rows where it has some, and its
    assumptions (folded)."""
    if isinstance(obj, Ranking):
        return _ranking_html(obj)
    if isinstance(obj, ValueTable):
        return _block(
            f"Performance per dollar ({obj.price_kind}), relative to {obj.reference}",
            _table([_flat(r) for r in obj.rows], _VALUE_COLUMNS),
            _notes("Left out", obj.skipped),
            _notes("Assumptions", obj.assumptions),
        )
    if isinstance(obj, Comparison):
        return _comparison_html(obj)
    if isinstance(obj, MemoryEstimate):
        title = f"{obj.workload} on {obj.gpu_name}: " + (
            f"fits at batch {obj.batch_size}" if obj.fits else f"does not fit at {obj.batch_size}"
        )
        return _block(
            title,
            _fields(row(obj), _HTML_COLUMNS[MemoryEstimate]),
            _breakdown_html(obj),
            _notes("Assumptions", obj.assumptions),
        )
    if isinstance(obj, ThroughputEstimate):
        return _block(
            f"{obj.workload} on {obj.n_gpus} × {obj.gpu_name}"
            if obj.n_gpus > 1
            else f"{obj.workload} on {obj.gpu_name}",
            _fields(row(obj), _HTML_COLUMNS[ThroughputEstimate]),
            _notes("Assumptions", obj.assumptions),
        )
    if isinstance(obj, BenchResult):
        return _block(
            f"{obj.workload} measured on {obj.device_name}",
            _fields(row(obj), _HTML_COLUMNS[BenchResult]),
            _notes("Notes", obj.notes),
        )
    if isinstance(obj, Breakeven):
        fields = {k: v for k, v in _flat(obj).items() if k != "curve"}
        return _block(
            "Renting against owning",
            _fields(fields),
            _notes("Where the inputs come from", (f"{k}: {v}" for k, v in obj.inputs.items())),
            _notes("Assumptions", obj.assumptions),
        )
    if isinstance(obj, GpuSpec):
        fields = {k: v for k, v in _flat(obj).items() if v not in (None, "")}
        return _block(obj.name, _fields(fields))
    return _block(type(obj).__name__, _fields(_flat(obj)))


def _breakdown_html(e: MemoryEstimate) -> str:
    rows = [{"category": k, "peak_bytes": v} for k, v in e.breakdown.items()]
    return _table(rows, ("category", "peak_bytes"))


def _ranking_html(r: Ranking) -> str:
    excluded = [_flat(x) for x in r.excluded]
    return _block(
        f"{r.workload}: {r.mode}, ranked by {r.metric}",
        f"<p>{_esc(r.answer)}</p>",
        _table([_flat(c) for c in r.ranking], _CANDIDATE_COLUMNS),
        _notes("Too close to call", r.closeness),
        f"<details><summary>Left out ({len(excluded)})</summary>"
        + _table(excluded, ("gpu_name", "count", "kind", "reason"))
        + "</details>"
        if excluded
        else "",
        _notes("Assumptions", r.assumptions),
    )


def _comparison_html(c: Comparison) -> str:
    rows = []
    for r in c.rows:
        cells: Row = {"quantity": r.label, "unit": r.unit}
        for i, (name, value) in enumerate(zip(c.names, r.values, strict=True)):
            ratio = r.ratios[i]
            text = _text(value)
            cells[name] = text if i == 0 or ratio is None else f"{text} (×{ratio:.2f})"
        rows.append(cells)
    return _block(
        f"{' vs '.join(c.names)} (ratios to {c.names[0]})",
        _table(rows, ("quantity", "unit", *c.names)),
        _notes("Prices used", (f"{n}: {p}" for n, p in zip(c.names, c.price_notes, strict=True))),
    )

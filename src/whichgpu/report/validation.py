"""Terminal views of the references ``whichgpu validate`` compares beyond Lambda's table and
whichgpu's own measurements: runs measured on GPUs outside whichgpu's harness (the H200
measurements), published multi-GPU runs (llm-foundry), and the closing summary per reference.
``report.terminal``'s validation views append them."""

from __future__ import annotations

from collections.abc import Sequence

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from whichgpu.numbers import significant
from whichgpu.schema import (
    FsdpFitCase,
    ReferenceMemoryCase,
    ReferenceThroughputCase,
    RunConfig,
    SourceSummary,
)
from whichgpu.units import bytes_to_gib
from whichgpu.validate.summary import SOURCE_SETTINGS, SOURCE_TITLES


def _run(run: RunConfig) -> str:
    """A run in a few characters: ``bf16 b8 L1024 ckpt``, ``8x fsdp`` on several GPUs."""
    text = run.precision + (f" b{run.batch_size}" if run.batch_size is not None else "")
    text += f" L{run.seq_len}" if run.seq_len else ""
    if run.checkpointing:
        policy = run.checkpointing_policy
        text += " ckpt" if policy == "full" else f" ckpt {policy}"
    text += " compiled" if run.compile else ""
    text += f" {run.gpus}x {run.sharding}" if run.gpus > 1 else ""
    return text


def _error(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{value:+.{digits}%}"


def gpu_runs_memory_view(cases: Sequence[ReferenceMemoryCase]) -> RenderableType:
    """Peaks and largest batches measured outside whichgpu's harness against ``fit``."""
    title = SOURCE_TITLES[cases[0].source] if cases else ""
    peaks = Table(
        header_style="bold", title=f"Peak memory: {title}, against fit", title_justify="left"
    )
    for column in (
        "case",
        "GPU",
        "reserved GiB (measured / fit)",
        "error",
        "allocated GiB (measured / fit)",
        "error",
        "device GiB (NVML / fit)",
    ):
        peaks.add_column(column, justify="left" if column in ("case", "GPU") else "right")
    peaks.add_column("note")
    largest = Table(
        header_style="bold", title=f"Largest batch: {title}, against fit", title_justify="left"
    )
    for column in ("case", "GPU", "measured", "fit", "error"):
        largest.add_column(column, justify="left" if column in ("case", "GPU") else "right")
    largest.add_column("verdict")

    def pair(measured: int | None, predicted: int | None) -> str:
        if measured is None or predicted is None:
            return "-"
        return f"{bytes_to_gib(measured):.2f} / {bytes_to_gib(predicted):.2f}"

    for c in cases:
        if c.measured_max_batch is not None:
            predicted = c.predicted_max_batch
            verdict = (
                "[bold red]would run out of memory[/bold red]"
                if c.would_oom
                else ("[green]exact[/green]" if predicted == c.measured_max_batch else "below")
            )
            largest.add_row(
                c.case,
                c.gpu,
                str(c.measured_max_batch),
                "-" if predicted is None else str(predicted),
                "-" if predicted is None else _error(predicted / c.measured_max_batch - 1),
                verdict if predicted is not None else c.note,
            )
            continue
        allocated_error = (
            c.predicted_allocated_bytes / c.measured_allocated_bytes - 1
            if c.measured_allocated_bytes and c.predicted_allocated_bytes is not None
            else None
        )
        peaks.add_row(
            c.case,
            c.gpu,
            pair(c.measured_reserved_bytes, c.predicted_reserved_bytes),
            _error(c.reserved_error),
            pair(c.measured_allocated_bytes, c.predicted_allocated_bytes),
            _error(allocated_error),
            pair(c.measured_device_bytes, c.predicted_device_bytes),
            c.note,
        )
    searched = [largest] if largest.row_count else []
    return Group(peaks, *searched, _settings(cases[0].source if cases else None))


def _settings(source: str | None) -> RenderableType:
    """The line saying how ``source`` is read."""
    text = SOURCE_SETTINGS.get(source, "") if source else ""  # type: ignore[call-overload]
    return Text(f"Settings: {text}." if text else "", style="dim")


def fsdp_runs_view(cases: Sequence[FsdpFitCase]) -> RenderableType:
    """Published multi-GPU runs: does ``fit`` let their micro-batch fit?"""
    title = SOURCE_TITLES[cases[0].source] if cases else ""
    table = Table(
        header_style="bold",
        title=f"Does fit let a run that ran fit? {title}",
        title_justify="left",
    )
    for column in ("model", "GPU", "run (per GPU)", "fit says", "fit's largest", "device / cap"):
        table.add_column(column, justify="right" if "largest" in column else "left")
    for c in cases:
        if c.fits is None:
            says = f"- ({c.note})"
        elif c.fits:
            says = "[green]fits[/green]"
        else:
            says = "[bold red]does not fit[/bold red]"
        used = (
            f"{bytes_to_gib(c.predicted_device_bytes):.1f} / {bytes_to_gib(c.capacity_bytes):.1f}"
            " GiB"
            if c.predicted_device_bytes is not None and c.capacity_bytes is not None
            else "-"
        )
        table.add_row(
            c.model,
            c.gpu,
            _run(c.run),
            says,
            "-" if c.predicted_max_batch is None else str(c.predicted_max_batch),
            used,
        )
    return Group(table, _settings(cases[0].source if cases else None))


def reference_throughput_view(cases: Sequence[ReferenceThroughputCase]) -> RenderableType:
    """Speeds measured or published outside whichgpu's harness against ``predict``, a table
    per reference."""
    parts: list[RenderableType] = []
    groups = dict.fromkeys((c.source, c.quantity) for c in cases)
    for source, quantity in groups:
        mine = [c for c in cases if c.source == source and c.quantity == quantity]
        several = sum(s == source for s, _ in groups) > 1
        table = Table(
            header_style="bold",
            title=f"Speed: {SOURCE_TITLES[source]}"
            + (f", {quantity}" if several else "")
            + ", against predict",
            title_justify="left",
        )
        for column in ("case", "GPU", f"measured {quantity}", "predicted", "error", "MFU"):
            table.add_column(column, justify="left" if column in ("case", "GPU") else "right")
        table.add_column("note")
        for c in mine:
            mfu = " / ".join(
                f"{m:.0%}" if m is not None else "-" for m in (c.measured_mfu, c.predicted_mfu)
            )
            table.add_row(
                c.case,
                c.gpu,
                significant(c.measured, 4, trim=True),
                significant(c.predicted, 4),
                _error(c.error),
                mfu
                if c.measured_mfu is not None
                else (f"- / {c.predicted_mfu:.0%}" if c.predicted_mfu is not None else "-"),
                c.note,
            )
        last = [q for s, q in groups if s == source][-1] == quantity
        parts.extend((table, _settings(source)) if last else (table,))
    if parts:
        parts.append(
            Text(
                "error: predicted speed / measured - 1 (for times: step, TPOT, TTFT, measured / "
                "predicted - 1): positive means predicted faster; MFU: stated / predicted.",
                style="dim",
            )
        )
    return Group(*parts)


def source_summary_view(summaries: Sequence[SourceSummary]) -> RenderableType:
    """The closing summary: a row per reference and quantity."""
    table = Table(header_style="bold", title="Summary per reference", title_justify="left")
    for column in ("reference", "quantity", "cases", "mean |error|", "bias", "worst"):
        table.add_column(column, justify="left" if column in ("reference", "quantity") else "right")
    table.add_column("note")
    for s in summaries:
        table.add_row(
            s.source,
            s.quantity,
            str(s.cases),
            "-" if s.mean_abs_error is None else f"{s.mean_abs_error:.1%}",
            _error(s.mean_error),
            _error(s.worst_error),
            s.note,
        )
    return Group(
        table,
        Text(
            "Errors are predicted / measured - 1 (speeds: positive = predicted faster; memory: "
            "positive = predicted larger); bias is their mean.",
            style="dim",
        ),
    )

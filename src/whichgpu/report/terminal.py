"""Terminal renderings (rich) of catalog listings, spec sheets and comparisons.

Over 600 lines because it holds the terminal views of many commands (catalog, workloads,
profile, fit, predict, validate); it splits by domain with the report package's split.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from whichgpu.numbers import count_si, significant
from whichgpu.report.layout import Column, FittedTable
from whichgpu.report.validation import (
    fsdp_runs_view,
    gpu_runs_memory_view,
    reference_throughput_view,
    source_summary_view,
)
from whichgpu.schema import (
    GENERATED_RATE_NOTE,
    SPEC_FIELDS,
    Comparison,
    GpuSpec,
    MeasuredMemoryCase,
    MemoryEstimate,
    MemoryValidation,
    Price,
    ProfileSummary,
    Source,
    ThroughputEstimate,
    ThroughputValidation,
    WorkloadInfo,
    too_close_to_rank,
)
from whichgpu.units import bytes_to_gib

if TYPE_CHECKING:
    from whichgpu.estimate.closed_form import CrossCheckRow

_FIELD_LABELS = {
    "memory_gb": ("Memory", "GB"),
    "memory_usable_mib": ("Usable memory (driver)", "MiB"),
    "memory_cuda_total_mib": ("CUDA total memory", "MiB"),
    "memory_bus_width_bits": ("Memory bus", "bit"),
    "memory_data_rate_gbps": ("Memory data rate", "Gbit/s/pin"),
    "memory_bandwidth_gbps": ("Memory bandwidth", "GB/s"),
    "sm_count": ("SMs / CUs", ""),
    "boost_clock_mhz": ("Boost clock", "MHz"),
    "l2_cache_mib": ("L2 cache", "MiB"),
    "shared_memory_per_sm_kib": ("Shared memory per SM", "KiB"),
    "fp64_tflops": ("FP64 vector", "TFLOPS"),
    "fp32_tflops": ("FP32 vector", "TFLOPS"),
    "fp16_tflops": ("FP16 vector", "TFLOPS"),
    "tf32_tensor_tflops": ("TF32 tensor", "TFLOPS"),
    "fp16_tensor_tflops": ("FP16 tensor, FP32 acc. (AMP)", "TFLOPS"),
    "fp16_acc16_tensor_tflops": ("FP16 tensor, FP16 acc.", "TFLOPS"),
    "bf16_tensor_tflops": ("BF16 tensor", "TFLOPS"),
    "fp8_tensor_tflops": ("FP8 tensor", "TFLOPS"),
    "fp4_tensor_tflops": ("FP4 tensor", "TFLOPS"),
    "int8_tensor_tops": ("INT8 tensor", "TOPS"),
    "sparse_fp16_tensor_tflops": ("FP16 tensor with sparsity", "TFLOPS"),
    "sustained_tensor_tflops": ("16-bit tensor, sustained (measured)", "TFLOPS"),
    "tdp_w": ("Board power", "W"),
    "interconnect_bandwidth_gbps": ("GPU link bandwidth", "GB/s"),
    "launch_price_usd": ("Launch price", "USD"),
}


def _label(field: str) -> tuple[str, str]:
    return _FIELD_LABELS.get(field, (field.replace("_", " ").capitalize(), ""))


def fmt(value: Any) -> str:
    """A value as a short, readable string ('—' for unknown)."""
    if value is None:
        return "—"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        if value >= 100:
            return f"{value:,.0f}"
        if value >= 10:
            return f"{value:.1f}".rstrip("0").rstrip(".")
        return significant(value, trim=True)  # 6, not 6.00, beside 72 and 96
    if hasattr(value, "value"):
        return str(value.value)
    return str(value)


def gpu_table(specs: Iterable[GpuSpec], title: str) -> FittedTable:
    """The buyer's scan table of ``whichgpu gpus``; on a narrow terminal the names and the
    figures a first scan needs least are left out before any number is cut."""
    columns = [
        Column("id", style="cyan", no_wrap=True),
        Column("name", drop_order=8),
        Column("arch", drop_order=7),
        Column("launch", "right", drop_order=6),
        Column("memory\nGB", "right", no_wrap=True),
        Column("bandwidth\nGB/s", "right", no_wrap=True),
        Column("AMP\nTFLOPS", "right", no_wrap=True),
        Column("FP8\nTFLOPS", "right", no_wrap=True, drop_order=5),
        Column("FP32\nTFLOPS", "right", no_wrap=True, drop_order=2),
        Column("power\nW", "right", no_wrap=True, drop_order=4),
        Column("launch\nUSD", "right", no_wrap=True, drop_order=3),
    ]
    rows = [
        (
            s.id,
            s.name,
            s.architecture or "—",
            str(s.launch_date.year) if s.launch_date else "—",
            fmt(s.memory_gb),
            fmt(s.memory_bandwidth_gbps),
            fmt(s.amp_tensor_tflops),
            fmt(s.fp8_tensor_tflops),
            fmt(s.fp32_tflops),
            fmt(s.tdp_w),
            fmt(s.launch_price_usd),
        )
        for s in specs
    ]
    return FittedTable(columns, rows, title=title)


def gpu_sheet(
    spec: GpuSpec, prices: Iterable[Price], sources: Mapping[str, Source]
) -> RenderableType:
    """``whichgpu show``: every field with its source, then aliases, prices and notes."""
    head = Text.assemble(
        (spec.name, "bold"), f"  ({spec.id}, {spec.vendor.value}, {spec.segment.value})"
    )
    specs = Table(header_style="bold", show_lines=False)
    specs.add_column("field")
    specs.add_column("value", justify="right")
    specs.add_column("unit")
    specs.add_column("confidence")
    specs.add_column("source")
    cited: dict[str, Source] = {}
    for field in SPEC_FIELDS:
        value = getattr(spec, field)
        if value is None:
            continue
        prov = spec.provenance[field]
        cited[prov.source] = sources[prov.source]
        label, unit = _label(field)
        detail = prov.source
        if prov.method:
            detail += f" — {prov.method}"
        if prov.note:
            detail += f" — {prov.note}"
        specs.add_row(label, fmt(value), unit, prov.confidence.value, detail)
    price_table = Table(title="Prices", title_justify="left", header_style="bold")
    columns = ("kind", "USD", "per", "GPUs/machine", "provider", "region", "as of")
    for col in (*columns, "source / note"):
        price_table.add_column(col, justify="right" if col == "USD" else "left")
    for p in prices:
        detail = p.source + (f" — {p.note}" if p.note else "") + (" (your file)" if p.user else "")
        sizes = " ".join(str(n) for n in p.instance_gpus) if p.instance_gpus else "—"
        price_table.add_row(
            p.kind,
            f"{p.usd:,.2f}",
            p.per,
            sizes if p.kind.startswith("cloud") else "",
            p.provider or "—",
            p.region or "—",
            str(p.as_of),
            detail,
        )
        if p.source in sources:
            cited[p.source] = sources[p.source]
    src_table = Table(title="Sources", title_justify="left", header_style="bold")
    src_table.add_column("key", style="cyan")
    src_table.add_column("document")
    for key, src in sorted(cited.items()):
        src_table.add_row(key, f"{src.title} ({src.publisher}, {src.kind.value})\n{src.url}")
    parts: list[RenderableType] = [head, specs]
    if spec.aliases:
        parts.append(Text("Also answers to: " + ", ".join(spec.aliases)))
    if spec.notes:
        parts.append(Text("Notes: " + spec.notes))
    parts.append(price_table if price_table.row_count else Text("Prices: none in the catalog."))
    parts.append(src_table)
    return Group(*parts)


def comparison_table(comparison: Comparison) -> RenderableType:
    """``whichgpu compare``: values, with ratios to the first GPU in brackets."""
    table = Table(
        title=f"Relative to {comparison.names[0]} (ratio in brackets)",
        title_justify="left",
        header_style="bold",
    )
    table.add_column("")
    table.add_column("unit")
    for name in comparison.names:
        table.add_column(name, justify="right")
    for row in comparison.rows:
        cells = []
        for i, (v, r) in enumerate(zip(row.values, row.ratios, strict=True)):
            cell = fmt(v)
            if i > 0 and r is not None:
                better = (r > 1) == row.higher_is_better and abs(r - 1) > 0.005
                style = "green" if better else ("red" if abs(r - 1) > 0.005 else "")
                cell += f" [{style}]({r:.2f}x)[/{style}]" if style else f" ({r:.2f}x)"
            cells.append(cell)
        table.add_row(row.label, row.unit, *cells)
    notes = Text(
        "Prices used: "
        + "; ".join(
            f"{n}: {p}" for n, p in zip(comparison.names, comparison.price_notes, strict=True)
        )
    )
    parts: list[RenderableType] = [table, notes]
    if comparison.cloud_notes:
        clouds = zip(comparison.names, comparison.cloud_notes, strict=True)
        parts.append(Text("Cloud rates: " + "; ".join(f"{n}: {c}" for n, c in clouds)))
    return Group(*parts)


def workload_table(infos: Iterable[WorkloadInfo]) -> Table:
    """``whichgpu workloads``."""
    table = Table(title="Named workloads", title_justify="left", header_style="bold")
    for col in ("name", "family", "task", "params", "default input", "unit"):
        table.add_column(col, justify="right" if col == "params" else "left")
    for info in infos:
        default = f"batch {info.default_batch_size}"
        if info.default_seq_len:
            default += f" x {info.default_seq_len} tokens"
        else:
            default += f" x {info.input_desc}"
        params = count_si(info.params_published) if info.params_published else "—"
        table.add_row(info.name, info.family, info.task, params, default, info.throughput_unit)
    return table


def profile_view(summary: ProfileSummary) -> RenderableType:
    """``whichgpu profile``."""
    seq = f", seq {summary.seq_len}" if summary.seq_len else ""
    head = Text.assemble((summary.workload, "bold"), f"  batch {summary.batch_size}{seq}")
    facts = Table(show_header=False, box=None)
    facts.add_column(style="bold")
    facts.add_column(justify="right")
    facts.add_row(
        "parameters", f"{summary.params_total:,} ({summary.params_trainable:,} trainable)"
    )
    facts.add_row("FLOPs per step", count_si(summary.flops_per_step))
    facts.add_row(
        "FLOPs per sample",
        f"{count_si(summary.flops_per_sample)} "
        f"(forward {count_si(summary.forward_flops_per_sample)})",
    )
    facts.add_row("bytes moved per step", count_si(summary.bytes_per_step) + "B")
    facts.add_row(f"{summary.throughput_unit} per step", f"{summary.units_per_step:,}")
    facts.add_row("peak live tensors", f"{bytes_to_gib(summary.peak_live_bytes):.2f} GiB")
    facts.add_row("trace time", f"{summary.trace_seconds:.1f} s")
    mix = Table(title="Operator mix", title_justify="left", header_style="bold")
    for col in ("kind", "ops", "FLOPs share", "bytes share"):
        mix.add_column(col, justify="left" if col == "kind" else "right")
    for kind, row in summary.op_mix.items():
        mix.add_row(
            kind, f"{row['count']:.0f}", f"{row['flops_share']:.1%}", f"{row['bytes_share']:.1%}"
        )
    live = Table(
        title="Live tensors at the peak",
        caption="exact sizes, before allocator rounding",
        title_justify="left",
        header_style="bold",
    )
    live.add_column("category")
    live.add_column("GiB", justify="right")
    for category, size in sorted(summary.peak_live_by_category.items(), key=lambda kv: -kv[1]):
        live.add_row(category, f"{bytes_to_gib(size):.3f}")
    choices = Text("Kernel choices: " + "; ".join(f"{k}: {v}" for k, v in summary.choices.items()))
    return Group(head, facts, mix, live, choices)


def _gib(nbytes: int | None) -> str:
    return "-" if nbytes is None else f"{bytes_to_gib(nbytes):.2f}"


def fit_view(estimates: Sequence[MemoryEstimate]) -> RenderableType:
    """``whichgpu fit``: one row per GPU, then the breakdown and assumptions of the first."""
    if not estimates:
        return Text("No GPU to estimate.")
    first = estimates[0]
    given = first.batch_given
    serving = first.kv_cache_bytes is not None  # inference of a language model
    unit = "concurrency" if serving else "batch"
    what = first.run.describe(first.seq_len)
    if serving:
        what = (
            f"inference, {first.run.precision}"
            + (", compiled decoding" if first.run.compile else "")
            + f", context {first.seq_len} + {first.run.new_tokens} new tokens per sequence"
        )
    if first.gpus > 1:
        what += f"  (per GPU, {first.gpus} GPUs, {first.run.parallelism()})"
    head = Text.assemble((first.workload, "bold"), f"  {what}")
    if first.method.startswith("closed form"):
        head.append("  from the closed form (no trace; errs high)", style="yellow")
    table = Table(header_style="bold", title_justify="left")
    table.add_column("GPU")
    table.add_column("capacity GiB", justify="right")
    # fit --serving: the engine's KV cache decides what fits (estimate.serving.engine_verdict)
    engine = next((e.serving.engine for e in estimates if e.serving is not None), None)
    by = f" ({engine})" if engine else ""
    table.add_column(f"max {unit}{by}", justify="right")
    table.add_column(unit, justify="right")
    if serving:
        table.add_column("KV cache GiB", justify="right")
    table.add_column(f"fits{by}", justify="center")
    table.add_column("device GiB", justify="right")
    table.add_column("reserved GiB", justify="right")
    table.add_column("headroom GiB", justify="right")
    table.add_column("GiB at max+1", justify="right")
    with_seq = any(e.max_seq_len is not None for e in estimates)
    length = "context" if serving else "seq len"
    if with_seq:
        table.add_column(f"max {length}", justify="right")
    for e in estimates:
        max_batch = f"{e.max_batch_size}{'+' if e.max_batch_capped else ''}"
        max_seq = [] if not with_seq else [_max_seq(e)]
        kv = [_gib(e.kv_cache_bytes)] if serving else []
        table.add_row(
            e.gpu_name,
            _gib(e.capacity_bytes),
            max_batch if e.max_batch_size else "[red]0[/red]",
            str(e.batch_size),
            *kv,
            "[green]yes[/green]" if e.fits else "[red]no[/red]",
            _gib(e.device_total_bytes),
            _gib(e.peak_reserved_bytes),
            _gib(e.headroom_bytes),
            _gib(e.next_batch_device_total_bytes),
            *max_seq,
        )
    parts: list[RenderableType] = [head, table]
    if any(e.serving is not None for e in estimates):
        parts.append(_serving_table(estimates))
    shown = estimates[0]
    breakdown = Table(
        title=f"Where the memory goes on {shown.gpu_name} at {unit} {shown.batch_size}",
        title_justify="left",
        header_style="bold",
    )
    breakdown.add_column("category")
    breakdown.add_column("GiB", justify="right")
    breakdown.add_column("share", justify="right")
    for category, nbytes in shown.breakdown.items():
        share = nbytes / shown.device_total_bytes if shown.device_total_bytes else 0.0
        breakdown.add_row(category, f"{bytes_to_gib(nbytes):.3f}", f"{share:.1%}")
    parts.append(breakdown)
    overhead = ", ".join(
        f"{k.replace('_', ' ')} {bytes_to_gib(v):.2f}" for k, v in shown.overheads.items()
    )
    parts.append(Text(f"Overhead (GiB): {overhead}"))
    notes = [f"method: {shown.method}", *shown.assumptions]
    if not given:
        notes.append(f"{unit} = the largest that fits")
    if shown.serving is not None:  # fits and max are the engine's (estimate.serving)
        notes.append(
            f"'GiB at max+1' is plain PyTorch generation's device total at its own largest "
            f"{unit} plus one"
        )
    else:
        notes.append(
            f"'GiB at max+1' is the device total at the largest {unit} plus one, the first "
            "size that does not fit"
        )
    if serving:
        notes.append(
            f"KV cache = {shown.kv_bytes_per_token:,} B per token x (context + new tokens) x "
            "concurrency (part of 'activations')"
            + (", on each GPU its share of the KV heads" if shown.gpus > 1 else "")
        )
    derived = [e for e in estimates if e.capacity_note.startswith("derived")]
    if derived:
        named = ", ".join(e.gpu_name for e in derived[:NAMES_IN_NOTE])
        more = f" and {len(derived) - NAMES_IN_NOTE} more" if len(derived) > NAMES_IN_NOTE else ""
        notes.append(
            f"capacity of {named}{more}: no measured CUDA total in the catalog, so the "
            "marketed size less the largest gap measured on GPUs like it (see --json "
            "capacity_note)"
            if len(derived) > 1
            else f"capacity of {named}: {derived[0].capacity_note}"
        )
    if with_seq:
        notes.append(
            f"max {length} = the longest {'context' if serving else 'sequence'} that fits at "
            f"this {unit} ('+': the model's position limit, not memory, stops it)"
        )
    shorter = [e for e in estimates if e.fits_at_seq_len]
    if shorter:
        noun = "context" if first.run.mode == "inference" else "sequence length"
        listed = ", ".join(
            f"{e.gpu_name} {e.fits_at_seq_len:,}" for e in shorter[:NAMES_IN_NOTE]
        ) + (f" and {len(shorter) - NAMES_IN_NOTE} more" if len(shorter) > NAMES_IN_NOTE else "")
        parts.append(
            Text(
                f"Where one sequence of {first.seq_len:,} does not fit, the longest {noun} "
                f"of 64, 96, 128, 192, 256, … at which {unit} 1 fits: {listed} (--json: "
                "fits_at_seq_len)."
            )
        )
    parts.append(Text("Assumptions: " + "; ".join(notes) + ".", style="dim"))
    if not any(e.fits for e in estimates):
        levers = _inference_levers(first) if serving else _training_levers(first)
        if levers:
            parts.insert(
                2, Text("Nothing fits as asked. To need less memory, try: " + "; ".join(levers))
            )
    return Group(*parts)


def _training_levers(first: MemoryEstimate) -> list[str]:
    """What would make a training step (or a model that does not generate) need less memory:
    the run's unused options, and more GPUs that shard the model state."""
    levers = [
        lever
        for lever in first.run.memory_levers()
        if first.batch_given or not lever.startswith("no --batch-size")
    ]
    if first.gpus == 1 and first.run.mode == "train":
        levers.append("--gpus N --sharding zero3 (each GPU holds 1/N of the model state)")
    passes = first.breakdown.get("activations", 0) + first.breakdown.get("temporaries", 0)
    if (
        first.run.mode == "train"
        and first.seq_len is not None
        and first.run.context_parallel == 1
        and passes > first.device_total_bytes / 2
    ):  # the sequence's activations, not the model state, are most of it
        levers.append(
            "--context-parallel C with --gpus C or more (each GPU holds 1/C of every "
            "sequence's activations)"
        )
    experts = first.experts_per_layer
    if (
        experts
        and first.run.mode == "train"
        and first.run.expert_parallel == 1
        and first.run.sharding in ("ddp", "zero1", "zero2")
    ):  # every GPU holds every expert's weights whole (most of a mixture of experts)
        levers.append(
            f"--expert-parallel E with --gpus a multiple of E (E dividing the {experts} "
            "experts a layer: each GPU holds 1/E of them)"
        )
    return levers


def _inference_levers(first: MemoryEstimate) -> list[str]:
    """What would make a language model's inference need less memory, with the figures of
    ``first`` (the GPU that holds the most): a lower --concurrency (the most that fit), a
    shorter --context (the longest at this concurrency), fewer --new-tokens, more GPUs."""
    levers: list[str] = []
    on = f"on {first.gpu_name}"
    if first.batch_given and first.batch_size > 1:
        levers.append(
            f"--concurrency {first.max_batch_size} or fewer (the most that fit at context "
            f"{first.seq_len:,} {on})"
            if first.max_batch_size
            else "--concurrency 1"
        )
    if first.max_seq_len:
        levers.append(
            f"--context {first.max_seq_len:,} or shorter (the longest at concurrency "
            f"{first.batch_size} {on})"
        )
    elif first.fits_at_seq_len:
        levers.append(f"--context {first.fits_at_seq_len:,} or shorter (one sequence fits {on})")
    else:
        levers.append("a shorter --context")
    levers.append(
        f"fewer --new-tokens than {first.run.new_tokens} (each sequence's KV cache holds "
        "context + new tokens)"
    )
    levers.append(
        ("--gpus N" if first.gpus == 1 else f"more --gpus than {first.gpus}")
        + " (tensor parallel: each GPU holds 1/N of the weights and its share of the KV cache)"
    )
    return levers


_KV_BUDGET = {
    "total": "{f} x capacity - weights - activation peak - non-torch",
    "free": "{f} x (capacity - weights - activation peak - non-torch)",
    "static": "{f} x (capacity - non-torch) - weights (the rest kept for activations and "
    "CUDA graphs)",
}
"""The KV budget of each kind of memory fraction, in words (``{f}``: the fraction)."""


def _serving_table(estimates: Sequence[MemoryEstimate]) -> RenderableType:
    """``fit --serving``: the engine's KV-cache budget, term by term, per GPU."""
    first = next(e.serving for e in estimates if e.serving is not None)
    fractions = {e.serving.gpu_memory_utilization for e in estimates if e.serving is not None}
    fraction = (
        f"{first.gpu_memory_utilization:g}" if len(fractions) == 1 else "fraction (each GPU's)"
    )
    table = Table(
        title=(
            f"Serving engine: {first.engine_label}: KV budget = "
            + _KV_BUDGET[first.memory_fraction_of].format(f=fraction)
            + f"; blocks of {first.block_size_tokens} "
            + ("token" if first.block_size_tokens == 1 else "tokens")
            + ", "
            f"{first.tokens_per_sequence} tokens per sequence"
            + (f"; per GPU of {first.gpus}, tensor parallel" if first.gpus > 1 else "")
        ),
        title_justify="left",
        header_style="bold",
    )
    for col in (
        "GPU",
        "fraction",
        "engine GiB",
        "weights GiB",
        "activation GiB",
        "non-torch GiB",
        "KV budget GiB",
        "KV blocks",
        "max concurrency",
    ):
        table.add_column(col, justify="left" if col == "GPU" else "right")
    for e in estimates:
        v = e.serving
        if v is None:
            continue
        table.add_row(
            e.gpu_name,
            f"{v.gpu_memory_utilization:g}",
            _gib(v.engine_budget_bytes),
            _gib(v.weights_bytes),
            "—" if v.memory_fraction_of == "static" else _gib(v.activation_peak_bytes),
            _gib(v.non_torch_bytes),
            _gib(v.kv_cache_budget_bytes),
            f"{v.kv_blocks:,}",
            str(v.max_concurrency) if v.max_concurrency else "[red]0[/red]",
        )
    notes = "; ".join(first.assumptions)
    return Group(table, Text(f"Serving assumptions: {notes}.", style="dim"))


def _max_seq(estimate: MemoryEstimate) -> str:
    """The largest sequence at the batch: ``+`` when the model's position limit stopped it."""
    if estimate.max_seq_len is None:
        return "—"
    if estimate.max_seq_len == 0:
        return "[red]0[/red]"
    return f"{estimate.max_seq_len:,}{'+' if estimate.max_seq_len_capped else ''}"


NAMES_IN_NOTE = 4
"""GPUs named in a note before "and N more"."""
_VERDICT_STYLE = {"exact": "green", "conservative": "yellow", "too high": "bold red"}


def memory_validation_view(validation: MemoryValidation) -> RenderableType:
    """``whichgpu validate memory``: a row per case, then the summary."""
    table = Table(
        header_style="bold", title="Largest batch: predicted vs measured", title_justify="left"
    )
    columns = ("model", "framework", "GPU", "unit", "measured", "predicted", "on grid", "steps")
    for col in (*columns, "verdict"):
        table.add_column(
            col, justify="right" if col in ("measured", "predicted", "on grid", "steps") else "left"
        )
    for c in validation.cases:
        style = _VERDICT_STYLE.get(c.verdict, "dim")
        table.add_row(
            c.model,
            c.framework.split(" (")[0] + (", batches by hand" if c.batches_set_by_hand else ""),
            c.gpu,
            c.unit,
            str(c.measured_max_batch),
            str(c.predicted_max_batch) if c.verdict != "skipped" else "-",
            str(c.predicted_on_grid) if c.verdict != "skipped" else "-",
            f"{c.steps:+d}" if c.verdict != "skipped" else "-",
            f"[{style}]{c.verdict}[/{style}]" + (f" ({c.note})" if c.note else ""),
        )
    n = validation.compared or 1
    ok = validation.exact + validation.conservative_by_one
    summary = Text(
        f"{validation.compared} cases compared: {validation.exact} exact, "
        f"{validation.conservative_by_one} one step conservative, "
        f"{validation.conservative_more} more than one step conservative, "
        f"{validation.too_high} too high ({validation.too_high_evidenced} where the reference "
        "can show it: PyTorch code with searched batches, or a model it could not run). "
        f"Exact or one step conservative: {ok / n:.0%}.",
        style="bold",
    )
    notes = Text("Assumptions: " + "; ".join(validation.assumptions) + ".", style="dim")
    return _with_references(
        validation.sources,
        [table, summary, notes],
        [measured_memory_view(validation.measured)],
        [
            *([gpu_runs_memory_view(validation.gpu_runs)] if validation.gpu_runs else []),
            *([fsdp_runs_view(validation.fsdp_runs)] if validation.fsdp_runs else []),
            *([gpu_runs_memory_view(validation.recipe_runs)] if validation.recipe_runs else []),
            *([source_summary_view(validation.summaries)] if validation.summaries else []),
        ],
    )


def _with_references(
    sources: Sequence[str],
    lambda_parts: list[RenderableType],
    own_parts: list[RenderableType],
    others: list[RenderableType],
) -> RenderableType:
    """A validation's views: Lambda's and the own measurements' where compared (``sources``
    empty: every reference), then the other references' and the summary."""
    parts = [
        *(lambda_parts if not sources or "lambda2020" in sources else []),
        *(own_parts if not sources or "own" in sources else []),
        *others,
    ]
    return Group(*parts)


RESERVED_TOLERANCE = (0.05, 256 * 2**20)
"""The issue's target for peak reserved memory: within 5 % or 256 MiB of the measurement."""


def _within(measured: int, predicted: int) -> bool:
    share, floor = RESERVED_TOLERANCE
    return abs(predicted - measured) <= max(share * measured, floor)


def measured_memory_view(cases: Sequence[MeasuredMemoryCase]) -> RenderableType:
    """whichgpu's own measurements against the predictions: a row per measurement."""
    if not cases:
        return Text(
            "whichgpu's own measurements: none shipped yet (scripts/measure_reference.py "
            "measures and saves them).",
            style="bold",
        )
    table = Table(
        header_style="bold",
        title="Peak memory and largest batch: whichgpu's own measurements",
        title_justify="left",
    )
    for col in ("workload", "device", "run", "memory", "measured GiB", "predicted GiB", "error"):
        table.add_column(col, justify="right" if "GiB" in col or col == "error" else "left")
    table.add_column("largest batch (measured / predicted)")

    def row(
        c: MeasuredMemoryCase,
        what: str,
        measured: int | None,
        predicted: int | None,
        *,
        first: bool = False,
    ) -> None:
        if measured is None or predicted is None:
            return
        error = predicted / measured - 1 if measured else 0.0
        largest = ""
        if first and c.measured_max_batch is not None:
            style = _VERDICT_STYLE.get(c.max_batch_verdict or "", "dim")
            cap = (
                f" under {bytes_to_gib(c.memory_limit_bytes):.1f} GiB"
                if c.memory_limit_bytes
                else ""
            )
            predicted_max = "-" if c.predicted_max_batch is None else str(c.predicted_max_batch)
            largest = f"{c.measured_max_batch} / {predicted_max}{cap}" + (
                f" [{style}]{c.max_batch_verdict}[/{style}]" if c.max_batch_verdict else ""
            )
        run = c.run
        table.add_row(
            c.workload if first else "",
            (c.gpu or c.device_kind) if first else "",
            (
                f"{run.mode} {run.precision} b{run.batch_size}"
                + (f" L{run.seq_len}" if run.seq_len else "")
                + (f" {run.method}" if run.method != "full" else "")
                + (" ckpt" if run.checkpointing else "")
                + (" compiled" if run.compile else "")
                + (f" {run.optimizer}" if run.optimizer != "adamw" else "")
            )
            if first
            else "",
            what,
            f"{bytes_to_gib(measured):.3f}",
            f"{bytes_to_gib(predicted):.3f}",
            f"{error:+.1%}",
            largest,
        )

    for c in cases:
        what = "live tensors" if c.device_kind == "cpu" else "allocated"
        row(c, what, c.measured_allocated_bytes, c.predicted_allocated_bytes, first=True)
        row(c, "reserved", c.measured_reserved_bytes, c.predicted_reserved_bytes)
        row(c, "device (NVML)", c.measured_device_bytes, c.predicted_device_bytes)
    lines = []
    reserved = [
        (c.measured_reserved_bytes, c.predicted_reserved_bytes)
        for c in cases
        if c.measured_reserved_bytes is not None and c.predicted_reserved_bytes is not None
    ]
    if reserved:
        ok = sum(_within(m, p) for m, p in reserved)
        lines.append(f"peak reserved within 5 % or 256 MiB: {ok} of {len(reserved)}")
    cpu = [c for c in cases if c.device_kind == "cpu" and c.measured_allocated_bytes]
    if cpu:
        errors = [abs(c.predicted_allocated_bytes / c.measured_allocated_bytes - 1) for c in cpu]
        lines.append(
            f"CPU live-tensor peak: {len(cpu)} runs, median |error| "
            f"{statistics.median(errors):.2%}, largest {max(errors):.2%}"
        )
    searched = [c for c in cases if c.max_batch_verdict is not None]
    if searched:
        counts = {v: sum(c.max_batch_verdict == v for c in searched) for v in _VERDICT_STYLE}
        lines.append(
            f"largest batch: {len(searched)} searched, {counts['exact']} exact, "
            f"{counts['conservative']} conservative, {counts['too high']} too high"
        )
    if not any(c.device_kind == "cuda" for c in cases):
        lines.append(
            "no GPU measurement shipped yet: the allocator model, reserved memory and the "
            "overheads outside PyTorch's allocator are checked only against Lambda's table"
        )
    notes = list(dict.fromkeys(part for c in cases for part in c.note.split("; ") if part))
    return Group(
        table,
        Text("; ".join(lines) + ".", style="bold"),
        Text("Notes: " + "; ".join(notes) + ".", style="dim"),
    )


def closed_form_check_view(rows: Sequence[CrossCheckRow]) -> RenderableType:
    """``whichgpu validate closed-form``: closed form vs trace per profile and size."""
    table = Table(
        header_style="bold",
        title="Closed form vs traced step (replayed stored profiles, no workspaces)",
        title_justify="left",
    )
    for col in ("profile", "b", "L", "traced alloc GiB", "alloc error", "traced reserved GiB"):
        table.add_column(col, justify="left" if col == "profile" else "right")
    table.add_column("reserved error (fit --fast)", justify="right")
    table.add_column("peak phase")
    for r in rows:
        table.add_row(
            r.profile,
            str(r.batch_size),
            str(r.seq_len),
            f"{bytes_to_gib(r.traced_bytes):.2f}",
            f"{r.relative_error:+.1%}",
            f"{bytes_to_gib(r.traced_reserved_bytes):.2f}",
            f"{r.reserved_error:+.1%}",
            r.phase.replace("_", " "),
        )
    if not rows:
        return Text("No stored profile to compare with.")
    alloc = [r.relative_error for r in rows]
    reserved = [r.reserved_error for r in rows]
    summary = Text(
        f"{len(rows)} points. Peak allocated: {min(alloc):+.1%} … {max(alloc):+.1%}. Peak "
        f"reserved, as `fit --fast` uses it: {min(reserved):+.1%} … {max(reserved):+.1%} "
        f"(median {statistics.median(reserved):+.1%}). Positive errors are on the safe side.",
        style="bold",
    )
    notes = Text(
        "The closed form's reserved bytes are its allocated bytes times one factor, the "
        "largest ratio seen on these profiles: the allocator's cache does not grow evenly "
        "with the sizes, so the fast answer is safe but can be well above the trace.",
        style="dim",
    )
    return Group(table, summary, notes)


def predict_view(estimates: Sequence[ThroughputEstimate]) -> RenderableType:
    """``whichgpu predict``: one row per GPU, fastest first, with bands and closeness, and
    what the list leaves out (``ResultList.notes``)."""
    left_out = list(getattr(estimates, "notes", ()))
    if not estimates:
        why = " ".join(left_out) or "None fits, or none has the specs the predictor needs."
        return Text(f"No GPU to predict. {why}")
    first = estimates[0]
    many = first.n_gpus > 1
    serving = first.prefill_s is not None
    prefill_only = serving and first.run.new_tokens == 0  # one forward pass over the prompts
    copies = first.run.data_parallel()
    gpus = f", {first.n_gpus} GPUs data parallel ({first.run.sharding})" if many else ""
    if first.run.model_parallel() > 1:  # split: say the copies
        gpus = f", {first.n_gpus} GPUs, {copies} data-parallel copies ({first.run.sharding})"
    if first.run.mode == "inference":
        what = f"  inference, {first.run.precision}"
        if first.run.compile:
            what += ", compiled decoding"
        if first.run.context:
            what += f", context {first.run.context}, {first.run.new_tokens} new tokens"
        head = Text.assemble((first.workload, "bold"), what)
    else:
        head = Text.assemble(
            (first.workload, "bold"),
            f"  {first.run.describe(first.seq_len)}{gpus}",
        )
    table = Table(header_style="bold", title_justify="left")
    batch = "sequences" if serving else "batch"
    step = "request ms" if serving else "step ms"
    rate = f"generated {first.throughput_unit}" if serving else first.throughput_unit
    if prefill_only:
        rate = f"prompt {first.throughput_unit}"
    columns = ["GPU", batch, step, rate, "band", "MFU", "bound by"]
    if many:
        columns[5:5] = ["scaling", "link"]
    if serving:
        columns[5:5] = ["first token ms", "per token ms"]
    accumulating = first.run.mode == "train" and first.run.grad_accum > 1
    if accumulating:  # the micro-batch of each GPU, then the batch of one optimizer step
        columns[1:3] = ["micro-batch", "global batch", "optimizer step ms"]
    for column in columns:
        table.add_column(column, justify="left" if column in ("GPU", "bound by") else "right")
    for i, e in enumerate(estimates):
        global_batch = [str(e.global_batch_size or "-")] if accumulating else []
        if e.throughput is None or e.step_time_s is None:
            blank = [""] * (len(columns) - 4 - len(global_batch))
            what = "[red]does not fit[/red]" if not e.fits else "[yellow]unknown[/yellow]"
            table.add_row(e.gpu_name, str(e.batch_size), *global_batch, "-", what, *blank)
            continue
        bound = max(e.time_shares, key=lambda k: e.time_shares[k]) if e.time_shares else "-"
        share = f"{bound} {e.time_shares.get(bound, 0):.0%}"
        below = estimates[i + 1] if i + 1 < len(estimates) else None
        close = (
            " ≈"
            if below is not None
            and below.throughput is not None
            and too_close_to_rank(
                e.throughput, below.throughput, max(e.ranking_band, below.ranking_band)
            )
            else ""
        )
        cells = [
            e.gpu_name,
            str(e.batch_size),
            f"{e.step_time_s * 1000:,.1f}",
            f"{significant(e.throughput)}{close}",
            f"{significant(e.low)}-{significant(e.high)}",
            f"{e.mfu:.0%}" if e.mfu is not None else "-",
            share,
        ]
        if many:
            scaling = f"{e.scaling_efficiency:.0%}" if e.scaling_efficiency else "-"
            cells[5:5] = [scaling, e.link or "-"]
        if serving:
            cells[5:5] = [
                f"{(e.prefill_s or 0) * 1000:,.1f}",
                "—" if e.decode_step_s is None else f"{e.decode_step_s * 1000:,.2f}",
            ]
        cells[2:2] = global_batch
        table.add_row(*cells)
    notes = [*ThroughputEstimate.merged_assumptions(estimates), f"method: {first.method}"]
    if prefill_only:
        notes.append(
            "prefill-only requests (--new-tokens 0): prompt tokens/s = sequences x context / "
            "the prefill; no per-token time (—)"
        )
    elif serving:
        notes.append(GENERATED_RATE_NOTE)
    notes += [
        f"{e.gpu_name}: speed unknown: {e.speed_unknown}" for e in estimates if e.speed_unknown
    ]
    notes.append(
        "≈: too close to rank above the next GPU down (within the error of one GPU's "
        "prediction against another's: the leave-one-GPU-out band for a measured workload, "
        "the calibrated band for one never measured, whose error every GPU largely shares)"
    )
    shown: list[RenderableType] = [head, table]
    if left_out:
        shown.append(Text(" ".join(left_out)))
    shown.append(Text("Assumptions: " + "; ".join(notes) + ".", style="dim"))
    return Group(*shown)


def throughput_validation_view(validation: ThroughputValidation) -> RenderableType:
    """``whichgpu validate throughput``: summaries, per-model rank correlation, seed checks."""
    summary = Table(
        header_style="bold", title="Throughput error on Lambda 2020", title_justify="left"
    )
    for column in ("method", "MAPE", "median", "P90", "cases"):
        summary.add_column(column, justify="left" if column == "method" else "right")
    for s in validation.summaries:
        summary.add_row(s.method, f"{s.mape:.1%}", f"{s.median:.1%}", f"{s.p90:.1%}", str(s.cases))
    cases = Table(header_style="bold", title="Cases (leave one GPU out)", title_justify="left")
    for column in ("model", "GPU", "measured", "predicted", "error", "bandwidth baseline"):
        cases.add_column(column, justify="left" if column in ("model", "GPU") else "right")
    for c in validation.cases:
        cases.add_row(
            c.model,
            c.gpu,
            significant(c.measured, 4, trim=True),
            significant(c.leave_gpu_out, 4, trim=True),
            f"{c.leave_gpu_out / c.measured - 1:+.0%}",
            f"{c.bandwidth_baseline / c.measured - 1:+.0%}",
        )
    ranks = ", ".join(f"{m} {r:.2f}" for m, r in validation.rank_correlation.items())
    parts: list[RenderableType] = [
        cases,
        summary,
        Text(f"Rank correlation of GPUs per model (Spearman): {ranks}"),
        Text("Seed guides: " + "; ".join(validation.seed_checks)),
    ]
    if validation.left_out:
        parts.append(Text("Left out: " + "; ".join(validation.left_out)))
    parts.append(Text("Settings: " + "; ".join(validation.assumptions) + ".", style="dim"))
    others: list[RenderableType] = []
    if validation.references:
        others.append(reference_throughput_view(validation.references))
    if validation.summaries_by_source:
        others.append(source_summary_view(validation.summaries_by_source))
    return _with_references(validation.sources, parts, [_own_throughputs(validation)], others)


def _own_throughputs(validation: ThroughputValidation) -> RenderableType:
    """whichgpu's own GPU measurements against ``predict``, or a line saying there are none."""
    if not validation.measured:
        return Text(
            "Own GPU measurements: none shipped yet (scripts/measure_reference.py --device "
            "cuda writes them); the predictor is checked only against Lambda's table."
        )
    table = Table(
        header_style="bold",
        title="Throughput: whichgpu's own GPU measurements against predict (out of sample)",
        title_justify="left",
    )
    labels = ("workload", "GPU", "run")
    for column in (*labels, "measured", "predicted", "band", "error", "MFU"):
        table.add_column(column, justify="left" if column in labels else "right")
    for c in validation.measured:
        run = f"{c.run.mode} {c.run.precision} b{c.run.batch_size}"
        if c.run.seq_len:
            run += f" L{c.run.seq_len}"
        run += " ckpt" * c.run.checkpointing + " compiled" * c.run.compile
        band = (
            f"{significant(c.low, 4, trim=True)}-{significant(c.high, 4, trim=True)}"
            if c.low is not None and c.high is not None
            else ""
        )
        mfu = " / ".join(
            f"{m:.0%}" if m is not None else "-" for m in (c.measured_mfu, c.predicted_mfu)
        )
        table.add_row(
            c.workload,
            c.gpu,
            run,
            f"{significant(c.measured, 4, trim=True)} {c.unit}",
            "-" if c.predicted is None else significant(c.predicted, 4, trim=True),
            band,
            "-" if c.error is None else f"{c.error:+.1%}",
            mfu,
        )
    parts: list[RenderableType] = [table]
    s = validation.measured_summary
    if s is not None:
        parts.append(
            Text(
                f"{s.method}: MAPE {s.mape:.1%}, median {s.median:.1%}, P90 {s.p90:.1%} over "
                f"{s.cases} runs; MFU column: measured / predicted"
            )
        )
    if validation.speed_ratios:
        parts.append(Text("Speed ratios: " + "; ".join(validation.speed_ratios) + "."))
    notes = [f"{c.workload} on {c.gpu}: {c.note}" for c in validation.measured if c.note]
    if notes:
        parts.append(Text("Notes: " + "; ".join(notes) + ".", style="dim"))
    return Group(*parts)

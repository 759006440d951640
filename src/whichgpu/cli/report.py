"""``whichgpu report``: the recommendation, speed, memory, value and provenance in one HTML file."""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Annotated, Any, Optional

import typer

from whichgpu.cli import options as o
from whichgpu.cli import requests as r
from whichgpu.cli.output import emit_json, progress_note
from whichgpu.errors import UsageError
from whichgpu.files import check_output_file, write_atomically

_ASK = o.QUESTION_PANEL
_OUT = "Output"
FORMATS = ("html", "svg", "png")


def _png(svg: str) -> bytes:
    """The SVG rasterised, when the optional ``cairosvg`` package is installed."""
    try:
        converter: Any = importlib.import_module("cairosvg")
    except ImportError as exc:
        raise UsageError(
            "--format png needs the optional cairosvg package (pip install cairosvg), which is "
            "not installed. Use --format svg: papers and chats take SVG, and any browser "
            "opens it and can save it as an image."
        ) from exc
    data: bytes = converter.svg2png(bytestring=svg.encode("utf-8"), scale=2)
    return data


def _size(n_bytes: int) -> str:
    return f"{n_bytes / 1024:,.0f} KB" if n_bytes >= 1024 else f"{n_bytes} bytes"


def report(
    ctx: typer.Context,
    workload: Annotated[
        Optional[str],  # noqa: UP045
        typer.Argument(
            help="A named workload (see `whichgpu workloads`), e.g. bert-large; or your own "
            "model as FILE.py:FUNCTION or config.json (as --model / --config)."
        ),
    ] = None,
    preset: o.PresetOption = None,
    buy: o.BuyOption = False,
    rent: o.RentOption = False,
    used: o.UsedOption = None,
    gpu_only: o.GpuOnlyOption = False,
    budget: o.BudgetOption = None,
    provider: o.ProviderOption = None,
    gpus: o.MachineGpusOption = None,
    hours: o.HoursOption = None,
    samples: o.SamplesOption = None,
    tokens: o.TokensOption = None,
    epochs: o.EpochsOption = None,
    dataset_size: o.DatasetSizeOption = None,
    within: o.WithinOption = None,
    min_batch: o.MinBatchOption = None,
    region: o.RegionOption = None,
    sort: o.SortOption = None,
    vendor: o.VendorOption = None,
    top: Annotated[
        int,
        typer.Option("--top", help="Candidates ranked and charted.", rich_help_panel=_ASK),
    ] = 10,
    reference: Annotated[
        Optional[str],  # noqa: UP045
        typer.Option(
            "--reference",
            help="GPU the speeds are divided by (default: the leading candidate).",
            rich_help_panel=_ASK,
        ),
    ] = None,
    results: Annotated[
        bool,
        typer.Option(
            "--results", help="Add the tables and charts of your stored benchmark results."
        ),
    ] = False,
    store: Annotated[
        Optional[str],  # noqa: UP045
        typer.Option(
            "--store", help="Results store to read (measurements, --results).", metavar="PATH"
        ),
    ] = None,
    out: Annotated[
        Optional[Path],  # noqa: UP045
        typer.Option(
            "--out",
            "-o",
            help="File to write (default: report.html; with --format svg or png, the chart's "
            "name: throughput.svg, memory.png …).",
            metavar="FILE",
            rich_help_panel=_OUT,
        ),
    ] = None,
    fmt: Annotated[
        str,
        typer.Option(
            "--format",
            help="html (the whole report, default), svg (one chart, see --chart) or png (one "
            "chart; needs the optional cairosvg package, else use svg).",
            rich_help_panel=_OUT,
        ),
    ] = "html",
    chart: Annotated[
        Optional[str],  # noqa: UP045
        typer.Option(
            "--chart",
            help="With --format svg/png: throughput (default), batch, memory, value, rent, "
            "breakeven, or with --serving serving-latency (TPOT, or TTFT of prefill-only "
            "requests, against concurrency) or serving-cost ($ per million tokens).",
            rich_help_panel=_OUT,
        ),
    ] = None,
    gpu: o.GpuListOption = None,
    stack: o.StackOption = None,
    config: o.ConfigOption = None,
    model: o.ModelOption = None,
    task: o.TaskOption = None,
    mode: o.ModeOption = None,
    precision: o.PrecisionOption = None,
    batch_size: o.RecommendBatchOption = None,
    seq_len: o.SeqOption = None,
    optimizer: o.OptimizerOption = None,
    optimizer_impl: o.OptimizerImplOption = None,
    loss_kernel: o.LossKernelOption = None,
    grad_accum: o.GradAccumOption = None,
    checkpointing: o.CheckpointingOption = False,
    checkpointing_policy: o.CheckpointingPolicyOption = None,
    compile: o.CompileOption = False,
    method: o.MethodOption = None,
    lora_rank: o.LoraRankOption = None,
    lora_targets: o.LoraTargetsOption = None,
    sharding: o.ShardingOption = None,
    tensor_parallel: o.TensorParallelOption = None,
    pipeline_parallel: o.PipelineParallelOption = None,
    virtual_stages: o.VirtualStagesOption = None,
    context_parallel: o.ContextParallelOption = None,
    expert_parallel: o.ExpertParallelOption = None,
    tensor_parallel_overlap: o.TensorParallelOverlapOption = False,
    fp8_recipe: o.Fp8RecipeOption = None,
    fp8_all_gather: o.Fp8AllGatherOption = False,
    network: o.NetworkOption = None,
    context: o.ContextOption = None,
    new_tokens: o.NewTokensOption = None,
    concurrency: o.SearchConcurrencyOption = None,
    serving: o.RankServingOption = None,
    prices: o.PricesOption = None,
    quantization: o.QuantizationOption = None,
    kv_cache_dtype: o.KvCacheDtypeOption = None,
    json: o.JsonOption = False,
) -> None:
    """Write one HTML report: the answer, speed, memory, value per dollar and provenance.

    It asks the question `whichgpu recommend` asks, with the same options (--for, --used,
    --vendor, --within, --sort …), and shows the answer with everything behind it.

    The page is self-contained (styles, the sorting script and the SVG charts are inline;
    it fetches nothing), its tables and charts read without JavaScript, and it prints to PDF.
    It holds the recommendation and its reasons; throughput per GPU relative to a reference,
    with the prediction's band and your measurements marked; the largest batch and the memory
    breakdown against capacity; performance per dollar of the GPU alone, of 1-8 GPU machines
    and rented, and the cloud-against-own curve; your stored benchmark results (--results);
    and where every number comes from. --format svg writes one chart (--chart) instead.
    With --serving (an engine, as `whichgpu recommend --serving`), the speed section adds the
    engine's TTFT, TPOT, output tokens/s and $ per million output tokens per GPU, with TPOT
    against concurrency and the cost per million tokens as charts. --gpus 16 (or 8-64) reports
    on clusters of machines of 8 joined by --network, as `whichgpu recommend` ranks them; the
    break-even is then one machine's.

    Examples:

      whichgpu report bert-large --seq-len 512 --rent --epochs 10 --dataset-size 1000000

      whichgpu report llama-3.1-8b --method qlora --checkpointing --budget 1500 --results

      whichgpu report resnet50 --gpu 4090 --gpu 3090 --format svg --chart memory

      whichgpu report llama-3.1-8b --mode inference --concurrency 32 --serving vllm --rent

      whichgpu report llama-3.1-8b --gpus 16 --sharding fsdp --rent --tokens 1e10
    """
    from whichgpu.api import ReportRequest, answer_report
    from whichgpu.report.charts import CHARTS, SERVING_CHARTS, chart_svg
    from whichgpu.report.html import render_html, report_doc

    if buy and rent:
        raise UsageError("Choose one of --buy and --rent.")
    if fmt not in FORMATS:
        raise UsageError(f"--format: '{fmt}' is not one of {', '.join(FORMATS)}.")
    if chart is not None and fmt == "html":
        raise UsageError(
            "--chart picks the one chart of --format svg or png; the HTML report has them all."
        )
    chart = chart or "throughput"
    if chart not in CHARTS + SERVING_CHARTS:
        names = ", ".join(CHARTS + SERVING_CHARTS)
        raise UsageError(f"--chart: '{chart}' is not one of {names}.")
    default_name = "report.html" if fmt == "html" else f"{chart}.{fmt}"
    target = out or Path(default_name)
    if not json:  # never over a folder, the results store or another SQLite database
        from whichgpu.store import ResultStore

        protected = ResultStore(Path(store) if store else None).own_files()
        check_output_file(target, "--out", protected, example=default_name)
    if top < 1:
        raise UsageError(f"--top must be at least 1, not {top}.")
    request = ReportRequest(r.recommend_request(ctx), reference=reference, results=results)
    with progress_note("Ranking, sizing, timing and pricing") as now:
        data = answer_report(request, progress=now)
    if json:
        emit_json(report_doc(data))
        return
    if fmt == "html":
        payload = render_html(data).encode("utf-8")
    else:
        try:
            svg = chart_svg(data, chart)
        except LookupError as exc:
            raise UsageError(str(exc)) from exc
        payload = svg.encode("utf-8") if fmt == "svg" else _png(svg)
    try:
        write_atomically(target, lambda out: out.write(payload))
    except OSError as exc:
        raise UsageError(
            f"Cannot write {target} ({exc.strerror or exc}). Choose a file in a writable folder."
        ) from exc
    typer.echo(f"Wrote {target} ({_size(len(payload))}).")

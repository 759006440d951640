"""``whichgpu validate``: predictions against measurements shipped with whichgpu."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from whichgpu.cli import options as o
from whichgpu.cli.output import emit, emit_json, progress_note
from whichgpu.report import json_doc, terminal

validate_app = typer.Typer(
    help=(
        "Check whichgpu's predictions against measured data shipped with it, and print the "
        "error of every case and a summary per reference. `whichgpu validate memory` compares "
        "peak memory, largest batch sizes and whether published runs fit, `whichgpu validate "
        "throughput` training speed, `whichgpu validate closed-form` the closed form "
        "(`fit --fast`) with the traced path. References (--source): lambda2020 (Lambda's 2020 "
        "table), own (whichgpu's own bench results), h200-2026-11 (an NVIDIA H200, "
        "independent training loop), llm-foundry (MosaicML's MPT benchmarks, 8x A100/H100 "
        "80GB, FSDP), serving (published vLLM and TensorRT-LLM measurements), parallel "
        "(NVIDIA's published tensor- and pipeline-parallel Llama 3 training).\n\n"
        "Examples:\n\n"
        "  whichgpu validate memory\n\n"
        "  whichgpu validate memory --source h200-2026-11\n\n"
        "  whichgpu validate throughput --json\n\n"
        "  whichgpu validate closed-form"
    ),
    no_args_is_help=True,
    rich_markup_mode="markdown",
)


SourceOption = Annotated[
    Optional[list[str]],  # noqa: UP045 - typer needs Optional at runtime on Python 3.10
    typer.Option(
        "--source",
        metavar="NAME",
        help=(
            "A reference to compare with (repeat for several): lambda2020, own, h200-2026-11, "
            "llm-foundry, serving, parallel. Default: all. llm-foundry traces eight models the "
            "first time (a few minutes), then answers from the trace cache."
        ),
    ),
]


@validate_app.command("memory")
def memory(json: o.JsonOption = False, source: SourceOption = None) -> None:
    """Predicted memory against measured: largest batches, peaks, published runs that fit.

    Lambda's 2020 table: each model is estimated on each of its GPUs with the software stack
    of the time, converted to the table's unit, rounded down to the sizes the table's search
    tried, and compared in steps of that grid: exact, conservative (below the measurement) or
    too high (an out-of-memory recommendation — the failure that matters most). whichgpu's
    own bench results and the H200 measurements: peak allocated and reserved memory at the
    measured batch (error = predicted / measured - 1) and the largest batch (above the
    measurement: would run out of memory). llm-foundry: whether fit lets each published
    8-GPU FSDP run's micro-batch fit (every one of them ran). A summary per reference ends it.

    Examples:

      whichgpu validate memory

      whichgpu validate memory --source h200-2026-11 --source llm-foundry

      whichgpu validate memory --json
    """
    from whichgpu.validate.memory import validate_memory
    from whichgpu.validate.summary import chosen_sources

    sources = chosen_sources(source)
    with progress_note("Predicting the reference cases") as now:
        result = validate_memory(now, sources)
    if json:
        emit_json(json_doc.memory_validation_doc(result))
        return
    emit(terminal.memory_validation_view(result))


@validate_app.command("throughput")
def throughput(json: o.JsonOption = False, source: SourceOption = None) -> None:
    """Predicted training speed against measured, per reference, with a summary of each.

    Lambda's 2020 table, out of sample: the predictor's constants are refitted without each
    GPU (and without each model) in turn, and each left-out case is predicted: the errors are
    what a GPU or a model the constants never saw gets. Beside them, two baselines on the same
    cases: another GPU's measurement of the same model scaled by the ratio of memory
    bandwidths, or of AMP tensor rates. Also the seed guides' stated speed ratios (A100 vs
    V100, RTX 3090 vs RTX 2080 Ti). Then predict against whichgpu's own GPU measurements, the
    H200 measurements' step times, llm-foundry's published tokens/s per GPU (8-GPU FSDP
    runs; a run fit refuses is timed as if it fitted), published serving measurements and
    NVIDIA's published tensor- and pipeline-parallel training runs. Errors are predicted
    speed / measured - 1: positive means predicted faster.

    Examples:

      whichgpu validate throughput

      whichgpu validate throughput --source h200-2026-11 --source llm-foundry

      whichgpu validate throughput --json
    """
    from whichgpu.estimate.throughput import load_parameters
    from whichgpu.validate.summary import chosen_sources
    from whichgpu.validate.throughput import validate_throughput

    sources = chosen_sources(source)
    with progress_note("Predicting the reference cases") as now:
        result = validate_throughput(load_parameters(), now, sources=sources)
    if json:
        emit_json(json_doc.throughput_validation_doc(result))
        return
    emit(terminal.throughput_validation_view(result))


@validate_app.command("closed-form")
def closed_form(json: o.JsonOption = False) -> None:
    """The closed form (`fit --fast`) against the traced path, per profile and size.

    Every stored training profile of a model the closed form covers (GPT-2, BERT, Llama,
    Mistral, Qwen2; bf16 and fp32, AdamW) is replayed at b in {1, 4, 16} and L in {512, 2048}
    (capped at the model's positions) and compared with the closed form: the peak allocated
    bytes, and the peak reserved bytes `fit --fast` adds the workspaces and the CUDA context
    to. Positive errors mean the closed form is higher (the safe side).

    Examples:

      whichgpu validate closed-form

      whichgpu validate closed-form --json
    """
    from whichgpu.estimate.closed_form import cross_check

    with progress_note("Replaying the stored profiles"):
        rows = cross_check()
    if json:
        emit_json(json_doc.closed_form_check_doc(rows))
        return
    emit(terminal.closed_form_check_view(rows))

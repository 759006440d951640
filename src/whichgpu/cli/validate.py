"""``whichgpu validate``: predictions against measurements shipped with whichgpu."""

from __future__ import annotations

import typer

from whichgpu.cli import options as o
from whichgpu.cli.output import emit, emit_json, progress_note
from whichgpu.report import json_doc, terminal

validate_app = typer.Typer(
    help=(
        "Check whichgpu's predictions against measured data shipped with it, and print the "
        "error of every case. `whichgpu validate memory` compares largest batch sizes, "
        "`whichgpu validate throughput` training throughput, `whichgpu validate closed-form` "
        "the closed form (`fit --fast`) with the traced path.\n\n"
        "Examples:\n\n"
        "  whichgpu validate memory\n\n"
        "  whichgpu validate throughput --json\n\n"
        "  whichgpu validate closed-form"
    ),
    no_args_is_help=True,
    rich_markup_mode="markdown",
)


@validate_app.command("memory")
def memory(json: o.JsonOption = False) -> None:
    """Predicted largest batch sizes against measured ones (Lambda's 2020 table).

    Each model of the table is estimated on each of its GPUs with the software stack of the
    time, converted to the table's unit, rounded down to the sizes the table's search tried,
    and compared in steps of that grid: exact, conservative (below the measurement) or too
    high (an out-of-memory recommendation — the failure that matters most).

    Examples:

      whichgpu validate memory

      whichgpu validate memory --json
    """
    from whichgpu.validate.memory import validate_memory

    with progress_note("Predicting the reference cases"):
        result = validate_memory()
    if json:
        emit_json(json_doc.memory_validation_doc(result))
        return
    emit(terminal.memory_validation_view(result))


@validate_app.command("throughput")
def throughput(json: o.JsonOption = False) -> None:
    """Predicted training throughput against measured (Lambda's 2020 table), out of sample.

    The predictor's constants are refitted without each GPU (and without each model) in turn,
    and each left-out case is predicted: the errors are what a GPU or a model the constants
    never saw gets. Beside them, two baselines on the same cases: another GPU's measurement
    of the same model scaled by the ratio of memory bandwidths, or of AMP tensor rates. Also
    the seed guides' stated speed ratios (A100 vs V100, RTX 3090 vs RTX 2080 Ti).

    Examples:

      whichgpu validate throughput

      whichgpu validate throughput --json
    """
    from whichgpu.estimate.throughput import load_parameters
    from whichgpu.validate.throughput import validate_throughput

    with progress_note("Refitting without each GPU and each model"):
        result = validate_throughput(load_parameters())
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

"""``whichgpu profile``: trace one step of a workload and summarise it."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from whichgpu.cli import options as o
from whichgpu.cli import requests as r
from whichgpu.cli.output import emit, emit_json, progress_note
from whichgpu.report import json_doc, terminal


def profile(
    ctx: typer.Context,
    workload: Annotated[
        Optional[str],  # noqa: UP045
        typer.Argument(
            help="A named workload (see `whichgpu workloads`), e.g. llama-3.1-8b; or your own "
            "model as FILE.py:FUNCTION or config.json (as --model / --config)."
        ),
    ] = None,
    config: o.ConfigOption = None,
    model: o.ModelOption = None,
    task: o.TaskOption = None,
    mode: o.ModeOption = None,
    precision: o.PrecisionOption = None,
    batch_size: o.BatchOption = None,
    seq_len: o.SeqOption = None,
    optimizer: o.OptimizerOption = None,
    optimizer_impl: o.OptimizerImplOption = None,
    loss_kernel: o.LossKernelOption = None,
    grad_accum: o.GradAccumOption = None,
    checkpointing: o.CheckpointingOption = False,
    checkpointing_policy: o.CheckpointingPolicyOption = None,
    method: o.MethodOption = None,
    lora_rank: o.LoraRankOption = None,
    lora_targets: o.LoraTargetsOption = None,
    context: o.ContextOption = None,
    new_tokens: o.NewTokensOption = None,
    concurrency: o.ConcurrencyOption = None,
    json: o.JsonOption = False,
) -> None:
    """Trace one step of a model on the CPU with fake tensors and summarise it.

    Nothing is downloaded and no GPU is needed: the model is built from its config with
    random weights that take no memory. Reports parameters, FLOPs per step and per sample,
    bytes moved, the operator mix, and the peak of live tensor bytes by category (weights,
    gradients, optimizer state, activations, temporaries) — the raw material of `fit` and
    `predict`.

    Run options left out take these defaults: --mode train, --precision bf16, --batch-size and
    --seq-len the workload's (see `whichgpu workloads`), --optimizer adamw, --method full.
    --mode inference of a language model traces a server's step instead: a prefill of
    --context prompt tokens (default: the workload's sequence length, shortened so that
    context plus new tokens fits the model's positions) for --concurrency sequences (default
    1, not the workload's batch; --batch-size is another name for it) into a KV cache sized
    for --new-tokens more (default 128), then one decode step.

    Examples:

      whichgpu profile resnet50 --batch-size 64

      whichgpu profile llama-3.1-8b --seq-len 2048 --precision bf16 --json

      whichgpu profile --config my-model/config.json --batch-size 4 --seq-len 1024

      whichgpu profile --model examples/my_model.py:build --batch-size 32

      whichgpu profile llama-3.1-8b --mode inference --context 4096 --new-tokens 256 --concurrency 8
    """
    from whichgpu.api import ProfileRequest, answer_profile

    run = r.run_options(ctx).config()
    request = ProfileRequest(r.target(ctx), run)
    with progress_note(f"Tracing one {run.mode} step on the CPU") as now:
        summary = answer_profile(request, progress=now)
    if json:
        emit_json(json_doc.profile_doc(summary))
        return
    emit(terminal.profile_view(summary))

"""``whichgpu fit``: will it fit, and at what batch size, on each GPU."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from whichgpu.cli import options as o
from whichgpu.cli import requests as r
from whichgpu.cli.output import emit, emit_json, progress_note
from whichgpu.report import json_doc, terminal


def fit(
    ctx: typer.Context,
    workload: Annotated[
        Optional[str],  # noqa: UP045
        typer.Argument(
            help="A named workload (see `whichgpu workloads`), e.g. llama-3.1-8b; or your own "
            "model as FILE.py:FUNCTION or config.json (as --model / --config)."
        ),
    ] = None,
    gpu: o.GpuListOption = None,
    stack: o.StackOption = None,
    serving: Annotated[
        Optional[str],  # noqa: UP045
        typer.Option(
            "--serving",
            help="With --mode inference: also size a serving engine's KV cache (vllm, "
            "tensorrt-llm, sglang): "
            "the sequences of --context + --new-tokens it holds at once. Default: plain PyTorch "
            "generation with a static KV cache, as traced.",
            show_default=False,
        ),
    ] = None,
    config: o.ConfigOption = None,
    model: o.ModelOption = None,
    task: o.TaskOption = None,
    mode: o.ModeOption = None,
    precision: o.PrecisionOption = None,
    batch_size: o.FitBatchOption = None,
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
    gpus: o.FitGpusOption = None,
    sharding: o.ShardingOption = None,
    tensor_parallel: o.TensorParallelOption = None,
    pipeline_parallel: o.PipelineParallelOption = None,
    virtual_stages: o.VirtualStagesOption = None,
    context_parallel: o.ContextParallelOption = None,
    expert_parallel: o.ExpertParallelOption = None,
    fp8_recipe: o.Fp8RecipeOption = None,
    fp8_all_gather: o.Fp8AllGatherOption = False,
    network: o.NetworkOption = None,
    context: o.ContextOption = None,
    new_tokens: o.NewTokensOption = None,
    concurrency: o.SearchConcurrencyOption = None,
    fast: Annotated[
        bool,
        typer.Option(
            "--fast",
            help="Answer from the closed form: the model's Hugging Face config alone, no "
            "torch, no trace. Full training of Llama, Mistral, Qwen2, GPT-2 and BERT on one "
            "GPU; errs high (see `whichgpu validate closed-form`).",
        ),
    ] = False,
    quantization: o.QuantizationOption = None,
    kv_cache_dtype: o.KvCacheDtypeOption = None,
    json: o.JsonOption = False,
) -> None:
    """Will a training step fit on a GPU, and what is the largest batch that does?

    Replays the allocations of the model's real training step (traced on the CPU, or stored
    for named workloads) through a model of PyTorch's caching allocator, adds the CUDA
    context and library workspaces, and compares the total with the memory CUDA reports for
    each GPU. Without --batch-size the headline is the largest batch that fits; with it,
    whether that batch fits and the headroom. It is designed to err on the safe side (a batch
    it says fits is meant not to run out of memory), which is a goal, not a guarantee:
    `whichgpu validate memory` shows its predictions against measured largest batches and
    peak memory.

    --gpus N answers for one of N GPUs training data parallel (--sharding ddp, zero1, zero2,
    zero3 or fsdp), every figure per GPU; any N works, on one machine or many, since the memory of
    one GPU does not depend on where the others are (predict and recommend stop at 8, one
    machine).

    Examples:

      whichgpu fit llama-3.2-1b --gpu 4090 --gpu a100-80gb --seq-len 2048

      whichgpu fit resnet50 --precision fp32            # every GPU, sorted by max batch

      whichgpu fit bert-large --gpu 3090 --batch-size 32 --json

      whichgpu fit --model my_model.py:build --gpu 4090

      whichgpu fit llama-3.1-8b --gpu h100-sxm --gpus 8 --sharding fsdp

      whichgpu fit --config config.json --fast --gpu 4090 --seq-len 2048   # no torch

    Inference (--mode inference) of a language model: the batch is the concurrency, the
    sequences served at once, each with a static KV cache of --context + --new-tokens tokens
    (defaults: the workload's sequence length, shortened so that both fit the model's
    positions, and 128); without --concurrency the headline is the largest concurrency that
    fits. --serving vllm adds the engine's answer:

      whichgpu fit llama-3.1-8b --mode inference --context 4096 --new-tokens 256 --gpu h100-sxm

      whichgpu fit llama-3.1-8b --mode inference --serving vllm --gpu a100-80gb
    """
    from whichgpu.api import FitRequest, answer_fit

    request = FitRequest(
        r.target(ctx),
        r.run_options(ctx).config(gpus=gpus),
        gpus=gpu,
        stack=stack,
        serving=serving,
        quantization=quantization,
        kv_cache_dtype=kv_cache_dtype,
        fast=fast,
    )
    note = (
        "Estimating peak memory from the closed form"
        if fast
        else "Estimating peak memory (tracing the step if it is not stored)"
    )
    with progress_note(note) as now:
        estimates = answer_fit(request, progress=now)
    if json:
        emit_json(json_doc.fit_doc(estimates))
        return
    emit(terminal.fit_view(estimates))
    if estimates.notes:  # GPUs left out (an engine that cannot run --quantization there)
        from rich.text import Text

        emit(Text("\n".join(f"- {n}" for n in estimates.notes), style="dim"))

"""``whichgpu predict``: how fast a training step runs on each GPU."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from whichgpu.cli import options as o
from whichgpu.cli import requests as r
from whichgpu.cli.output import emit, emit_json, progress_note
from whichgpu.report import json_doc, terminal


def predict(
    ctx: typer.Context,
    workload: Annotated[
        Optional[str],  # noqa: UP045
        typer.Argument(
            help="A named workload (see `whichgpu workloads`), e.g. bert-large; or your own "
            "model as FILE.py:FUNCTION or config.json (as --model / --config)."
        ),
    ] = None,
    gpu: o.GpuListOption = None,
    stack: o.StackOption = None,
    config: o.ConfigOption = None,
    model: o.ModelOption = None,
    task: o.TaskOption = None,
    mode: o.ModeOption = None,
    precision: o.PrecisionOption = None,
    batch_size: o.PredictBatchOption = None,
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
    gpus: o.GpusOption = None,
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
    calibrate: Annotated[
        Optional[str],  # noqa: UP045
        typer.Option(
            "--calibrate",
            help="A measurement of the same run on one of your GPUs: a file written by "
            "`whichgpu results export` or `bench --json`, or a result id in the store. Its "
            "measured / predicted ratio corrects every GPU's prediction, and the band becomes "
            "that correction's validated error.",
            metavar="FILE|ID",
        ),
    ] = None,
    store: Annotated[
        Optional[str],  # noqa: UP045
        typer.Option("--store", help="Results store for --calibrate ID.", metavar="PATH"),
    ] = None,
    context: o.ContextOption = None,
    new_tokens: o.NewTokensOption = None,
    concurrency: o.SearchConcurrencyOption = None,
    serving: Annotated[
        Optional[str],  # noqa: UP045
        typer.Option(
            "--serving",
            help="With --mode inference: also predict a serving engine's speed (vllm, "
            "tensorrt-llm, sglang): CUDA-graph decode near the memory-bandwidth limit, chunked "
            "prefill; TTFT, TPOT, output tokens/s, their growth with concurrency and $ per "
            "million output tokens. Without --concurrency: the most its KV cache holds.",
            show_default=False,
        ),
    ] = None,
    tpot_ms: Annotated[
        Optional[float],  # noqa: UP045
        typer.Option(
            "--tpot-ms",
            help="With --serving: a target time per output token; the answer names the "
            "largest concurrency that meets it.",
            show_default=False,
        ),
    ] = None,
    ttft_ms: Annotated[
        Optional[float],  # noqa: UP045
        typer.Option(
            "--ttft-ms",
            help="With --serving: a target time to first token (with --tpot-ms, both).",
            show_default=False,
        ),
    ] = None,
    quantization: o.QuantizationOption = None,
    kv_cache_dtype: o.KvCacheDtypeOption = None,
    requests: Annotated[
        Optional[int],  # noqa: UP045
        typer.Option(
            "--requests",
            help="With --serving: also simulate a benchmark run of this many requests, "
            "--concurrency of them in flight (closed loop, fixed lengths, as `vllm bench "
            "serve --max-concurrency C --num-prompts N --request-rate inf`), step by step: "
            "mean and median TTFT and TPOT and output tokens/s as such a benchmark reports "
            "them, its first wave arriving together.",
            show_default=False,
        ),
    ] = None,
    json: o.JsonOption = False,
) -> None:
    """How fast will it train (or serve) on each GPU? Predicted throughput, ranked.

    Each operator of the model's real training step (traced on the CPU, or stored for named
    workloads) is timed on each GPU by a roofline — FLOPs over the peak of the engine its
    precision uses (tensor cores, TF32, FP32 units), bytes over the memory bandwidth, a
    launch floor — with five constants fitted on measured throughputs, times a speed factor:
    the workload's own if it was measured, else its type's (vision, language). The answer is
    the GPU step on synthetic data: the fit also separates the time the measured runs spent
    outside the GPU (their datasets' input pipelines), which is left out. Without
    --batch-size each GPU runs the largest batch that fits it (as `whichgpu fit` finds it).
    Every prediction has a band: the out-of-sample error of its kind of workload (`whichgpu
    validate throughput`), wider for a workload never measured. Two GPUs are too close to
    rank (marked ≈) when one's lead is within the relative band, the error of one GPU's
    prediction against another's; most of a never-measured workload's error is shared by
    every GPU, so its relative band is the calibrated one, much narrower than its band.

    With --gpus N, N such GPUs of one node train data parallel: each runs its own batch, then
    the gradients are averaged over NVLink/NVSwitch, a bridge or PCIe (from the catalog); the
    part of that exchange backward cannot hide is added to the step, and the scaling column
    says what share of N x one GPU is left.

    With --calibrate, a `whichgpu bench` measurement of the same run on one of your GPUs
    corrects every prediction by its measured / predicted ratio (the error the model makes for
    your workload and software is mostly the same on every GPU).

    With --mode inference a language model serves --concurrency sequences (default: the most
    that fit) of --context prompt tokens (default: the workload's sequence length, shortened so
    that context and new tokens fit the model's positions) and --new-tokens generated ones
    (default 128): generated tokens/s, time to first token (the prefill) and time per output
    token (a decode step). With --serving vllm the answer adds that engine's speed: decode
    steps replay CUDA graphs (no per-operator launch cost), their kernels one after another,
    each at max(bytes / achievable bandwidth, FLOPs / achievable tensor rate); the prompt is
    prefilled in chunks of the engine's token budget. It gives TTFT, TPOT, output tokens/s as
    concurrency grows and the cost per million output tokens on rented GPUs; --tpot-ms /
    --ttft-ms find the largest concurrency within those targets. Those are the steady state;
    --requests N simulates a whole benchmark run of N requests instead, to set beside your
    own benchmark's numbers.

    Examples:

      whichgpu predict resnet50 --precision fp32 --gpu 2080ti --gpu 3090 --gpu 4090

      whichgpu predict llama-3.2-1b --seq-len 2048          # every GPU it fits on

      whichgpu predict bert-large --batch-size 16 --json

      whichgpu predict llama-3.1-8b --gpus 8 --sharding fsdp --gpu h100-sxm --gpu a100-80gb

      whichgpu predict llama-3.1-8b --mode inference --context 4096 --concurrency 8

      whichgpu predict llama-3.1-70b --mode inference --serving vllm --gpus 4 --concurrency 32

      whichgpu predict llama-3.1-8b --mode inference --serving vllm --concurrency 16 --requests 320

      whichgpu predict resnet50 --calibrate d7f06f92          # a stored bench result
    """
    from whichgpu.api import PredictRequest, answer_predict

    request = PredictRequest(
        r.target(ctx),
        r.run_options(ctx).config(gpus=gpus),
        gpus=gpu,
        stack=stack,
        calibrate=calibrate,
        store=store,
        serving=serving,
        tpot_ms=tpot_ms,
        ttft_ms=ttft_ms,
        quantization=quantization,
        kv_cache_dtype=kv_cache_dtype,
        requests=requests,
    )
    with progress_note("Predicting step times (tracing the step if it is not stored)") as now:
        estimates = answer_predict(request, progress=now)
    if json:
        emit_json(json_doc.predict_doc(estimates))
        return
    emit(terminal.predict_view(estimates))
    if serving is not None:
        from whichgpu.report.serving import serving_speed_view

        emit(serving_speed_view(estimates))

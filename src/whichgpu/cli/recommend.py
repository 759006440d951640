"""``whichgpu recommend``: which GPU to buy or rent for a workload, a job and a budget."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from whichgpu.cli import options as o
from whichgpu.cli import requests as r
from whichgpu.cli.output import emit, emit_json, progress_note
from whichgpu.errors import UsageError
from whichgpu.report.recommend import recommend_doc, recommend_view

_ASK = o.QUESTION_PANEL


def recommend(
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
    top: Annotated[
        int, typer.Option("--top", help="Candidates to list.", rich_help_panel=_ASK)
    ] = 10,
    sort: o.SortOption = None,
    store: Annotated[
        Optional[str],  # noqa: UP045
        typer.Option(
            "--store", help="Results store whose bench measurements to use.", metavar="PATH"
        ),
    ] = None,
    vendor: o.VendorOption = None,
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
    """Which GPU should you buy or rent for this model? Ranked, priced and explained.

    Every catalog GPU (or each --gpu) is sized for your run (`whichgpu fit`), timed
    (`whichgpu predict`, or your own `whichgpu bench` result when the store has one) and
    priced (`whichgpu cost`). Those that fit, have a price and stay within the budget are
    ranked: by the cost to finish the job when you give its size in work (--samples,
    --tokens, --epochs with --dataset-size); with --hours of use, by the work done per dollar
    over those hours (machine and electricity, or rental); else by throughput per dollar.
    Without --batch-size each GPU runs the largest batch that fits it. Each GPU left out gets
    one line on why, and leaders that the error of one GPU's prediction against another's
    could swap are called too close to rank.

    Examples:

      whichgpu recommend llama-3.1-8b --method qlora --checkpointing --seq-len 2048 --budget 1500

      whichgpu recommend bert-large --seq-len 512 --epochs 10 --dataset-size 1000000 --rent

      whichgpu recommend llama-3.1-70b --mode inference --concurrency 8 --context 4096 --rent

      whichgpu recommend llama-3.1-70b --mode inference --concurrency 32 --serving vllm --rent

      whichgpu recommend --for kaggle

      whichgpu recommend --for kaggle --budget 800 --gpu-only   # $800 for the GPU alone
    """
    from whichgpu.api import answer_recommend

    if buy and rent:
        raise UsageError("Choose one of --buy and --rent.")
    if top < 1:
        raise UsageError(f"--top must be at least 1, not {top}.")
    request = r.recommend_request(ctx)
    with progress_note("Sizing, timing and pricing every candidate") as now:
        ranking = answer_recommend(request, progress=now)
    if json:
        emit_json(recommend_doc(ranking))
        return
    emit(recommend_view(ranking))

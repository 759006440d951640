"""``fit``: will it fit? Peak memory and the largest batch of a step on each GPU.

The traced path sizes the prepared step (``api.step``) with the memory model
(``estimate.memory.estimate_on_gpu``); ``fast=True`` answers from the closed form
(``estimate.fast``) without a trace and without torch.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from whichgpu.api.catalog import resolve_gpus
from whichgpu.api.requests import FitRequest, Target
from whichgpu.api.step import ask, keep_replays, select_target
from whichgpu.catalog import load_catalog
from whichgpu.catalog.stacks import get_serving_engine, get_stack
from whichgpu.errors import UsageError, option
from whichgpu.schema import MemoryEstimate, RunConfig, ServingEngine
from whichgpu.tabular import ResultList
from whichgpu.workloads import check_for_workload, run_config
from whichgpu.workloads.base import Workload


def fit(
    workload: str | None = None,
    *,
    config: Path | str | None = None,
    task: str | None = None,
    model: str | None = None,
    gpus: Sequence[str] | None = None,
    gpu_count: int | None = None,
    stack: str | None = None,
    serving: str | None = None,
    quantization: str | None = None,
    kv_cache_dtype: str | None = None,
    progress: Callable[[str], None] | None = None,
    fast: bool = False,
    **run_options: Any,
) -> ResultList[MemoryEstimate]:
    """Will it fit? Peak memory and the largest batch on each GPU (all of them by default).

    ``run_options`` are the run configuration (``precision="bf16"``, ``seq_len=2048`` …).
    Without ``batch_size`` the largest batch that fits is the headline of each estimate.
    Results are sorted by headroom at that batch, largest first.

    ``gpu_count=N`` (the CLI's ``--gpus``; ``gpus`` names the GPUs to check) estimates one of
    N GPUs training together, data parallel, each with its own batch, and ``sharding=`` says
    what they split: ``"ddp"`` (default), ``"zero1"``, ``"zero2"``, ``"zero3"``, ``"fsdp"`` or
    ``"hsdp"`` (``fsdp`` within each node of 8, replicated across nodes).

    ``mode="inference"`` of a language model: the batch is the concurrency (sequences served
    at once, ``concurrency=`` or ``batch_size=``), the length the ``context`` (prompt tokens;
    default the workload's sequence length), and every sequence's static KV cache holds
    ``new_tokens`` more (default ``DEFAULT_NEW_TOKENS``); the headline is the largest
    concurrency. ``serving="vllm"`` (or ``"tensorrt-llm"``, ``"sglang"``) adds that engine's
    paged-KV-cache answer to each estimate and makes it the verdict: ``fits`` and ``max_batch_size``
    are then the engine's (its KV cache holds the sequences; ``estimate.serving.engine_verdict``),
    the memory figures plain PyTorch generation's, for comparison. ``quantization="int4"``
    (``"int8"``, ``"fp8"``; with ``serving``) sizes the engine's KV budget for quantized
    weights (``api.serving.engine_quantization``); a GPU the engine cannot run them on is left
    out, with why in the list's ``notes``. ``kv_cache_dtype="fp8"`` (with ``serving``) keeps the
    engine's KV cache in fp8, one byte per element: twice the tokens in the same budget.

    ``fast=True`` answers from the closed form (``whichgpu.estimate.fast``): from the shipped
    config of a named workload or the ``config`` file, without torch and without a trace, for
    full training of the models it covers on one GPU; anything else is a ``UsageError``. It
    errs high (``validate closed-form`` prints by how much).

    The keywords become a ``FitRequest``, answered by ``answer_fit``.
    """
    request = FitRequest(
        Target(workload, config, task, model),
        run_config(gpus=gpu_count, **run_options),
        gpus=gpus,
        stack=stack,
        serving=serving,
        quantization=quantization,
        kv_cache_dtype=kv_cache_dtype,
        fast=fast,
    )
    return answer_fit(request, progress=progress)


def answer_fit(
    request: FitRequest, *, progress: Callable[[str], None] | None = None
) -> ResultList[MemoryEstimate]:
    """``fit``'s answer to a typed request (see ``fit`` for what it means); ``progress``
    hears each GPU, and each size while a step is traced."""
    from whichgpu.api.serving import (
        checked_kv_cache_dtype,
        checked_quantization,
        compiled_weights,
        engine_quantization,
    )
    from whichgpu.estimate.compiled import compile_refusal
    from whichgpu.estimate.engine_speed import QuantizationRefused
    from whichgpu.estimate.fp8 import check_gpu, fp8_refusal
    from whichgpu.estimate.memory import estimate_on_gpu
    from whichgpu.estimate.paged import paged_refusal
    from whichgpu.estimate.serving import engine_verdict

    chosen = select_target(request.target)
    run = request.run
    if request.fast:
        if request.serving is not None:
            raise UsageError(
                f"{option('fast')} covers training; drop {option('serving')} (or {option('fast')})."
            )
        checked_kv_cache_dtype(request.kv_cache_dtype, None, run)  # fp8: a serving engine's
        return _fit_fast(chosen, request, progress)
    engine = _engine(request.serving, run)
    checked = checked_quantization(request.quantization, engine, run)
    kv_cache_dtype = checked_kv_cache_dtype(request.kv_cache_dtype, engine, run)
    asked = ask(
        chosen,
        run,
        gpus=request.gpus,
        stack=request.stack,
        config=request.target.config,
        progress=progress,
    )
    step = replace(
        asked.step,
        kv_cache_dtype=kv_cache_dtype,
        quantization=checked if engine is None else None,  # compiled decoding's
    )
    if engine is not None and step.kv_per_token is None:
        raise UsageError(
            f"{option('serving')} applies to language models that generate; "
            f"{chosen.info.name} does not."
        )
    catalog = load_catalog()
    estimates = []
    refused: list[str] = []
    for gpu in asked.targets:
        if progress is not None:
            progress(gpu.name)
        if step.run.precision == "fp8" and (why := fp8_refusal(gpu)) is not None:
            if len(asked.targets) == 1:
                check_gpu(gpu)
            refused.append(f"{gpu.name} is left out: {why}.")
            continue
        why = paged_refusal(step.run, gpu) or compile_refusal(step.run, gpu)
        if why is not None:
            if len(asked.targets) == 1:
                raise UsageError(f"{why}.")
            refused.append(f"{gpu.name} is left out: {why}.")
            continue
        try:
            quantized = compiled_weights(step, gpu)
        except QuantizationRefused as exc:
            if len(asked.targets) == 1:
                raise
            refused.append(str(exc))
            continue
        estimate = estimate_on_gpu(
            step.memory,
            step.run,
            gpu,
            catalog,
            asked.software,
            method=step.method,
            compiled_saving=step.compiled,
            experts=step.experts,
            seq_limit=step.seq_limit,
            shorter_seq_when_unfit=True,
            kv_per_token_bytes=step.kv_per_token,
            kv_head_count=step.kv_heads,
            serving=engine,
            quantized=quantized,
        )
        if engine is not None:
            try:
                estimate, _ = engine_quantization(
                    step, engine, gpu, estimate, asked.software, checked
                )
            except QuantizationRefused as exc:
                if len(asked.targets) == 1:
                    raise
                refused.append(str(exc))
                continue
        # with an engine, its KV cache decides what fits
        estimates.append(engine_verdict(estimate))
    estimates.sort(key=lambda e: (-e.max_batch_size, -e.headroom_bytes))
    keep_replays()
    return ResultList(estimates, notes=refused)


def _engine(serving: str | None, run: RunConfig) -> ServingEngine | None:
    """The serving engine ``serving`` names (None: plain PyTorch generation); an engine
    serves inference only."""
    if serving is None:
        return None
    if run.mode != "inference":
        raise UsageError(
            f"{option('serving')} sizes a serving engine's KV cache; add {option('mode')} "
            "inference."
        )
    return get_serving_engine(serving)


def _fit_fast(
    chosen: Workload, request: FitRequest, progress: Callable[[str], None] | None
) -> ResultList[MemoryEstimate]:
    """``fit(fast=True)``: the closed form's estimate on each GPU (no torch, no trace)."""
    from whichgpu.estimate import closed_form
    from whichgpu.estimate.fast import check_covered, fast_estimate_on_gpu
    from whichgpu.workloads.user import read_user_config

    run, target = request.run, request.target
    workload, config = target.workload, target.config
    if config is not None:
        doc, _ = read_user_config(Path(config), target.task)  # type: ignore[arg-type]
    elif workload is not None and chosen.info.name in closed_form.closed_form_workloads():
        doc = closed_form.workload_config(chosen.info.name)
    else:
        covered = ", ".join(closed_form.closed_form_workloads())
        raise UsageError(
            f"{option('fast')} answers from a Hugging Face config: one of {covered}, or "
            f"{option('config')} FILE; not {workload or 'a ' + option('model') + ' function'}. "
            f"Drop {option('fast')} to use the traced path."
        )
    check_for_workload(run, chosen.info)
    if run.seq_len is None:
        run = run.model_copy(update={"seq_len": chosen.info.default_seq_len})
    check_covered(doc, run)
    software = get_stack(request.stack)
    catalog = load_catalog()
    estimates = []
    for gpu in resolve_gpus(request.gpus):
        if progress is not None:
            progress(gpu.name)
        estimates.append(
            fast_estimate_on_gpu(
                doc,
                run,
                gpu,
                catalog,
                software,
                workload=chosen.info.name,
                seq_limit=chosen.info.max_seq_len,
            )
        )
    estimates.sort(key=lambda e: (-e.max_batch_size, -e.headroom_bytes))
    return ResultList(estimates)

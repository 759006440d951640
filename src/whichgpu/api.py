"""The Python API: the questions whichgpu answers, as functions returning typed results.

    >>> import whichgpu.api as wg
    >>> estimates = wg.fit("llama-3.2-1b", gpus=["rtx-4090", "a100-sxm4-80gb"], seq_len=2048)
    >>> [(e.gpu, e.max_batch_size) for e in estimates]

Each function takes the same run options as the CLI (``mode``, ``precision``, ``batch_size``,
``seq_len``, ``optimizer``, ``checkpointing``, ``method`` …) as keyword arguments and raises
``whichgpu.errors.WhichGpuError`` subclasses on bad input. Named workloads are answered from
their stored profiles without torch; other workloads and run configurations are traced, which
needs the ``torch`` extra.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from whichgpu.catalog import load_catalog
from whichgpu.catalog.stacks import get_serving_engine, get_stack
from whichgpu.errors import UsageError
from whichgpu.schema import GpuSpec, MemoryEstimate, RunConfig, ThroughputEstimate
from whichgpu.workloads import check_for_workload, run_config, select_workload
from whichgpu.workloads.base import Workload
from whichgpu.workloads.hf import read_config
from whichgpu.workloads.registry import get_workload
from whichgpu.workloads.run_config import inference_context
from whichgpu.workloads.stored import ScalableProfile, load_stored


def scalable_profile(workload: Workload, run: RunConfig) -> tuple[ScalableProfile, str]:
    """The step of ``workload`` for every size: stored if shipped, else traced (needs torch).

    Returns the profile and how it was obtained (``stored profile`` or ``traced``).
    """
    named = _is_registered(workload)
    if named:
        stored = load_stored(workload.info.name, run)
        if stored is not None:
            return stored, "stored profile"
    try:
        from whichgpu.trace.scaling import trace_scalable
    except ImportError as exc:
        what = "this run configuration" if named else "a workload of your own"
        raise UsageError(
            f"No stored profile answers for {workload.info.name} with {what}, and tracing one "
            "needs torch: pip install 'whichgpu[torch]'."
        ) from exc
    return trace_scalable(workload, run), "traced"


def _kv_bytes_per_token(workload: Workload, config: Path | str | None, run: RunConfig) -> int:
    """KV-cache bytes per token from the model's config (the user's file or the shipped one)."""
    from whichgpu.estimate.serving import kv_bytes_per_token, serving_dtype_bytes

    if config is not None:
        doc = json.loads(Path(config).read_text(encoding="utf-8"))
    else:
        doc = read_config(workload.info.name)
    return kv_bytes_per_token(doc, serving_dtype_bytes(run.precision))


def _is_registered(workload: Workload) -> bool:
    try:
        return get_workload(workload.info.name) is workload
    except Exception:
        return False


def _select(
    workload: str | None, config: Path | str | None, task: str | None, model: str | None
) -> Workload:
    """The workload a call names: registered, a config file, or the user's model."""
    return select_workload(
        workload,
        Path(config) if config else None,
        task,  # type: ignore[arg-type]
        model=model,
    )


def resolve_gpus(names: Sequence[str] | None) -> list[GpuSpec]:
    """Catalog GPUs by name (every GPU with a known memory size when ``names`` is empty)."""
    catalog = load_catalog()
    if names:
        return [catalog.resolve(n) for n in names]
    return [g for g in catalog.all() if g.memory_gb]


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
    progress: Callable[[str], None] | None = None,
    **run_options: Any,
) -> list[MemoryEstimate]:
    """Will it fit? Peak memory and the largest batch on each GPU (all of them by default).

    ``run_options`` are the run configuration (``precision="bf16"``, ``seq_len=2048`` …).
    Without ``batch_size`` the largest batch that fits is the headline of each estimate.
    Results are sorted by headroom at that batch, largest first.

    ``gpu_count=N`` (the CLI's ``--gpus``; ``gpus`` names the GPUs to check) estimates one of
    N GPUs training together, data parallel, each with its own batch, and ``sharding=`` says
    what they split: ``"ddp"`` (default), ``"zero2"``, ``"zero3"`` or ``"fsdp"``.

    ``mode="inference"`` of a language model: the batch is the concurrency (sequences served
    at once, ``concurrency=`` or ``batch_size=``), the length the ``context`` (prompt tokens;
    default the workload's sequence length), and every sequence's static KV cache holds
    ``new_tokens`` more (default ``DEFAULT_NEW_TOKENS``); the headline is the largest
    concurrency. ``serving="vllm"`` adds that engine's paged-KV-cache answer to each estimate.
    """
    from whichgpu.estimate.memory import StepMemory, estimate_on_gpu

    chosen = _select(workload, config, task, model)
    run = run_config(gpus=gpu_count, **run_options)
    engine = None
    if serving is not None:
        if run.mode != "inference":
            raise UsageError("--serving sizes a serving engine's KV cache; add --mode inference.")
        engine = get_serving_engine(serving)
    check_for_workload(run, chosen.info)
    if run.mode == "inference" and run.concurrency != 1 and run.batch_size is None:
        run = run.model_copy(update={"batch_size": run.concurrency})
    if chosen.info.is_sequence_model and run.seq_len is None and run.mode == "train":
        run = run.model_copy(update={"seq_len": chosen.info.default_seq_len})
    targets = resolve_gpus(gpus)
    software = get_stack(stack)
    if progress is not None:
        progress(f"profiling {chosen.info.name}")
    profile, method = scalable_profile(chosen, run)
    memory = StepMemory(profile)
    seq_limit = chosen.info.max_seq_len
    kv_per_token = None
    if "kv_cache" in profile.choices:  # inference of a language model
        context, new_tokens = inference_context(chosen.info, run)
        if seq_limit is not None:
            seq_limit -= new_tokens
        run = run.model_copy(
            update={"seq_len": context, "context": context, "new_tokens": new_tokens}
        )
        kv_per_token = _kv_bytes_per_token(chosen, config, run)
    elif engine is not None:
        raise UsageError(
            f"--serving applies to language models that generate; {chosen.info.name} does not."
        )
    elif chosen.info.is_sequence_model and run.seq_len is None:
        run = run.model_copy(update={"seq_len": chosen.info.default_seq_len})
    catalog = load_catalog()
    estimates = []
    for gpu in targets:
        if progress is not None:
            progress(gpu.name)
        estimates.append(
            estimate_on_gpu(
                memory,
                run,
                gpu,
                catalog,
                software,
                method=method,
                seq_limit=seq_limit,
                kv_per_token_bytes=kv_per_token,
                serving=engine,
            )
        )
    estimates.sort(key=lambda e: (-e.max_batch_size, -e.headroom_bytes))
    return estimates


def predict(
    workload: str | None = None,
    *,
    config: Path | str | None = None,
    task: str | None = None,
    model: str | None = None,
    gpus: Sequence[str] | None = None,
    gpu_count: int | None = None,
    stack: str | None = None,
    progress: Callable[[str], None] | None = None,
    **run_options: Any,
) -> list[ThroughputEstimate]:
    """How fast? Predicted training throughput on each GPU, ranked, with a band.

    Without ``batch_size`` each GPU runs its own largest batch (as ``fit`` finds it; Lambda's
    convention); with it, every GPU runs that batch. Without ``gpus``, every catalog GPU the
    step fits on and whose speed the catalog describes. Results are sorted fastest first.

    ``gpu_count=N`` (the CLI's ``--gpus``) predicts N such GPUs of one node training data
    parallel (``sharding=`` as for ``fit``): throughput over all of them, and the scaling
    efficiency against N x one GPU (``whichgpu.estimate.data_parallel``).
    """
    from whichgpu.estimate.memory import StepMemory, estimate_on_gpu
    from whichgpu.estimate.throughput import (
        error_band,
        gpu_rates,
        load_parameters,
        op_table,
        peak_flops_per_s,
        step_time,
    )

    chosen = _select(workload, config, task, model)
    run = run_config(gpus=gpu_count, **run_options)
    if run.mode != "train":
        raise UsageError("predict answers training throughput for now (not --mode inference).")
    check_for_workload(run, chosen.info)
    if chosen.info.is_sequence_model and run.seq_len is None:
        run = run.model_copy(update={"seq_len": chosen.info.default_seq_len})
    named = bool(gpus)
    targets = resolve_gpus(gpus)
    software = get_stack(stack)
    params = load_parameters()
    band = error_band(params, chosen.info.family)
    if progress is not None:
        progress(f"profiling {chosen.info.name}")
    profile, method = scalable_profile(chosen, run)
    memory = StepMemory(profile)
    catalog = load_catalog()
    unit = f"{profile.throughput_unit}/s"
    gradient_bytes = parameter_bytes = 0
    if run.gpus > 1:
        from whichgpu.estimate.data_parallel import data_parallel_step, load_links

        links = load_links()
        gradient_bytes = sum(memory.state_sizes("gradient"))
        parameter_bytes = sum(memory.state_sizes("parameter"))
    assumptions = (
        "time of a step = sum over its operators of max(FLOPs / (efficiency x engine "
        "peak x size ramp), bytes / (efficiency x bandwidth), launch floor)",
        f"constants fitted on {params.fitted_on} ({params.fitted_date})",
        f"band = +/-{band:.0%}: the 80th percentile of the leave-one-GPU-out error of "
        "this workload type",
        "synthetic data, no input pipeline or host stalls",
    )
    if run.gpus > 1:
        assumptions += (
            f"{run.gpus} GPUs of one node, data parallel ({run.sharding}): each runs the one-GPU "
            "step on its own batch, then a ring all-reduce of the gradients over NVLink/NVSwitch "
            "(SXM/OAM boards), the bridge (two bridged cards) or PCIe, at the share of the link "
            "NCCL reaches in published all_reduce_perf runs ("
            + ", ".join(f"{k} {v:.0%}" for k, v in links.bus_efficiency.items())
            + "; sources in whichgpu/estimate/data/links.json)",
            "the exchange hides behind backward (behind the whole step for zero3/fsdp) except "
            "the last gradient bucket; the compute is not slowed by the communication beside it",
        )
    out = []
    for gpu in targets:
        try:
            rates = gpu_rates(gpu)
        except UsageError:
            if named:
                raise
            continue
        if progress is not None:
            progress(gpu.name)
        estimate = estimate_on_gpu(
            memory, run, gpu, catalog, software, method=method, search_seq_len=False
        )
        if not estimate.fits and not named:
            continue
        base = {
            "gpu": gpu.id,
            "gpu_name": gpu.name,
            "workload": chosen.info.name,
            "run": estimate.run,
            "batch_size": estimate.batch_size,
            "seq_len": estimate.seq_len,
            "fits": estimate.fits,
            "n_gpus": run.gpus,
            "throughput_unit": unit,
            "band": band,
            "assumptions": assumptions,
            "method": f"{method}; {params.method}",
        }
        if not estimate.fits:
            out.append(
                ThroughputEstimate(
                    **base,
                    step_time_s=None,
                    throughput=None,
                    low=None,
                    high=None,
                    mfu=None,
                    scaling_efficiency=None,
                    time_shares={},
                    tensor_flops_share=0.0,
                )
            )
            continue
        table = op_table(profile, estimate.batch_size, estimate.seq_len)
        step = step_time(table, rates, run.precision, params)
        seconds = step.step_time_s
        shares = {
            "matrix": step.matrix_s / seconds,
            "memory": step.memory_s / seconds,
            "launch": step.launch_s / seconds,
        }
        scaling = None
        if run.gpus > 1:
            parallel = data_parallel_step(
                seconds,
                step.backward_s,
                gradient_bytes,
                parameter_bytes,
                gpu,
                run.gpus,
                run.sharding,
                links,
            )
            seconds = parallel.step_time_s
            scaling = step.step_time_s / seconds
            shares = {k: v * step.step_time_s / seconds for k, v in shares.items()}
            shares["exchange"] = parallel.exposed_s / seconds
            base["link"] = parallel.link.description
        throughput = run.gpus * table.units_per_step / seconds
        out.append(
            ThroughputEstimate(
                **base,
                step_time_s=seconds,
                throughput=throughput,
                low=throughput * (1 - band),
                high=throughput * (1 + band),
                mfu=step.flops / seconds / peak_flops_per_s(rates, run.precision),
                scaling_efficiency=scaling,
                time_shares=shares,
                tensor_flops_share=step.tensor_flops_share,
            )
        )
    out.sort(key=lambda e: -(e.throughput or 0.0))
    return out

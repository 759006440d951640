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

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from whichgpu.catalog import load_catalog
from whichgpu.catalog.stacks import get_stack
from whichgpu.errors import UsageError
from whichgpu.schema import GpuSpec, MemoryEstimate, RunConfig
from whichgpu.workloads import check_for_workload, run_config, select_workload
from whichgpu.workloads.base import Workload
from whichgpu.workloads.registry import get_workload
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


def _is_registered(workload: Workload) -> bool:
    try:
        return get_workload(workload.info.name) is workload
    except Exception:
        return False


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
    stack: str | None = None,
    progress: Callable[[str], None] | None = None,
    **run_options: Any,
) -> list[MemoryEstimate]:
    """Will it fit? Peak memory and the largest batch on each GPU (all of them by default).

    ``run_options`` are the run configuration (``precision="bf16"``, ``seq_len=2048`` …).
    Without ``batch_size`` the largest batch that fits is the headline of each estimate.
    Results are sorted by headroom at that batch, largest first.
    """
    from whichgpu.estimate.memory import StepMemory, estimate_on_gpu

    chosen = select_workload(
        workload,
        Path(config) if config else None,
        task,  # type: ignore[arg-type]
        model=model,
    )
    run = run_config(**run_options)
    if run.mode != "train":
        raise UsageError(
            "fit estimates training steps for now; inference memory (weights + KV cache) comes "
            "with the inference tracer."
        )
    check_for_workload(run, chosen.info)
    if chosen.info.is_sequence_model and run.seq_len is None:
        run = run.model_copy(update={"seq_len": chosen.info.default_seq_len})
    targets = resolve_gpus(gpus)
    software = get_stack(stack)
    if progress is not None:
        progress(f"profiling {chosen.info.name}")
    profile, method = scalable_profile(chosen, run)
    memory = StepMemory(profile)
    catalog = load_catalog()
    estimates = []
    for gpu in targets:
        if progress is not None:
            progress(gpu.name)
        estimates.append(estimate_on_gpu(memory, run, gpu, catalog, software, method=method))
    estimates.sort(key=lambda e: (-e.max_batch_size, -e.headroom_bytes))
    return estimates

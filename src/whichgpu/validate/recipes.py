"""Published training runs of today's recipes against ``fit`` and ``predict`` of the same runs.

The runs (``data/recipes/published.json``, sources in the README beside it) combine what a 2026
training job turns on together — ``torch.compile``, per-operator selective activation
checkpointing, FSDP2, torchao's float8 — on several GPUs of one node. Each is asked of ``fit``
(peak reserved memory per GPU at the run's micro-batch) and of ``predict`` (tokens/s per GPU;
timed as if it fitted where ``fit`` refuses it, as the other references are). Errors are
``predicted / measured - 1``.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from importlib import resources
from typing import Any

from whichgpu.errors import WhichGpuError
from whichgpu.schema import ReferenceMemoryCase, ReferenceThroughputCase, RunConfig
from whichgpu.units import GIB
from whichgpu.validate.timing import fit_options, per_gpu_case, predict_even_if_unfit
from whichgpu.workloads import run_config

SOURCE = "recipes"
"""The reference's id in ``validate`` results."""


@dataclass(frozen=True)
class RecipeRun:
    """One published run (a row of ``published.json``)."""

    id: str
    """The row's id (``torchao-0.10 llama3-8b bf16``)."""
    workload: str
    """The whichgpu workload of the model."""
    gpu: str
    """Catalog id of the GPU."""
    run: RunConfig
    """The run asked: GPUs, sharding, micro-batch, length, precision, compile, checkpointing."""
    tokens_per_s_per_gpu: float
    """Published tokens/s per GPU."""
    peak_reserved_bytes: int
    """Published peak reserved memory per GPU (GiB as published, in bytes)."""
    recipe: str
    """What the run's precision stands for, and what whichgpu models differently."""
    stack: str | None
    """The software stack the run's PyTorch corresponds to (``--stack``; None: the default)."""


def recipe_runs() -> list[RecipeRun]:
    """Every row of ``published.json``, in file order."""
    ref = resources.files("whichgpu.validate").joinpath("data/recipes/published.json")
    doc = json.loads(ref.read_text(encoding="utf-8"))
    return [_row(row) for row in doc["rows"]]


def _row(row: dict[str, Any]) -> RecipeRun:
    run = run_config(
        precision=row["precision"],
        batch_size=int(row["batch_size"]),
        seq_len=int(row["seq_len"]),
        gpus=int(row["gpus"]),
        sharding=row["sharding"],
        compile=bool(row["compile"]),
        checkpointing=row.get("checkpointing_policy") is not None,
        checkpointing_policy=row.get("checkpointing_policy") or "full",
        fp8_recipe=row.get("fp8_recipe"),
    )
    return RecipeRun(
        id=row["id"],
        workload=row["workload"],
        gpu=row["gpu"],
        run=run,
        tokens_per_s_per_gpu=float(row["tokens_per_s_per_gpu"]),
        peak_reserved_bytes=round(float(row["peak_reserved_gib"]) * GIB),
        recipe=row["recipe"],
        stack=row.get("stack"),
    )


def _case(r: RecipeRun) -> dict[str, Any]:
    """What a memory and a speed case of run ``r`` share."""
    return {"source": SOURCE, "case": r.id, "workload": r.workload, "gpu": r.gpu, "run": r.run}


def recipes_memory(
    runs: list[RecipeRun] | None = None, progress: Callable[[str], None] | None = None
) -> list[ReferenceMemoryCase]:
    """``fit``'s peak reserved memory per GPU at each run's micro-batch (default: every row)."""
    from whichgpu.api import fit

    out = []
    for r in recipe_runs() if runs is None else runs:
        if progress is not None:
            progress(r.id)
        base = _case(r)
        try:
            (estimate,) = fit(r.workload, gpus=[r.gpu], stack=r.stack, **fit_options(r.run))
        except WhichGpuError as exc:
            out.append(ReferenceMemoryCase(**base, note=f"fit failed: {exc}"))
            continue
        predicted = estimate.peak_reserved_bytes
        out.append(
            ReferenceMemoryCase(
                **base,
                measured_reserved_bytes=r.peak_reserved_bytes,
                predicted_reserved_bytes=predicted,
                predicted_allocated_bytes=estimate.peak_allocated_bytes,
                predicted_device_bytes=estimate.device_total_bytes,
                reserved_error=predicted / r.peak_reserved_bytes - 1,
                note=r.recipe,
            )
        )
    return out


def recipes_throughput(
    runs: list[RecipeRun] | None = None, progress: Callable[[str], None] | None = None
) -> list[ReferenceThroughputCase]:
    """``predict``'s tokens/s per GPU of each run (default: every row)."""
    out = []
    for r in recipe_runs() if runs is None else runs:
        if progress is not None:
            progress(r.id)
        base = {
            **_case(r),
            "quantity": "tokens/s per GPU",
            "measured": r.tokens_per_s_per_gpu,
        }
        try:
            estimate, fits = predict_even_if_unfit(r.workload, r.gpu, r.run, stack=r.stack)
        except WhichGpuError as exc:
            out.append(ReferenceThroughputCase(**base, predicted=None, note=str(exc)))
            continue
        out.append(per_gpu_case(base, estimate, fits, r.run.gpus, r.recipe))
    return out

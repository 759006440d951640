"""``whichgpu validate memory``: predicted memory and largest batches against measured ones.

Two references. Lambda's 2020 table of the largest batch before running out of memory (see
``data/README.md`` for what it does and does not state): each (model, GPU) is predicted with
the ``lambda-2020`` software stack and the settings of ``lambda2020.LAMBDA_MODELS``, converted
to the table's unit (tokens for the translation models: sentences x sentence length), rounded
down to the sizes Lambda's search could have tried, and compared in grid steps. And
whichgpu's own measurements (``validate.measured``): peak memory at a batch and the largest
batch, each against the prediction of the same run. Beside them, two references measured
outside whichgpu: training runs on an NVIDIA H200 (``validate.h200``: peaks and largest
batches against ``fit`` for that GPU) and MosaicML llm-foundry's published FSDP runs
(``validate.llm_foundry``: does ``fit`` let their micro-batch fit?). ``sources`` picks which
references are compared; the result closes with a summary line per reference and quantity.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from whichgpu.catalog import load_catalog
from whichgpu.catalog.stacks import get_stack
from whichgpu.errors import WhichGpuError
from whichgpu.profiles.stored import profile_key
from whichgpu.schema import (
    FsdpFitCase,
    MeasuredMemoryCase,
    MemoryValidation,
    MemoryValidationCase,
    ReferenceMemoryCase,
    ReferenceSource,
    SourceSummary,
    Verdict,
)
from whichgpu.validate.lambda2020 import LAMBDA_MODELS, lambda_rows
from whichgpu.validate.measured import measured_cases
from whichgpu.validate.summary import SOURCES, count_summary, error_summary
from whichgpu.workloads import get_workload, run_config

LAMBDA_STACK = "lambda-2020"


def on_grid(value: int, grid: list[int]) -> tuple[int, int]:
    """``value`` rounded down to ``grid`` (extended by doubling/halving), and its grid index."""
    points = sorted(set(grid))
    lo, hi = points[0], points[-1]
    extended = [lo // 2**k for k in range(8, 0, -1) if lo // 2**k >= 1] + points
    extended += [hi * 2**k for k in range(1, 12)]
    extended = sorted(set(extended))
    below = [p for p in extended if p <= value]
    if not below:
        return 0, -1
    return below[-1], extended.index(below[-1])


def compare(measured: int, predicted: int, grid: list[int]) -> tuple[int, int, Verdict]:
    """(prediction on the grid, steps from the measurement, verdict)."""
    snapped, index = on_grid(predicted, grid)
    _, measured_index = on_grid(measured, grid) if measured else (0, -1)
    steps = index - measured_index
    verdict: Verdict = "exact" if steps == 0 else ("too high" if steps > 0 else "conservative")
    return snapped, steps, verdict


def validate_memory(
    progress: Callable[[str], None] | None = None,
    sources: Sequence[ReferenceSource] = SOURCES,
) -> MemoryValidation:
    """Predict every case of the chosen references (default: all) and compare."""
    from whichgpu.validate.h200 import h200_memory
    from whichgpu.validate.llm_foundry import foundry_memory
    from whichgpu.validate.recipes import recipes_memory

    lambda_part = _lambda_memory(progress) if "lambda2020" in sources else _NO_LAMBDA
    own = tuple(measured_cases(progress)) if "own" in sources else ()
    gpu_runs = tuple(h200_memory(progress=progress)) if "h200-2026-11" in sources else ()
    fsdp_runs = tuple(foundry_memory(progress=progress)) if "llm-foundry" in sources else ()
    recipe_runs = tuple(recipes_memory(progress=progress)) if "recipes" in sources else ()
    summaries = [
        *(_lambda_summary(lambda_part) if "lambda2020" in sources else ()),
        *(_own_summary(own) if "own" in sources else ()),
        *(_h200_summary(gpu_runs) if "h200-2026-11" in sources else ()),
        *(_foundry_summary(fsdp_runs) if "llm-foundry" in sources else ()),
        *(_recipes_summary(recipe_runs) if "recipes" in sources else ()),
    ]
    return lambda_part.model_copy(
        update={
            "measured": own,
            "gpu_runs": gpu_runs,
            "fsdp_runs": fsdp_runs,
            "recipe_runs": recipe_runs,
            "sources": tuple(s for s in SOURCES if s in sources),
            "summaries": tuple(summaries),
        }
    )


_NO_LAMBDA = MemoryValidation(
    cases=(),
    assumptions=(),
    compared=0,
    exact=0,
    conservative_by_one=0,
    conservative_more=0,
    too_high=0,
)
"""The Lambda part of a validation that does not compare Lambda's table."""


def _lambda_summary(validation: MemoryValidation) -> list[SourceSummary]:
    v = validation
    return [
        count_summary(
            "lambda2020",
            "largest batch (grid steps)",
            v.compared,
            f"{v.exact} exact, {v.conservative_by_one} one step conservative, "
            f"{v.conservative_more} more, {v.too_high} too high "
            f"({v.too_high_evidenced} where the table can show it)",
        )
    ]


def _own_summary(cases: Sequence[MeasuredMemoryCase]) -> list[SourceSummary]:
    live = [
        c.predicted_allocated_bytes / c.measured_allocated_bytes - 1
        for c in cases
        if c.device_kind == "cpu" and c.measured_allocated_bytes
    ]
    reserved = [
        c.predicted_reserved_bytes / c.measured_reserved_bytes - 1
        for c in cases
        if c.measured_reserved_bytes and c.predicted_reserved_bytes is not None
    ]
    searched = [c for c in cases if c.max_batch_verdict is not None]
    out = []
    if live:
        out.append(error_summary("own", "CPU live-tensor peak", live))
    if reserved:
        out.append(error_summary("own", "peak reserved (CUDA)", reserved))
    if searched:
        too_high = sum(c.max_batch_verdict == "too high" for c in searched)
        exact = sum(c.max_batch_verdict == "exact" for c in searched)
        out.append(
            count_summary(
                "own", "largest batch", len(searched), f"{exact} exact, {too_high} too high"
            )
        )
    return out


def _h200_summary(cases: Sequence[ReferenceMemoryCase]) -> list[SourceSummary]:
    at_batch = [c for c in cases if c.measured_reserved_bytes]
    reserved = [c.reserved_error for c in at_batch if c.reserved_error is not None]
    allocated = [
        c.predicted_allocated_bytes / c.measured_allocated_bytes - 1
        for c in at_batch
        if c.measured_allocated_bytes and c.predicted_allocated_bytes is not None
    ]
    under = sum(e < 0 for e in reserved)
    searched = [
        c for c in cases if c.measured_max_batch is not None and c.predicted_max_batch is not None
    ]
    batch_errors = [
        c.predicted_max_batch / c.measured_max_batch - 1  # type: ignore[operator]
        for c in searched
    ]
    failed = [c for c in cases if c.note.startswith("fit failed")]
    return [
        error_summary(
            "h200-2026-11",
            "peak reserved",
            reserved,
            f"{under} of {len(reserved)} predicted under the measurement"
            + (f"; {len(failed)} cases fit could not answer" if failed else ""),
        ),
        error_summary("h200-2026-11", "peak allocated", allocated),
        error_summary(
            "h200-2026-11",
            "largest batch",
            batch_errors,
            f"{sum(c.would_oom for c in searched)} of {len(searched)} predicted above the "
            "measurement (would run out of memory)",
        ),
    ]


def _recipes_summary(cases: Sequence[ReferenceMemoryCase]) -> list[SourceSummary]:
    reserved = [c.reserved_error for c in cases if c.reserved_error is not None]
    under = sum(e < 0 for e in reserved)
    failed = sum(c.note.startswith("fit failed") for c in cases)
    return [
        error_summary(
            "recipes",
            "peak reserved per GPU",
            reserved,
            f"{under} of {len(reserved)} predicted under the measurement"
            + (f"; {failed} cases fit could not answer" if failed else ""),
        )
    ]


def _foundry_summary(cases: Sequence[FsdpFitCase]) -> list[SourceSummary]:
    from whichgpu.validate.llm_foundry import stale_profiles_note

    stale = stale_profiles_note()
    answered = [c for c in cases if c.fits is not None]
    refused = sum(not c.fits for c in answered)
    unanswered = len(cases) - len(answered)
    return [
        count_summary(
            "llm-foundry",
            "fits at the run's micro-batch",
            len(answered),
            f"{refused} of {len(answered)} runs that ran are said not to fit"
            + (f"; {unanswered} not answered" if unanswered else "")
            + (f"; {stale}" if stale else ""),
        )
    ]


def _lambda_memory(progress: Callable[[str], None] | None) -> MemoryValidation:
    """Lambda's 2020 table, every case predicted with the ``lambda-2020`` stack."""
    from whichgpu.api import scalable_profile
    from whichgpu.estimate.memory import StepMemory, estimate_on_gpu
    from whichgpu.estimate.replay_cache import step_memory

    catalog = load_catalog()
    stack = get_stack(LAMBDA_STACK)
    rows = lambda_rows()
    cases: list[MemoryValidationCase] = []
    memories: dict[str, tuple[StepMemory, str]] = {}
    for row in rows:
        model = LAMBDA_MODELS[row["model"]]
        gpu = catalog.resolve(row["gpu"])
        measured = int(row["max_batch_size"] or 0)
        unit = row["batch_unit"]
        column = [
            int(r["max_batch_size"])
            for r in rows
            if r["model"] == row["model"] and r["max_batch_size"]
        ]
        grid = [2**k for k in range(0, 17)] if model.power_of_two else column
        base = {
            "reference": "lambda2020",
            "model": row["model"],
            "workload": model.workload,
            "gpu": gpu.id,
            "unit": unit,
            "measured_max_batch": measured,
        }
        try:
            workload = get_workload(model.workload)
        except WhichGpuError as exc:
            cases.append(_skipped(base, f"no workload: {exc}"))
            continue
        run = run_config(precision=model.precision)
        if workload.info.is_sequence_model:
            length = model.seq_len or workload.info.default_seq_len
            run = run.model_copy(update={"seq_len": length})
        if model.workload not in memories:
            if progress is not None:
                progress(model.workload)
            try:
                profile, method = scalable_profile(workload, run)
            except WhichGpuError as exc:
                cases.append(_skipped(base, str(exc)))
                continue
            stem = profile_key(model.workload, run)
            memories[model.workload] = (step_memory(profile, stem), method)
        memory, method = memories[model.workload]
        estimate = estimate_on_gpu(memory, run, gpu, catalog, stack, method=method)
        predicted = estimate.max_batch_size
        if unit == "tokens":
            predicted *= run.seq_len or 1
        snapped, steps, verdict = compare(measured, predicted, grid)
        cases.append(
            MemoryValidationCase(
                **base,
                predicted_max_batch=predicted,
                predicted_on_grid=snapped,
                steps=steps,
                verdict=verdict,
                note="" if measured else "the reference could not run it at all",
                framework=model.framework,
                batches_set_by_hand=model.batches_set_by_hand,
            )
        )
    judged = [c for c in cases if c.verdict in ("exact", "conservative", "too high")]
    return MemoryValidation(
        cases=tuple(cases),
        assumptions=(
            f"software stack {stack.label}",
            *(m.settings(name) for name, m in LAMBDA_MODELS.items()),
            "translation batches in tokens = sentences x sentence length",
            "image models compared at power-of-two granularity; token counts and BERT "
            "fine-tuning on the values their columns use",
            "the reference ran each model's authors' code (TensorFlow, Darknet, PyTorch 2019: "
            "the framework column), whichgpu models today's PyTorch; a prediction above the "
            "reference is evidence of an over-estimate only where the reference ran PyTorch "
            "with searched batches, or could not run the model at all (the 'evidenced' count); "
            "the token columns and BERT fine-tuning hold round values set by hand (Lambda's "
            "harnesses size batches by hand per memory class), which a larger batch may exceed",
        ),
        compared=len(judged),
        exact=sum(c.verdict == "exact" for c in judged),
        conservative_by_one=sum(c.steps == -1 for c in judged),
        conservative_more=sum(c.steps < -1 for c in judged),
        too_high=sum(c.verdict == "too high" for c in judged),
        too_high_evidenced=sum(c.verdict == "too high" and _evidenced(c) for c in judged),
    )


def _evidenced(case: MemoryValidationCase) -> bool:
    """Whether the reference can show this prediction too high: it could not run the model
    at all, or it ran PyTorch code (what the workloads model) with searched batches."""
    if case.measured_max_batch == 0:
        return True
    return case.framework.startswith("PyTorch") and not case.batches_set_by_hand


def _skipped(base: dict[str, object], why: str) -> MemoryValidationCase:
    return MemoryValidationCase(
        **base,
        predicted_max_batch=0,
        predicted_on_grid=0,
        steps=0,
        verdict="skipped",
        note=why,
    )

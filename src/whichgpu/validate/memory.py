"""``whichgpu validate memory``: predicted memory and largest batches against measured ones.

Two references. Lambda's 2020 table of the largest batch before running out of memory (see
``data/README.md`` for what it does and does not state): each (model, GPU) is predicted with
the ``lambda-2020`` software stack and the settings of ``lambda2020.LAMBDA_MODELS``, converted
to the table's unit (tokens for the translation models: sentences x sentence length), rounded
down to the sizes Lambda's search could have tried, and compared in grid steps. And
whichgpu's own measurements (``validate.measured``): peak memory at a batch and the largest
batch, each against the prediction of the same run.
"""

from __future__ import annotations

from collections.abc import Callable

from whichgpu.catalog import load_catalog
from whichgpu.catalog.stacks import get_stack
from whichgpu.errors import WhichGpuError
from whichgpu.schema import MemoryValidation, MemoryValidationCase, Verdict
from whichgpu.validate.lambda2020 import LAMBDA_MODELS, lambda_rows
from whichgpu.validate.measured import measured_cases
from whichgpu.workloads import get_workload, run_config
from whichgpu.workloads.stored import profile_key

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


def validate_memory(progress: Callable[[str], None] | None = None) -> MemoryValidation:
    """Predict every case of the reference table and compare."""
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
        measured=tuple(measured_cases(progress)),
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

"""``fit`` and ``predict`` of a measured run, timed also where ``fit`` says it does not fit.

A reference that ran a step proves it fitted; ``predict`` gives no speed for a batch ``fit``
refuses, so a memory over-estimate would hide the speed error of that case. Here such a case
is timed by the same predictor at the same batch as if it fitted (the time of a step does not
depend on the memory answer), and says so, so that ``validate throughput`` measures the
throughput model on every case and ``validate memory`` the memory model.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from whichgpu.schema import ReferenceThroughputCase, RunConfig, ThroughputEstimate

UNFIT_NOTE = "fit refuses it: timed as if it fitted"
"""A case's note when ``fit`` says the measured run does not fit."""


def fit_options(run: RunConfig) -> dict[str, Any]:
    """``api.fit`` / ``api.predict`` keyword arguments for ``run`` (what differs from the
    defaults; the GPU count as ``gpu_count``)."""
    options = run.model_dump(exclude_defaults=True)
    if "gpus" in options:
        options["gpu_count"] = options.pop("gpus")
    return options


def predict_even_if_unfit(
    workload: str | None,
    gpu: str,
    run: RunConfig,
    config: Path | None = None,
    task: str | None = None,
    stack: str | None = None,
) -> tuple[ThroughputEstimate, bool]:
    """``predict``'s answer for ``run`` on the catalog ``gpu`` (a named ``workload`` or a
    ``config`` file with its ``task``) under the software ``stack`` (None: the default), and
    whether ``fit`` says it fits; when it does not, the answer is the predictor's timing of
    the step at the run's batch as if it fitted."""
    from whichgpu.api import predict

    (estimate,) = predict(
        workload, config=config, task=task, gpus=[gpu], stack=stack, **fit_options(run)
    )
    if estimate.fits or estimate.speed_unknown is not None:
        return estimate, estimate.fits
    return _timed_as_if_fitting(workload, gpu, estimate.run, config, task, stack), False


def per_gpu_case(
    base: dict[str, Any], estimate: ThroughputEstimate, fits: bool, gpus: int, note: str
) -> ReferenceThroughputCase:
    """A tokens/s-per-GPU case: ``base`` (its reference, run and measurement) against
    ``estimate``'s throughput over the run's ``gpus``, with ``note`` (and, where ``fit``
    refused the run, ``UNFIT_NOTE``)."""
    per_gpu = None if estimate.throughput is None else estimate.throughput / gpus
    return ReferenceThroughputCase(
        **base,
        predicted=per_gpu,
        error=None if per_gpu is None else per_gpu / base["measured"] - 1,
        predicted_mfu=estimate.mfu,
        fits=fits,
        note="; ".join(n for n in (note, "" if fits else UNFIT_NOTE) if n),
    )


def _timed_as_if_fitting(
    workload: str | None,
    gpu: str,
    run: RunConfig,
    config: Path | None,
    task: str | None,
    stack: str | None,
) -> ThroughputEstimate:
    """The predictor's answer for ``run`` on ``gpu`` with the memory answer's ``fits`` set:
    ``api.predict``'s own steps, for one GPU."""
    from whichgpu.api import _predictor, _prepare, _select
    from whichgpu.catalog import load_catalog
    from whichgpu.catalog.stacks import get_stack
    from whichgpu.estimate.memory import estimate_on_gpu
    from whichgpu.estimate.throughput import gpu_rates

    chosen = _select(workload, config, task, None)
    step = _prepare(chosen, run, config, None)
    catalog = load_catalog()
    spec = catalog.resolve(gpu)
    software = get_stack(stack)
    memory = estimate_on_gpu(
        step.memory,
        step.run,
        spec,
        catalog,
        software,
        method=step.method,
        search_seq_len=False,
        experts=step.experts,
    )
    return _predictor(chosen, step, software).on_gpu(
        spec, gpu_rates(spec, software), memory.model_copy(update={"fits": True})
    )

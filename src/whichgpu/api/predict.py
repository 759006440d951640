"""``predict``: how fast? A step's predicted throughput on each GPU, ranked, with a band.

The prepared step (``api.step``) is sized on each GPU by the memory model and timed by the
throughput model (``estimate.prediction.ThroughputPredictor``); ``calibrate=`` corrects the
predictions by a measurement of the same run (``estimate.calibration``). What a
whole-catalog question leaves out is said in the result list's ``notes``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from whichgpu.api.step import Asked, Step, ask, keep_replays, predictor, select
from whichgpu.catalog import load_catalog
from whichgpu.errors import MissingRates, UsageError
from whichgpu.schema import BenchResult, SoftwareStack, ThroughputEstimate
from whichgpu.tabular import ResultList
from whichgpu.workloads import run_config
from whichgpu.workloads.base import Workload

if TYPE_CHECKING:
    from whichgpu.estimate.calibration import Calibration


def predict(
    workload: str | None = None,
    *,
    config: Path | str | None = None,
    task: str | None = None,
    model: str | None = None,
    gpus: Sequence[str] | None = None,
    gpu_count: int | None = None,
    stack: str | None = None,
    calibrate: Path | str | BenchResult | None = None,
    store: Path | str | None = None,
    progress: Callable[[str], None] | None = None,
    **run_options: Any,
) -> ResultList[ThroughputEstimate]:
    """How fast? Predicted throughput on each GPU, ranked, with a band.

    Without ``batch_size`` each GPU runs its own largest batch (as ``fit`` finds it; Lambda's
    convention); with it, every GPU runs that batch. Without ``gpus``, every catalog GPU the
    step fits on and whose speed the catalog describes. Results are sorted fastest first.

    ``gpu_count=N`` (the CLI's ``--gpus``) predicts N such GPUs of one node training data
    parallel (``sharding=`` as for ``fit``): throughput over all of them, and the scaling
    efficiency against N x one GPU (``whichgpu.estimate.data_parallel``).

    ``mode="inference"``: a language model serves ``concurrency`` sequences (default: the
    most that fit) of ``context`` prompt tokens and ``new_tokens`` generated ones; throughput
    is generated tokens/s, with the prefill time (time to first token) and the decode step
    time (time per output token). Other models: one forward pass per batch.

    ``calibrate``: a measurement of the same run on one GPU — a ``BenchResult``, a file that
    ``whichgpu results export`` or ``bench --json`` wrote, or the id of a result in ``store``
    (default: the user's results store) — whose measured / predicted ratio corrects every GPU's
    prediction (``whichgpu.estimate.calibration``); the band becomes that correction's
    validated error.
    """
    chosen = select(workload, config, task, model)
    run = run_config(gpus=gpu_count, **run_options)
    asked = ask(
        chosen, run, gpus=gpus, stack=stack, config=config, progress=progress, one_node=True
    )
    measured = _calibration_source(calibrate, store) if calibrate is not None else None
    if measured is not None and asked.step.run.mode != "train":
        raise UsageError(
            "--calibrate corrects training predictions only; compare an inference "
            "prediction with your bench result (whichgpu results show) instead."
        )
    out, unfit, untimed = _speeds(asked, named=bool(gpus), progress=progress)
    if measured is not None:
        from whichgpu.estimate.calibration import calibrate as correct
        from whichgpu.estimate.calibration import matching_measurement
        from whichgpu.store import catalog_gpu

        result = matching_measurement(
            measured, chosen.info.name, asked.step.run, lambda gpu: catalog_gpu(gpu) is not None
        )
        calibration, band = calibration_of(chosen, asked.step, result, asked.software)
        out = correct(out, calibration, band)
    out.sort(key=lambda e: -(e.throughput or 0.0))
    keep_replays()
    alone_unfit = not out and asked.step.run.gpus == 1
    return ResultList(out, notes=_left_out_notes(unfit, untimed, suggest_sharding=alone_unfit))


def _speeds(
    asked: Asked, *, named: bool, progress: Callable[[str], None] | None
) -> tuple[list[ThroughputEstimate], int, list[tuple[str, UsageError]]]:
    """The step timed on each GPU asked about; GPUs it does not fit on count as unfit and,
    unless ``named``, are left out, as are the GPUs it fits on that cannot be timed (with
    why). One GPU alone that cannot be timed raises its error."""
    from whichgpu.estimate.memory import estimate_on_gpu
    from whichgpu.estimate.throughput import gpu_rates

    step, targets = asked.step, asked.targets
    timer = predictor(asked.chosen, step)
    catalog = load_catalog()
    out: list[ThroughputEstimate] = []
    unfit = 0
    untimed: list[tuple[str, UsageError]] = []  # GPUs that fit but cannot be timed, and why
    for gpu in targets:
        unknown: UsageError | None = None
        try:
            rates = gpu_rates(gpu)
        except MissingRates as exc:
            if len(targets) == 1:
                raise
            unknown = exc  # the others are answered; this one says why it is not
        if progress is not None:
            progress(gpu.name)
        estimate = estimate_on_gpu(
            step.memory,
            step.run,
            gpu,
            catalog,
            asked.software,
            method=step.method,
            search_seq_len=False,
            kv_per_token_bytes=step.kv_per_token,
            kv_head_count=step.kv_heads,
        )
        if not estimate.fits and not named:
            unfit += 1
            continue
        if unknown is None:
            try:
                out.append(timer.on_gpu(gpu, rates, estimate))
                continue
            except UsageError as exc:  # the catalog lacks what timing several of it needs
                if len(targets) == 1:
                    raise
                unknown = exc
        if named:
            out.append(timer.unknown_on_gpu(gpu, estimate, str(unknown)))
        elif unknown is not None:
            untimed.append((gpu.name, unknown))
    return out, unfit, untimed


def _left_out_notes(
    unfit: int, untimed: Sequence[tuple[str, UsageError]], *, suggest_sharding: bool
) -> tuple[str, ...]:
    """What a whole-catalog ``predict`` leaves out, in words: how many GPUs the step does not
    fit on (and, when it fits on none alone, how to spread it), and the GPUs it fits on whose
    speed the catalog cannot describe, by what it lacks."""
    notes = [f"{unfit} catalog GPUs are left out: the step does not fit on them."] if unfit else []
    if unfit and suggest_sharding:
        notes.append(
            "To spread the model over several GPUs, ask with --gpus N and --sharding fsdp "
            "(whichgpu fit shows the memory per GPU)."
        )
    by_gap: dict[str, list[str]] = {}
    for name, exc in untimed:
        if isinstance(exc, MissingRates):
            by_gap.setdefault(", ".join(exc.missing), []).append(name)
        else:
            notes.append(f"{name} is left out, as its speed cannot be predicted: {exc}")
    notes += [
        f"{', '.join(names)} {'are' if len(names) > 1 else 'is'} left out: the step fits, but "
        f"the catalog lacks {gap}, so the speed cannot be predicted."
        for gap, names in by_gap.items()
    ]
    return tuple(notes)


def _calibration_source(
    source: Path | str | BenchResult, store: Path | str | None
) -> list[BenchResult]:
    """The measurements ``--calibrate`` names: a result, a results file, or a stored id."""
    from whichgpu.store import ImportFileError, ResultStore, format_of, read_results_file

    if isinstance(source, BenchResult):
        return [source]
    path = Path(source)
    if path.exists():
        try:
            return [r for _, r in read_results_file(path, format_of(path))]
        except ImportFileError as exc:
            raise UsageError(
                f"--calibrate: {path} cannot be read as measurements: "
                f"{'; '.join(exc.problems[:3])}. Give a file that `whichgpu results export` or "
                "`bench --json` wrote, or a stored result's id."
            ) from exc
    if path.suffix.lower() in (".json", ".csv") or len(path.parts) > 1:
        raise UsageError(f"--calibrate: no file {path}. Give a results file or a result id.")
    return [ResultStore(Path(store) if store else None).get(str(source))]


def calibration_of(
    chosen: Workload, step: Step, result: BenchResult, software: SoftwareStack
) -> tuple[Calibration, float]:
    """What ``result`` (a measurement on one catalog GPU) says of the model's error for this
    run, and the band of predictions it corrects."""
    from whichgpu.estimate.calibration import Calibration
    from whichgpu.estimate.memory import estimate_on_gpu
    from whichgpu.estimate.prediction import ThroughputPredictor
    from whichgpu.estimate.throughput import error_band, gpu_rates

    assert result.gpu is not None
    catalog = load_catalog()
    reference = catalog.resolve(result.gpu)
    one_gpu = step.run.model_copy(update={"batch_size": result.batch_size, "gpus": 1})
    at_batch = estimate_on_gpu(
        step.memory,
        one_gpu,
        reference,
        catalog,
        software,
        method=step.method,
        search_seq_len=False,
    )
    alone = ThroughputPredictor(
        step.profile, one_gpu, family=chosen.info.family, method=step.method
    )
    prediction = alone.on_gpu(reference, gpu_rates(reference), at_batch)
    if prediction.throughput is None:
        raise UsageError(
            f"--calibrate: the measured batch {result.batch_size} does not fit "
            f"{reference.name} in the memory model, so it cannot be compared."
        )
    band = error_band(alone.params, step.profile.workload, chosen.info.family, calibrated=True)
    calibration = Calibration(
        result=result, predicted=prediction.throughput, predicted_mfu=prediction.mfu
    )
    calibration.check()  # a measurement that is not possible corrects nothing
    return calibration, band

"""``predict``: how fast? A step's predicted throughput on each GPU, ranked, with a band.

The prepared step (``api.step``) is sized on each GPU by the memory model and timed by the
throughput model (``estimate.prediction.ThroughputPredictor``); ``calibrate=`` corrects the
predictions by a measurement of the same run (``estimate.calibration``); a serving engine's
answer (``--serving``) comes from ``api.serving``. What a whole-catalog question leaves out is
said in the result list's ``notes``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from whichgpu.api.requests import PredictRequest, Target
from whichgpu.api.serving import (
    checked_kv_cache_dtype,
    checked_quantization,
    checked_requests,
    engine_asked,
    engine_fits,
    engine_quantization,
    served_tokens_per_s,
    serving_speed_on_gpu,
)
from whichgpu.api.step import Asked, Step, ask, keep_replays, predictor, select_target
from whichgpu.catalog import load_catalog
from whichgpu.errors import MissingRates, UsageError, option
from whichgpu.schema import (
    BenchResult,
    GpuSpec,
    MemoryEstimate,
    ServingEngine,
    SoftwareStack,
    ThroughputEstimate,
)
from whichgpu.tabular import ResultList
from whichgpu.workloads import run_config
from whichgpu.workloads.base import Workload

if TYPE_CHECKING:
    from whichgpu.catalog.query import Catalog
    from whichgpu.estimate.calibration import Calibration
    from whichgpu.estimate.engine_speed import (
        Quantization,
        QuantizedPath,
    )
    from whichgpu.estimate.prediction import ThroughputPredictor
    from whichgpu.estimate.throughput import GpuRates


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
    serving: str | None = None,
    tpot_ms: float | None = None,
    ttft_ms: float | None = None,
    quantization: Quantization | None = None,
    kv_cache_dtype: str | None = None,
    requests: int | None = None,
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

    ``serving="vllm"`` (or ``"tensorrt-llm"``, ``"sglang"``; inference of a language model): each
    answer also carries ``serving_speed``, the engine's speed (``whichgpu.estimate.engine_speed``:
    CUDA-graph decode near the roofline, chunked prefill): TTFT, TPOT, output tokens/s and
    their growth with the concurrency, the cost per million output tokens where the catalog
    rents the GPU, and with ``tpot_ms`` / ``ttft_ms`` the largest concurrency within those
    targets. Without ``concurrency`` the engine serves the most its KV cache holds; a GPU is
    left out when the engine's KV cache cannot hold the sequences (``fit --serving``).
    ``quantization="int4"`` (``"int8"``, ``"fp8"``; with ``serving``) serves quantized weights
    (``engine_quantization``); a GPU the engine cannot run them on is left out with why.
    ``kv_cache_dtype="fp8"`` (with ``serving``) keeps the engine's KV cache in fp8: twice the
    tokens in the same memory, half the KV bytes a decode step reads (``checked_kv_cache_dtype``);
    a GPU the engine has no fp8 KV cache on is left out with why.
    ``requests=N`` (with ``serving``) also simulates a closed-loop benchmark of N requests at
    the concurrency, as ``vllm bench serve --max-concurrency C --num-prompts N --request-rate
    inf`` runs it: ``serving_speed.benchmark`` holds its mean and median TTFT and TPOT and its
    output tokens/s (``whichgpu.estimate.engine_run``).

    The keywords become a ``PredictRequest``, answered by ``answer_predict``.
    """
    request = PredictRequest(
        Target(workload, config, task, model),
        run_config(gpus=gpu_count, **run_options),
        gpus=gpus,
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
    return answer_predict(request, progress=progress)


def answer_predict(
    request: PredictRequest, *, progress: Callable[[str], None] | None = None
) -> ResultList[ThroughputEstimate]:
    """``predict``'s answer to a typed request (see ``predict`` for what it means);
    ``progress`` hears each GPU, and each size while a step is traced."""
    chosen = select_target(request.target)
    run = request.run
    engine = engine_asked(request.serving, run.mode, request.tpot_ms, request.ttft_ms)
    quantization = checked_quantization(request.quantization, engine, run)
    kv_cache_dtype = checked_kv_cache_dtype(request.kv_cache_dtype, engine, run)
    requests = checked_requests(request.requests, engine, run)
    asked = ask(
        chosen,
        run,
        gpus=request.gpus,
        stack=request.stack,
        config=request.target.config,
        progress=progress,
        one_node=True,
    )
    compiled_quantization = quantization if engine is None else None  # compiled decoding's
    asked = replace(
        asked,
        step=replace(asked.step, kv_cache_dtype=kv_cache_dtype, quantization=compiled_quantization),
    )
    calibrate = request.calibrate
    measured = _calibration_source(calibrate, request.store) if calibrate is not None else None
    if measured is not None and asked.step.run.mode != "train":
        raise UsageError(
            "--calibrate corrects training predictions only; compare an inference "
            "prediction with your bench result (whichgpu results show) instead."
        )
    if engine is not None and (asked.step.kv_per_token is None or asked.step.model_config is None):
        raise UsageError(
            f"{option('serving')} applies to language models that generate; "
            f"{chosen.info.name} does not."
        )
    out, unfit, untimed = _speeds(
        asked,
        named=bool(request.gpus),
        progress=progress,
        engine=engine,
        targets_ms=(request.tpot_ms, request.ttft_ms),
        quantization=quantization,
        requests=requests,
    )
    if measured is not None:
        from whichgpu.estimate.calibration import calibrate as correct
        from whichgpu.estimate.calibration import matching_measurement
        from whichgpu.store import catalog_gpu

        result = matching_measurement(
            measured, chosen.info.name, asked.step.run, lambda gpu: catalog_gpu(gpu) is not None
        )
        calibration, band = calibration_of(chosen, asked.step, result, asked.software)
        out = correct(out, calibration, band)
    if engine is not None:
        out.sort(key=lambda e: -served_tokens_per_s(e.serving_speed))
    else:
        out.sort(key=lambda e: -(e.throughput or 0.0))
    keep_replays()
    alone_unfit = not out and asked.step.run.gpus == 1
    return ResultList(out, notes=_left_out_notes(unfit, untimed, suggest_sharding=alone_unfit))


def _speeds(
    asked: Asked,
    *,
    named: bool,
    progress: Callable[[str], None] | None,
    engine: ServingEngine | None = None,
    targets_ms: tuple[float | None, float | None] = (None, None),
    quantization: Quantization | None = None,
    requests: int | None = None,
) -> tuple[list[ThroughputEstimate], int, list[tuple[str, UsageError]]]:
    """The step timed on each GPU asked about; GPUs it does not fit on count as unfit and,
    unless ``named``, are left out, as are the GPUs it fits on that cannot be timed (with
    why). One GPU alone that cannot be timed raises its error. With ``engine``, fitting is the
    engine's (its KV cache holds the sequences) and each answer carries the engine's speed."""
    from whichgpu.estimate.throughput import gpu_rates

    step, targets = asked.step, asked.targets
    alone = len(targets) == 1
    timer = predictor(asked.chosen, step, asked.software)
    catalog = load_catalog()
    out: list[ThroughputEstimate] = []
    unfit = 0
    untimed: list[tuple[str, UsageError]] = []  # GPUs that fit but cannot be timed, and why
    for gpu in targets:
        refused = _refused(step, gpu, alone=alone)
        if refused is not None:
            untimed.append((gpu.name, refused))
            continue
        unknown: UsageError | None = None
        try:
            rates = gpu_rates(gpu, asked.software)
        except MissingRates as exc:
            if alone:
                raise
            unknown = exc  # the others are answered; this one says why it is not
        if progress is not None:
            progress(gpu.name)
        sized = _sized_on_gpu(asked, gpu, catalog, engine, quantization, alone=alone)
        if isinstance(sized, UsageError):
            untimed.append((gpu.name, sized))
            continue
        estimate, path = sized
        fits = estimate.fits if engine is None else engine_fits(estimate, step.run)
        if not fits and not named:
            unfit += 1
            continue
        if unknown is None:
            timed = _timed_on_gpu(
                asked,
                timer,
                gpu,
                rates,
                estimate,
                engine,
                targets_ms,
                catalog,
                path,
                alone=alone,
                requests=requests,
            )
            if isinstance(timed, ThroughputEstimate):
                out.append(timed)
                continue
            unknown = timed
        if named:
            out.append(timer.unknown_on_gpu(gpu, estimate, str(unknown)))
        elif unknown is not None:
            untimed.append((gpu.name, unknown))
    return out, unfit, untimed


def _refused(step: Step, gpu: GpuSpec, *, alone: bool) -> UsageError | None:
    """Why ``gpu`` cannot run the step's fp8, its paged optimizer or its ``torch.compile`` at
    all (None: it can, or the step has none of them); a GPU asked about ``alone`` raises it."""
    from whichgpu.estimate.compiled import compile_refusal
    from whichgpu.estimate.fp8 import Fp8Refused, check_gpu, fp8_refusal
    from whichgpu.estimate.paged import paged_refusal

    why = paged_refusal(step.run, gpu) or compile_refusal(step.run, gpu)
    if why is not None:
        if alone:
            raise UsageError(f"{why}.")
        return UsageError(why)
    if step.run.precision != "fp8" or (why := fp8_refusal(gpu)) is None:
        return None
    if alone:
        check_gpu(gpu)
    return Fp8Refused(why)


def _sized_on_gpu(
    asked: Asked,
    gpu: GpuSpec,
    catalog: Catalog,
    engine: ServingEngine | None,
    quantization: Quantization | None,
    *,
    alone: bool,
) -> tuple[MemoryEstimate, QuantizedPath | None] | UsageError:
    """The step's memory on ``gpu`` at the asked batch (with ``engine``, its KV budget for the
    weights stored as ``quantization`` says) and how the engine runs those weights there
    (``engine_quantization``); or why the engine cannot run them there, which a GPU asked
    about ``alone`` raises."""
    from whichgpu.api.serving import compiled_weights
    from whichgpu.estimate.engine_speed import QuantizationRefused
    from whichgpu.estimate.memory import estimate_on_gpu

    step = asked.step
    try:
        quantized = compiled_weights(step, gpu)
    except QuantizationRefused as exc:
        if alone:
            raise
        return exc
    estimate = estimate_on_gpu(
        step.memory,
        step.run,
        gpu,
        catalog,
        asked.software,
        method=step.method,
        compiled_saving=step.compiled,
        experts=step.experts,
        search_seq_len=False,
        kv_per_token_bytes=step.kv_per_token,
        kv_head_count=step.kv_heads,
        serving=engine,
        quantized=quantized,
    )
    if engine is None:
        return estimate, None
    try:
        return engine_quantization(step, engine, gpu, estimate, asked.software, quantization)
    except QuantizationRefused as exc:
        if alone:
            raise
        return exc


def _timed_on_gpu(
    asked: Asked,
    timer: ThroughputPredictor,
    gpu: GpuSpec,
    rates: GpuRates,
    estimate: MemoryEstimate,
    engine: ServingEngine | None,
    targets_ms: tuple[float | None, float | None],
    catalog: Catalog,
    path: QuantizedPath | None,
    *,
    alone: bool,
    requests: int | None = None,
) -> ThroughputEstimate | UsageError:
    """The step's predicted speed on ``gpu`` (with ``engine``, carrying the engine's speed,
    ``serving_speed_on_gpu``); or why the catalog cannot time it (it lacks what timing several
    of it needs), which a GPU asked about ``alone`` raises."""
    try:
        answer = timer.on_gpu(gpu, rates, estimate)
        if engine is not None:
            speed = serving_speed_on_gpu(
                asked.step,
                engine,
                gpu,
                rates,
                estimate,
                targets_ms,
                catalog,
                path=path,
                requests=requests,
            )
            answer = answer.model_copy(update={"serving_speed": speed})
    except UsageError as exc:
        if alone:
            raise
        return exc
    return answer


def _left_out_notes(
    unfit: int, untimed: Sequence[tuple[str, UsageError]], *, suggest_sharding: bool
) -> tuple[str, ...]:
    """What a whole-catalog ``predict`` leaves out, in words: how many GPUs the step does not
    fit on (and, when it fits on none alone, how to spread it), and the GPUs it fits on whose
    speed the catalog cannot describe, by what it lacks."""
    from whichgpu.estimate.fp8 import Fp8Refused

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
            notes.append(
                f"{name} is left out: {exc}."
                if isinstance(exc, Fp8Refused)  # fp8 cannot run there at all
                else f"{name} is left out, as its speed cannot be predicted: {exc}"
            )
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
        compiled_saving=step.compiled,
        experts=step.experts,
        search_seq_len=False,
    )
    alone = ThroughputPredictor(
        step.profile,
        one_gpu,
        family=chosen.info.family,
        method=step.method,
        compiled_kernels=None if step.compiled is None else step.compiled.kernels,
        compiled_causal_mask=software.compiled_causal_mask,
    )
    prediction = alone.on_gpu(reference, gpu_rates(reference, software), at_batch)
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

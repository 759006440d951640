"""``recommend``: which GPU? Every candidate sized and timed for the run, then ranked for the
question.

The question's policy (a preset's values, how the options combine) is
``whichgpu.ranking.question``'s; the ranking (prices, constraints, order, reasons) is
``whichgpu.ranking.rank``'s. This module sizes the step on every GPU and count asked about
(``estimate.memory``), times it (``estimate.prediction``, corrected by the newest stored
measurement of the same run on one GPU) and finds the stored measurements of it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from whichgpu.api.catalog import resolve_gpus
from whichgpu.api.predict import calibration_of
from whichgpu.api.requests import RecommendRequest, RunOptions, Target
from whichgpu.api.serving import (
    checked_kv_cache_dtype,
    checked_quantization,
    compiled_weights,
    engine_quantization,
    serving_speed_on_gpu,
)
from whichgpu.api.step import Step, keep_replays, predictor, prepare, select
from whichgpu.catalog import load_catalog
from whichgpu.catalog.stacks import get_stack
from whichgpu.errors import NotSplittable, UsageError, option
from whichgpu.profiles.scalable import ScalableProfile
from whichgpu.ranking.question import (
    AUTO_CLUSTERS,
    ask,
    check_provider,
    gpu_counts,
    keep_vendor,
)
from whichgpu.ranking.question import Asked as QuestionAsked
from whichgpu.schema import (
    GENERATED_RATE_NOTE,
    BenchResult,
    GpuSpec,
    Ranking,
    RunConfig,
    ServingEngine,
    SoftwareStack,
)
from whichgpu.workloads import check_for_workload, run_config
from whichgpu.workloads.base import Workload

if TYPE_CHECKING:
    from whichgpu.catalog.query import Catalog
    from whichgpu.estimate.calibration import Calibration
    from whichgpu.estimate.engine_speed import KvCacheDtype, Quantization
    from whichgpu.estimate.prediction import ThroughputPredictor
    from whichgpu.ranking.rank import Option


def recommend(
    workload: str | None = None,
    *,
    config: Path | str | None = None,
    task: str | None = None,
    model: str | None = None,
    preset: str | None = None,
    acquire: str | None = None,
    budget_usd: float | None = None,
    within_hours: float | None = None,
    used: bool | None = None,
    gpu_only: bool = False,
    provider: str | None = None,
    gpu_count: int | str | None = None,
    gpus: Sequence[str] | None = None,
    vendor: str | None = None,
    hours: float | None = None,
    samples: float | None = None,
    tokens: float | None = None,
    epochs: float | None = None,
    dataset_size: int | None = None,
    min_batch: int | None = None,
    region: str | None = None,
    top: int | None = None,
    sort: str | None = None,
    serving: str | None = None,
    quantization: str | None = None,
    kv_cache_dtype: str | None = None,
    stack: str | None = None,
    store: Path | str | None = None,
    prices: Sequence[Path | str] | None = None,
    progress: Callable[[str], None] | None = None,
    **run_options: Any,
) -> Ranking:
    """Which GPU? Every catalog GPU (or ``gpus``) that fits, ranked for the question, with why.

    ``acquire``: ``"buy"`` (purchase + electricity, at a GPU's used price where lower unless
    ``used=False``; ``gpu_only=True`` without the computer) or ``"rent"`` (cloud rate;
    ``provider`` to pick one). A job size — ``hours``, ``samples``, ``tokens`` or
    ``epochs`` x ``dataset_size`` — ranks by the cost to finish it; without one, by throughput
    per dollar (``sort`` chooses: ``cost``, ``perf-per-dollar``, ``time``, ``throughput``).
    ``gpu_count``: N GPUs per machine, ``"auto"`` (1, 2, 4 and 8; clusters of 16, 32 and 64
    only when none finishes within ``within_hours``) or a range ``"1-4"``; beyond 8 (a
    multiple of 8, or a range such as ``"8-64"``), training on a cluster of machines of 8
    joined by ``network`` (``"ib-ndr"`` by default), each priced as one machine;
    ``vendor`` keeps one maker's GPUs (``"nvidia"``, ``"amd"`` …).
    ``within_hours`` leaves out what would not finish the job in time.
    ``preset`` is one of the guides' personas; explicit arguments win over its values.
    Speeds come from a stored ``whichgpu bench`` result of the same run when ``store`` has
    one, else from ``predict``, corrected by the newest such result on one GPU.
    ``serving="vllm"`` (``mode="inference"``) ranks by a serving engine's KV cache and speed;
    ``quantization`` and ``kv_cache_dtype="fp8"`` store its weights and KV cache smaller.

    The keywords become a ``RecommendRequest`` (its fields say what each means), answered by
    ``answer_recommend``.
    """
    request = RecommendRequest(
        Target(workload, config, task, model),
        RunOptions.of(run_options),
        preset=preset,
        acquire=acquire,
        budget_usd=budget_usd,
        within_hours=within_hours,
        used=used,
        gpu_only=gpu_only,
        provider=provider,
        gpu_count=gpu_count,
        gpus=gpus,
        vendor=vendor,
        hours=hours,
        samples=samples,
        tokens=tokens,
        epochs=epochs,
        dataset_size=dataset_size,
        min_batch=min_batch,
        region=region,
        top=top,
        sort=sort,
        serving=serving,
        quantization=quantization,
        kv_cache_dtype=kv_cache_dtype,
        stack=stack,
        store=store,
        prices=prices,
    )
    return answer_recommend(request, progress=progress)


def answer_recommend(
    request: RecommendRequest,
    *,
    progress: Callable[[str], None] | None = None,
) -> Ranking:
    """``recommend``'s answer to a typed request (see ``recommend`` for what it means);
    ``progress`` hears each GPU and count as it is sized."""
    from whichgpu.catalog.cost_data import get_region
    from whichgpu.ranking.rank import rank

    asked = _asked(request)
    target = request.target
    chosen = select(asked.workload, target.config, target.task, target.model)
    given = run_config(**asked.run_options)
    counts = gpu_counts(asked.gpu_count, given.mode, given.network)
    targets, maker = keep_vendor(resolve_gpus(request.gpus), asked.vendor)
    software = get_stack(request.stack)
    catalog = load_catalog(request.prices)
    place = get_region(request.region)
    check_provider(request.provider, asked.question.mode, catalog)
    engine = asked.question.serving
    quantization = checked_quantization(request.quantization, engine, given)
    kv_cache_dtype = checked_kv_cache_dtype(request.kv_cache_dtype, engine, given)

    def size(more: Sequence[int], into: _Sized | None = None) -> _Sized:
        return _sized(
            chosen,
            more,
            targets,
            asked.run_options,
            target.config,
            request.store,
            software,
            catalog,
            progress,
            engine,
            quantization,
            kv_cache_dtype,
            into,
        )

    def ranked(sized: _Sized, notes: Sequence[str] = ()) -> Ranking:
        question = replace(
            asked.question,
            region=place.id,
            vendor=maker,
            notes=(*asked.question.notes, *sized.notes, *notes),
        )
        keep_replays()
        return rank(
            sized.options,
            # a --config's model by its architecture and size (``step.config_label``)
            workload=next((o.memory.workload for o in sized.options), chosen.info.name),
            run=sized.run,
            question=question,
            units_per_sample=sized.units_per_sample,
            catalog=catalog,
            region=place.id,
        )

    sized = size(counts)
    ranking = ranked(sized)
    if _needs_a_cluster(asked, ranking, engine):
        sized = size(AUTO_CLUSTERS, sized)
        ranking = ranked(sized, (_cluster_note(asked, ranking, given.network),))
    if sized.run.mode == "inference" and any(
        c.throughput_unit == "tokens/s" for c in ranking.ranking
    ):  # what the rate counts: the whole request, prefill included
        ranking = ranking.model_copy(
            update={"assumptions": (*ranking.assumptions, GENERATED_RATE_NOTE)}
        )
    return ranking


def _needs_a_cluster(asked: QuestionAsked, ranking: Ranking, engine: ServingEngine | None) -> bool:
    """Whether ``--gpus auto`` goes on to clusters (``AUTO_CLUSTERS``): when nothing ranks on
    machines of 1 to 8 GPUs for training, and at least one was left out because it could not
    finish the job within the deadline, or because the model state did not fit while the run
    shards it over the GPUs (ZeRO, FSDP, HSDP: each GPU more holds less). Nothing else widens
    it: a budget only tightens with more machines, and where the state is whole on every GPU
    (DDP) more GPUs hold no less (``--sharding fsdp`` is the lever the answer names)."""
    auto = isinstance(asked.gpu_count, str) and asked.gpu_count.strip().lower() == "auto"
    if not auto or engine is not None or ranking.run.mode != "train" or ranking.ranking:
        return False
    return _too_late(asked, ranking) or _too_big_for_a_machine(ranking)


def _too_late(asked: QuestionAsked, ranking: Ranking) -> bool:
    """Whether ``ranking`` left GPUs out for missing the question's deadline."""
    return asked.question.within_hours is not None and any(
        e.kind == "time" for e in ranking.excluded
    )


def _too_big_for_a_machine(ranking: Ranking) -> bool:
    """Whether ``ranking`` left GPUs out for memory on a run that shards its state."""
    return ranking.run.sharding != "ddp" and any(e.kind == "memory" for e in ranking.excluded)


def _cluster_note(asked: QuestionAsked, ranking: Ranking, network: str | None) -> str:
    """What ``--gpus auto`` did when one machine could not do the job, in words."""
    from whichgpu.estimate.data_parallel import get_fabric, node_count

    fabric = get_fabric(network)
    nodes = ", ".join(str(node_count(n)) for n in AUTO_CLUSTERS)
    gpus = ", ".join(str(n) for n in AUTO_CLUSTERS)
    why = (
        f"finishes the job within {asked.question.within_hours or 0.0:,.0f} h"
        if _too_late(asked, ranking)
        else f"holds the model state sharded over it ({ranking.run.sharding})"
    )
    return (
        f"--gpus auto: no machine of 1 to 8 GPUs {why}, so clusters of {gpus} GPUs ({nodes} "
        f"machines of 8 joined by {fabric.name}, {fabric.id}) were ranked too; a --gpus count "
        "or range (e.g. 8-256) asks for larger ones"
    )


def _asked(request: RecommendRequest) -> QuestionAsked:
    """The request's question, a preset's values merged in and checked
    (``ranking.question.ask``, which knows no request: its fields are handed over here)."""
    return ask(
        workload=request.target.workload,
        named=request.target.names_own_model,
        run_options=request.run.given(),
        preset=request.preset,
        acquire=request.acquire,
        budget_usd=request.budget_usd,
        within_hours=request.within_hours,
        used=request.used,
        gpu_only=request.gpu_only,
        provider=request.provider,
        gpu_count=request.gpu_count,
        vendor=request.vendor,
        hours=request.hours,
        samples=request.samples,
        tokens=request.tokens,
        epochs=request.epochs,
        dataset_size=request.dataset_size,
        min_batch=request.min_batch,
        top=request.top,
        sort=request.sort,
        serving=request.serving,
    )


@dataclass
class _Sized:
    """Every GPU at every count, sized and timed, before prices and constraints."""

    options: list[Option]
    run: RunConfig
    """The run as the last count sized it (the run options when none could be)."""
    units_per_sample: int
    """Tokens per sample (generated tokens when serving), 1 for other workloads."""
    notes: list[str] = field(default_factory=list)
    """Counts that could not be sized and stored measurements left out, in words."""
    measured: dict[tuple[str, int], BenchResult] = field(default_factory=dict)
    """The stored measurements found (``measurements``), for counts sized later."""
    calibration: tuple[Calibration, float] | None = None
    """The correction they give the predictions."""
    loaded: tuple[ScalableProfile, str] | None = None
    """The step's profile and how it was obtained, once loaded."""


def _sized(
    chosen: Workload,
    counts: Sequence[int],
    targets: Sequence[GpuSpec],
    run_options: dict[str, Any],
    config: Path | str | None,
    store: Path | str | None,
    software: SoftwareStack,
    catalog: Catalog,
    progress: Callable[[str], None] | None,
    engine: ServingEngine | None = None,
    quantization: Quantization | None = None,
    kv_cache_dtype: KvCacheDtype = "auto",
    into: _Sized | None = None,
) -> _Sized:
    """The step on ``targets`` at each count: fit, predicted speed (corrected by the newest
    measurement on one GPU) and any stored measurement; a count the model cannot be split
    over is left out with a note, unless it is the only one asked. With ``engine``, fit and
    speed are the engine's (its KV cache in ``kv_cache_dtype``), and measurements (of plain
    PyTorch) are not used. ``into``: counts sized before, which these join (their profile
    and measurements are reused)."""
    out = into or _Sized([], run_config(**run_options), 1)
    for count in counts:
        try:
            run = run_config(gpus=count, **run_options)  # a split this count cannot hold
            check_for_workload(run, chosen.info)
            step = prepare(
                chosen, run, config, progress if out.loaded is None else None, out.loaded
            )
        except NotSplittable as exc:
            if len(counts) == 1 and into is None:
                raise
            out.notes.append(f"no machines of {count} GPUs: {exc}")
            continue
        out.loaded = (step.profile, step.method)
        step = replace(
            step,
            kv_cache_dtype=kv_cache_dtype,
            quantization=quantization if engine is None else None,  # compiled decoding's
        )
        if engine is not None and (step.kv_per_token is None or step.model_config is None):
            raise UsageError(
                f"{option('serving')} applies to language models that generate; "
                f"{chosen.info.name} does not."
            )
        if into is None and count == counts[0] and engine is None:
            out.measured, out.calibration = measurements(chosen, step, store, software, out.notes)
        timer = predictor(chosen, step, software)
        out.units_per_sample = (
            (step.run.new_tokens or step.run.context or 1)
            if timer.serving
            else (step.run.seq_len or 1)
        )
        for gpu in targets:
            if progress is not None:
                progress(f"{count} x {gpu.name}" if count > 1 else gpu.name)
            out.options.append(
                _option(
                    gpu,
                    count,
                    step,
                    timer,
                    catalog,
                    software,
                    out.calibration,
                    out.measured,
                    engine,
                    quantization,
                )
            )
        out.run = step.run
    return out


def _option(
    gpu: GpuSpec,
    count: int,
    step: Step,
    timer: ThroughputPredictor,
    catalog: Catalog,
    software: SoftwareStack,
    calibration: tuple[Calibration, float] | None,
    measured: dict[tuple[str, int], BenchResult],
    engine: ServingEngine | None = None,
    quantization: Quantization | None = None,
) -> Option:
    """One GPU at one count: its fit, its predicted (and corrected) speed, its measurement;
    with ``engine``, the engine's fit (its KV cache) and speed (``serving_speed``)."""
    from whichgpu.estimate.calibration import calibrate as correct
    from whichgpu.estimate.engine_speed import QuantizationRefused
    from whichgpu.estimate.memory import estimate_on_gpu
    from whichgpu.estimate.serving import engine_verdict
    from whichgpu.estimate.throughput import gpu_rates
    from whichgpu.ranking.rank import Option

    quantized = refused = None
    try:
        quantized = compiled_weights(step, gpu)
    except QuantizationRefused as exc:
        refused = str(exc)
    memory = estimate_on_gpu(
        step.memory,
        step.run,
        gpu,
        catalog,
        software,
        method=step.method,
        compiled_saving=step.compiled,
        experts=step.experts,
        search_seq_len=False,
        shorter_seq_when_unfit=True,
        kv_per_token_bytes=step.kv_per_token,
        kv_head_count=step.kv_heads,
        serving=engine,
        quantized=quantized,
    )
    path = None
    if refused is None and step.run.precision == "fp8":
        from whichgpu.estimate.fp8 import fp8_refusal

        refused = fp8_refusal(gpu)
    if refused is None:
        from whichgpu.estimate.paged import paged_refusal

        refused = paged_refusal(step.run, gpu)
    if refused is None:
        from whichgpu.estimate.compiled import compile_refusal

        refused = compile_refusal(step.run, gpu)
    if engine is not None and refused is None:
        try:
            memory, path = engine_quantization(step, engine, gpu, memory, software, quantization)
        except QuantizationRefused as exc:
            refused = str(exc)
    memory = engine_verdict(memory)  # with an engine, its KV cache decides what fits
    speed = speed_unknown = None
    if refused is not None:
        speed_unknown = refused
    elif memory.fits:
        try:
            rates = gpu_rates(gpu, software)
            speed = timer.on_gpu(gpu, rates, memory)
            if engine is not None:
                served = serving_speed_on_gpu(
                    step, engine, gpu, rates, memory, (None, None), catalog, path=path
                )
                speed = speed.model_copy(update={"serving_speed": served})
        except UsageError as exc:  # the catalog lacks what the prediction needs
            speed_unknown = str(exc)
    if speed is not None and calibration is not None:
        speed = correct([speed], *calibration)[0]
    return Option(
        gpu=gpu,
        count=count,
        memory=memory,
        speed=speed,
        measured=measured.get((gpu.id, count)),
        speed_unknown=speed_unknown,
    )


def measurements(
    chosen: Workload,
    step: Step,
    store: Path | str | None,
    software: SoftwareStack,
    notes: list[str],
) -> tuple[dict[tuple[str, int], BenchResult], tuple[Calibration, float] | None]:
    """Stored bench results of ``chosen`` run as ``step.run`` asks (mode, precision, length,
    method, optimizer, checkpointing) on catalog GPUs: the newest per (catalog id, count), and
    the correction the newest of those on one GPU gives the predictions (as ``predict
    --calibrate``).

    Left out, each kind with a note in ``notes``: results on GPUs this whichgpu's catalog
    does not know (a newer whichgpu's), and results on one GPU that are not possible
    measurements of the run (``Calibration.check``; an older one of that GPU is used instead).
    A store that does not exist holds none; one that cannot be read (not SQLite, damaged, a
    folder) raises its ``StoreError``: a store the user named is never silently ignored."""
    from whichgpu.estimate.calibration import ImplausibleMeasurement
    from whichgpu.store import ResultStore, catalog_gpu

    run = step.run
    results = ResultStore(Path(store) if store else None).list(workload=chosen.info.name)
    same = ("mode", "precision", "method", "optimizer", "checkpointing")
    by_key: dict[tuple[str, int], list[BenchResult]] = {}
    unknown: dict[str, int] = {}
    for r in results:  # newest first
        if r.gpu is None or not r.throughput:
            continue
        if any(getattr(r.run, k) != getattr(run, k) for k in same):
            continue
        if run.seq_len is not None and r.seq_len != run.seq_len:
            continue
        gpu = catalog_gpu(r.gpu)
        if gpu is None:
            unknown[r.gpu] = unknown.get(r.gpu, 0) + 1
            continue
        by_key.setdefault((gpu, r.n_gpus), []).append(r)
    if unknown:
        count = sum(unknown.values())
        notes.append(
            f"{count} stored result{'s' if count > 1 else ''} of this run "
            f"{'are' if count > 1 else 'is'} not used: measured on "
            f"{', '.join(sorted(unknown))}, which this whichgpu's catalog does not know (a "
            "newer whichgpu may: pip install --upgrade whichgpu)"
        )
    found: dict[tuple[str, int], BenchResult] = {}
    calibrations: list[tuple[Calibration, float]] = []
    for key, candidates in by_key.items():
        if key[1] > 1:
            found[key] = candidates[0]
            continue
        for r in candidates:  # the newest possible measurement on this GPU is used
            short = r.id[:8]
            try:
                calibrations.append(calibration_of(chosen, step, r, software))
            except ImplausibleMeasurement as exc:
                notes.append(
                    f"your measurement {short} is not used: {exc.reason}; check it (whichgpu "
                    f"results show {short}) and delete it if it is wrong"
                )
                continue
            except UsageError as exc:  # a real measurement the model cannot compare: kept
                why = str(exc).removeprefix("--calibrate: ")
                notes.append(f"your measurement {short} corrects no prediction: {why}")
            found[key] = r
            break
    calibration = max(calibrations, key=lambda c: c[0].result.created_at, default=None)
    return found, calibration

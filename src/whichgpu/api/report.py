"""``report``: everything the HTML report shows, computed once and returned as ``ReportData``.

The recommendation comes first (``api.recommend`` with the same question); then, for its
candidates, the speeds relative to a reference GPU (a stored measurement of the same run in
place of the prediction), memory (``api.fit``), performance per dollar (``cost.value``),
renting against owning the leader (``cost.breakeven``), the stored results as Lambda's tables
(``store.pivot_results``) and the provenance of every figure. ``whichgpu.report.html`` only
lays it out.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from whichgpu.api.fit import answer_fit
from whichgpu.api.predict import answer_predict
from whichgpu.api.recommend import answer_recommend, measurements
from whichgpu.api.requests import (
    FitRequest,
    PredictRequest,
    RecommendRequest,
    ReportRequest,
    RunOptions,
    Target,
)
from whichgpu.api.step import keep_replays, prepare, select_target
from whichgpu.catalog import load_catalog
from whichgpu.catalog.query import Catalog
from whichgpu.catalog.stacks import get_stack
from whichgpu.errors import UsageError, WhichGpuError
from whichgpu.report_data import ReportData, ReportProvenance, SpeedPoint
from whichgpu.schema import (
    BenchResult,
    Breakeven,
    MemoryEstimate,
    Ranking,
    RunConfig,
    ThroughputEstimate,
    ValueTable,
)
from whichgpu.store import ResultPivot
from whichgpu.tabular import ResultList
from whichgpu.version import __version__
from whichgpu.workloads import run_config
from whichgpu.workloads.base import Workload


def report(
    workload: str | None = None,
    *,
    config: Path | str | None = None,
    task: str | None = None,
    model: str | None = None,
    acquire: str | None = None,
    budget_usd: float | None = None,
    gpus: Sequence[str] | None = None,
    gpu_count: int | str | None = None,
    reference: str | None = None,
    hours: float | None = None,
    samples: float | None = None,
    tokens: float | None = None,
    epochs: float | None = None,
    dataset_size: int | None = None,
    region: str | None = None,
    top: int | None = None,
    stack: str | None = None,
    results: bool = False,
    store: Path | str | None = None,
    prices: Sequence[Path | str] | None = None,
    progress: Callable[[str], None] | None = None,
    preset: str | None = None,
    used: bool | None = None,
    gpu_only: bool = False,
    provider: str | None = None,
    within_hours: float | None = None,
    min_batch: int | None = None,
    sort: str | None = None,
    vendor: str | None = None,
    serving: str | None = None,
    quantization: str | None = None,
    kv_cache_dtype: str | None = None,
    **run_options: Any,
) -> ReportData:
    """Everything ``whichgpu report`` shows, computed once and returned as ``ReportData``.

    The recommendation (``recommend``'s question, its keywords), then for its candidates (or
    ``gpus``): throughput per GPU normalised to ``reference`` (default: the leader; a stored
    ``bench`` result replaces a prediction, marked measured; with ``serving``, the engine's
    speeds too), memory and the largest batch, performance per dollar (GPU alone, 1-8 GPU
    machines, rented), renting against owning the leader; ``results=True`` adds the stored
    results as Lambda's tables. Provenance (catalog version, price dates, the speed model's
    error, the run, the tool version) comes with it.

    The keywords become a ``ReportRequest`` (the question a ``RecommendRequest``), answered by
    ``answer_report``.
    """
    request = ReportRequest(
        RecommendRequest(
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
        ),
        reference=reference,
        results=results,
    )
    return answer_report(request, progress=progress)


def answer_report(
    request: ReportRequest, *, progress: Callable[[str], None] | None = None
) -> ReportData:
    """``report``'s answer to a typed request (see ``report`` for what it means);
    ``progress`` hears the recommendation's progress."""
    asked = request.recommend
    # a cluster is ranked as recommend ranks it; the value tables price machines of up to 8
    # GPUs, and the break-even one machine of the cluster (_breakeven)
    ranking = answer_recommend(asked, progress=progress)
    target = asked.target
    if target.is_empty:
        target = replace(target, workload=ranking.workload)  # the preset's
    chosen = select_target(target)
    catalog = load_catalog(asked.prices)
    notes: list[str] = []
    shown, ref_id = _shown(ranking, asked.gpus, request.reference, catalog, chosen)
    speeds_predicted, memory = _predicted(target, ranking, shown, asked)
    # the measurements the ranking used (its assumptions carry the notes of those left out)
    one_gpu = prepare(chosen, ranking.run.model_copy(update={"gpus": 1}), target.config, None)
    measured, _ = measurements(chosen, one_gpu, asked.store, get_stack(asked.stack), [])
    speeds, ref_id = _speed_points(chosen, ranking, speeds_predicted, measured, ref_id, notes)
    per_gpu: Sequence[SpeedPoint] = speeds
    if _together(ranking.run):
        # the speeds are of the ranking's GPUs together; what a dollar buys is per GPU
        per_gpu = [
            p.model_copy(update={"throughput": p.throughput / ranking.run.gpus}) for p in speeds
        ]
        how = (
            f"the model is split over them ({ranking.run.model_parallel_words()})"
            if ranking.run.model_parallel() > 1
            else f"the model state is sharded over them ({ranking.run.sharding})"
        )
        notes.append(
            f"Performance per dollar counts each GPU's share of the {ranking.run.gpus} GPUs' "
            f"speed: {how}."
        )
    tables = _value_tables(per_gpu, ref_id, catalog, notes)
    lead = ranking.ranking[0] if ranking.ranking else None
    even = _breakeven(ranking, catalog, notes)
    no_results: tuple[None, int, None] = (None, 0, None)
    pivot, n_results, store_text = _results(asked.store, notes) if request.results else no_results
    provenance = _provenance(
        chosen,
        catalog,
        shown=[p.gpu for p in speeds],
        memory_method=memory[0].method if memory else "",
        described=_described(chosen, ranking, target.config, target.model, asked),
        store_text=store_text,
    )
    keep_replays()
    return ReportData(
        title=ranking.workload if target.config else (target.model or chosen.info.name),
        workload=ranking.workload if target.config else chosen.info.name,
        run=ranking.run,
        ranking=ranking,
        reference=ref_id,
        reference_name=next(p.gpu_name for p in speeds if p.gpu == ref_id),
        speeds=speeds,
        throughput=tuple(speeds_predicted),
        memory=tuple(memory),
        value=tuple(tables),
        breakeven=even,
        breakeven_gpu=lead.gpu if even is not None and lead is not None else None,
        breakeven_count=lead.count // lead.machines if lead is not None else 1,
        results=pivot,
        results_count=n_results,
        notes=tuple(notes),
        provenance=provenance,
    )


def _together(run: RunConfig) -> bool:
    """Whether ``run``'s speed is only of its GPUs together: its model split over them (tensor,
    pipeline or context parallel), or its state sharded over them (ZeRO, FSDP), whose one-GPU
    run holds the whole state and is not the run asked."""
    return run.model_parallel() > 1 or (run.gpus > 1 and run.sharding != "ddp")


def _predicted(
    target: Target, ranking: Ranking, shown: Sequence[str], asked: RecommendRequest
) -> tuple[ResultList[ThroughputEstimate], ResultList[MemoryEstimate]]:
    """The predicted speeds and the memory of the ``shown`` GPUs, for the run the ranking
    answered (a preset's options included): the speeds of one GPU each (of the ranking's GPUs
    together where the model is split or its state sharded over them: ``_together``); the
    memory per GPU
    of the ranking's GPU count, so that its sharding (and DDP's gradient buckets) is in it;
    with the question's serving engine, each speed carries the engine's (``serving_speed``)."""
    # a split or sharded model has no one-GPU run: its speeds are of the ranking's GPUs together
    split = _together(ranking.run)
    run = run_config(
        **ranking.run.model_dump(exclude_defaults=True, exclude=set() if split else {"gpus"})
    )
    stack = asked.stack
    speeds = answer_predict(
        PredictRequest(
            target,
            run,
            gpus=shown,
            stack=stack,
            serving=asked.serving,
            quantization=asked.quantization,
            kv_cache_dtype=asked.kv_cache_dtype,
        )
    )
    per_gpu = run_config(**ranking.run.model_dump(exclude_defaults=True))
    # compiled decoding's quantized weights are what each GPU holds (an engine's: its own)
    held = asked.quantization if asked.serving is None else None
    memory = answer_fit(FitRequest(target, per_gpu, gpus=shown, stack=stack, quantization=held))
    return speeds, memory


_VALUE_TABLES: tuple[tuple[str, int | None], ...] = (
    ("buy", None),
    ("buy", 1),
    ("buy", 2),
    ("buy", 4),
    ("buy", 8),
    ("cloud", None),
)
"""The performance-per-dollar tables shown: the GPU alone, machines of 1 to 8, rented."""


def _shown(
    ranking: Ranking,
    gpus: Sequence[str] | None,
    reference: str | None,
    catalog: Catalog,
    chosen: Workload,
) -> tuple[list[str], str | None]:
    """The GPUs the report shows (those named, then the ranked candidates, then the
    reference), by catalog id, and the reference's id (None: the leader)."""
    shown: list[str] = []
    for name in [gpus] if isinstance(gpus, str) else gpus or ():
        gid = catalog.resolve(name).id
        if gid not in shown:
            shown.append(gid)
    for c in ranking.ranking:
        if c.gpu not in shown:
            shown.append(c.gpu)
    ref_id = catalog.resolve(reference).id if reference else None
    if ref_id is not None and ref_id not in shown:
        shown.append(ref_id)
    if not shown:
        raise UsageError(
            f"No GPU can run {chosen.info.name} as asked, so there is nothing to report: "
            + "; ".join(f"{e.gpu_name}: {e.reason}" for e in ranking.excluded[:3])
        )
    return shown, ref_id


def _speed_points(
    chosen: Workload,
    ranking: Ranking,
    predicted: Sequence[ThroughputEstimate],
    measured: dict[tuple[str, int], BenchResult],
    ref_id: str | None,
    notes: list[str],
) -> tuple[tuple[SpeedPoint, ...], str]:
    """Each GPU's speed (measured where a stored result of the run is, else predicted with
    its band), fastest first, relative to the reference (the leader when the reference has
    no speed); and the reference used."""
    rows: list[tuple[ThroughputEstimate, float, float, float, str]] = []
    for e in predicted:
        if e.speed_unknown is not None:
            notes.append(f"{e.gpu_name}: {e.speed_unknown}")
            continue
        if not e.fits or e.throughput is None:
            notes.append(f"{e.gpu_name}: does not fit at this run, so it has no speed.")
            continue
        m = measured.get((e.gpu, 1)) if e.n_gpus == 1 else None  # one GPU's measurement
        if m is not None and m.throughput:
            rows.append((e, m.throughput, m.throughput, m.throughput, "measured"))
        else:
            low = e.low if e.low is not None else e.throughput
            high = e.high if e.high is not None else e.throughput
            rows.append((e, e.throughput, low, high, "predicted"))
    if not rows:
        raise UsageError(f"No GPU shown has a speed for {chosen.info.name} as asked.")
    by_id = {r[0].gpu: r for r in rows}
    if ref_id is None or ref_id not in by_id:
        if ref_id is not None:
            notes.append(f"The reference {ref_id} has no speed here; the leader is used.")
        ref_id = ranking.ranking[0].gpu if ranking.ranking else rows[0][0].gpu
        ref_id = ref_id if ref_id in by_id else rows[0][0].gpu
    ref_speed = by_id[ref_id][1]
    points = (
        SpeedPoint(
            gpu=e.gpu,
            gpu_name=e.gpu_name,
            throughput=value,
            low=low,
            high=high,
            throughput_unit=e.throughput_unit,
            relative=value / ref_speed,
            relative_low=low / ref_speed,
            relative_high=high / ref_speed,
            batch_size=e.batch_size,
            source=source,
        )
        for e, value, low, high, source in rows
    )
    return tuple(sorted(points, key=lambda p: -p.throughput)), ref_id


def _value_tables(
    speeds: Sequence[SpeedPoint], ref_id: str, catalog: Catalog, notes: list[str]
) -> list[ValueTable]:
    """Performance per dollar at the shown speeds: of the GPU alone, of 1, 2, 4 and 8-GPU
    machines, and rented; relative to the reference where it has a price of the kind. A kind
    no GPU has a price of is a note."""
    from whichgpu import cost

    per_gpu = {p.gpu: p.throughput for p in speeds}
    unit = speeds[0].throughput_unit
    tables: list[ValueTable] = []
    for kind, count in _VALUE_TABLES:
        asked: dict[str, Any] = {
            "price_kind": kind,
            "count": count,
            "throughput": per_gpu,
            "throughput_unit": unit,
            "catalog": catalog,
        }
        try:
            try:  # relative to the reference GPU when it has a price of the kind
                tables.append(cost.value(list(per_gpu), reference=ref_id, **asked))
            except WhichGpuError:
                tables.append(cost.value(list(per_gpu), **asked))
        except WhichGpuError as exc:
            what = "rented" if kind == "cloud" else f"of {count}-GPU machines" if count else ""
            notes.append(f"Performance per dollar {what or 'of the GPU alone'}: {exc}")
    return tables


def _breakeven(ranking: Ranking, catalog: Catalog, notes: list[str]) -> Breakeven | None:
    """Renting against owning the ranking's leader (None without one, or with a note when
    the catalog cannot answer). A cluster's machines are bought, or rented, each as one
    machine, so both sides scale with their number and the break-even is one machine's: that
    machine is answered, and a note says so."""
    from whichgpu import cost

    lead = ranking.ranking[0] if ranking.ranking else None
    if lead is None:
        return None
    count = lead.count // lead.machines
    if lead.machines > 1:
        notes.append(
            f"Cloud against own for {lead.label()}: the break-even of one machine of {count}; "
            f"the {lead.machines} machines multiply its purchase, electricity and rent alike, "
            "so the hours to break even are the same (the fabric's switches and cables are "
            "not priced)."
        )
    try:
        return cost.breakeven(gpu=lead.gpu, count=count, region=ranking.region, catalog=catalog)
    except WhichGpuError as exc:
        notes.append(f"Cloud against own for {lead.gpu_name}: {exc}")
        return None


def _results(
    store: Path | str | None, notes: list[str]
) -> tuple[ResultPivot | None, int, str | None]:
    """The stored results as Lambda's tables, how many there are, and the store's path."""
    from whichgpu.store import ResultStore, pivot_results

    result_store = ResultStore(Path(store) if store else None)
    store_text = str(result_store.path)
    stored = result_store.list()
    if not stored:
        notes.append(f"The results store {store_text} holds no results yet (whichgpu bench).")
        return None, 0, store_text
    return pivot_results(stored), len(stored), store_text


def _provenance(
    chosen: Workload,
    catalog: Catalog,
    *,
    shown: Sequence[str],
    memory_method: str,
    described: dict[str, str],
    store_text: str | None,
) -> ReportProvenance:
    """Where the report's figures come from: versions, price dates of the ``shown`` GPUs, the
    speed model and its error band, the memory method, the run and question in words."""
    import datetime as dt

    from whichgpu.estimate.throughput import error_band, error_band_basis, load_parameters
    from whichgpu.schema import SCHEMA_VERSION

    params = load_parameters()
    price_dates: dict[str, str] = {}
    user_prices = False
    for gid in shown:
        dates = sorted(p.as_of.isoformat() for p in catalog.prices(gid))
        user_prices = user_prices or any(p.user for p in catalog.prices(gid))
        if dates:
            price_dates[gid] = dates[0] if dates[0] == dates[-1] else f"{dates[0]} .. {dates[-1]}"
    return ReportProvenance(
        tool_version=__version__,
        schema_version=SCHEMA_VERSION,
        catalog_version=catalog.version,
        generated_at=dt.datetime.now(dt.timezone.utc).replace(microsecond=0).isoformat(),
        price_dates=price_dates,
        user_prices=user_prices,
        throughput_model=params.method,
        throughput_fitted_on=params.fitted_on,
        throughput_fitted_date=params.fitted_date,
        throughput_error_band=error_band(params, chosen.info.name, chosen.info.family),
        throughput_error_basis=error_band_basis(params, chosen.info.name),
        memory_method=memory_method,
        run=described,
        store=store_text,
    )


def _described(
    chosen: Workload,
    ranking: Ranking,
    config: Path | str | None,
    model: str | None,
    asked: RecommendRequest,
) -> dict[str, str]:
    """The run and the question in words, for the provenance."""
    run = ranking.run
    stack = asked.stack
    return {
        "workload": chosen.info.name,
        **({"config": str(config)} if config else {}),
        **({"model": model} if model else {}),
        **{k: str(v) for k, v in run.model_dump(mode="json").items() if v not in (None, [], ())},
        "question": ranking.mode,
        "ranked by": ranking.metric,
        "region": ranking.region,
        **({"job": ranking.job.describe()} if ranking.job else {}),
        **({"budget": f"${ranking.budget_usd:,.0f}"} if ranking.budget_usd else {}),
        **({"stack": stack} if stack else {}),
        **({"serving": asked.serving} if asked.serving else {}),
        **({"quantization": asked.quantization} if asked.quantization else {}),
        **(
            {"kv cache dtype": asked.kv_cache_dtype}
            if asked.kv_cache_dtype not in (None, "auto")
            else {}
        ),
    }

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
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from whichgpu.catalog import load_catalog, sort_gpus
from whichgpu.catalog.stacks import get_serving_engine, get_stack
from whichgpu.errors import MissingRates, NotSplittable, UsageError
from whichgpu.schema import (
    BenchEnvironment,
    BenchResult,
    Comparison,
    GpuSpec,
    JobSize,
    MemoryEstimate,
    Ranking,
    RankMetric,
    RunConfig,
    Segment,
    SoftwareStack,
    ThroughputEstimate,
    Vendor,
)
from whichgpu.tabular import ResultList
from whichgpu.workloads import check_for_workload, run_config, select_workload
from whichgpu.workloads.base import Workload
from whichgpu.workloads.hf import read_config
from whichgpu.workloads.registry import get_workload
from whichgpu.workloads.run_config import inference_context
from whichgpu.workloads.stored import ScalableProfile, load_stored, profile_key

if TYPE_CHECKING:
    from whichgpu.bench.jobs import BenchProgress
    from whichgpu.estimate.calibration import Calibration
    from whichgpu.estimate.memory import StepMemory
    from whichgpu.estimate.prediction import StepState, ThroughputPredictor


def scalable_profile(
    workload: Workload, run: RunConfig, progress: Callable[[str], None] | None = None
) -> tuple[ScalableProfile, str]:
    """The step of ``workload`` for every size: stored if shipped, else kept from an earlier
    trace on this machine (``workloads.profile_cache``), else traced (needs torch; ``progress``
    hears each size as it is traced) and kept.

    Returns the profile and how it was obtained (``stored profile``, ``traced (kept from an
    earlier run)`` or ``traced``).
    """
    from whichgpu.workloads.profile_cache import cached_profile, keep_profile

    named = _is_registered(workload)
    if named:
        stored = load_stored(workload.info.name, run)
        if stored is not None:
            return stored, "stored profile"
    kept = cached_profile(workload, run, named=named)
    if kept is not None:
        return kept, _traced("traced (kept from an earlier run)", kept)
    try:
        from whichgpu.trace.scaling import trace_scalable
    except ImportError as exc:
        what = "this run configuration" if named else "a workload of your own"
        raise UsageError(
            f"No stored profile answers for {workload.info.name} with {what}, and tracing one "
            "needs torch: pip install 'whichgpu[torch]'."
        ) from exc
    profile = trace_scalable(workload, run, progress=progress)
    keep_profile(workload, run, profile, named=named)
    return profile, _traced("traced", profile)


def _traced(method: str, profile: ScalableProfile) -> str:
    """How a traced profile was obtained, saying so when it was traced with a few of its
    layers and extended (``whichgpu.trace.depth``)."""
    layers = profile.choices.get("layers")
    return method if layers is None else f"{method}; {layers}"


def _config_doc(workload: Workload, config: Path | str | None) -> dict[str, Any]:
    """The model's ``config.json``: the user's file or the shipped one."""
    if config is not None:
        doc: dict[str, Any] = json.loads(Path(config).read_text(encoding="utf-8"))
        return doc
    return read_config(workload.info.name)


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
    """Catalog GPUs by name (every GPU with a known memory size when ``names`` is empty); one
    name alone (``"4090"``) is one GPU, not a sequence of letters; a GPU named twice (``4090``
    and ``rtx-4090``) is answered once."""
    catalog = load_catalog()
    if isinstance(names, str):
        names = [names]
    if names is not None and not isinstance(names, Sequence):
        raise UsageError(
            f"gpus= takes GPU names (a list such as ['4090', 'h100-sxm']), not {names!r}; for "
            "a number of GPUs working together, give gpu_count=."
        )
    if names:
        found: dict[str, GpuSpec] = {}
        for name in names:
            gpu = catalog.resolve(name)
            found.setdefault(gpu.id, gpu)
        return list(found.values())
    return [g for g in catalog.all() if g.memory_gb]


def gpus(
    query: str | None = None,
    *,
    vendor: Vendor | str | None = None,
    min_memory_gb: float | None = None,
    segment: Segment | str | None = None,
    arch: str | None = None,
    sort: str = "launch_date",
    prices: Sequence[Path | str] | None = None,
) -> ResultList[GpuSpec]:
    """The GPU catalog, filtered and sorted (``whichgpu gpus``).

    ``query`` matches any part of a name or alias (``"4090"``, ``"a100"``); ``vendor``
    (``"nvidia"``, ``"amd"`` …), ``segment`` (``"consumer"``, ``"workstation"``,
    ``"datacenter"``), ``arch`` (``"Hopper"``) and ``min_memory_gb`` (GB as sold) keep what
    matches all of them. ``sort`` is a spec field: numbers and dates largest first, text A-Z.
    ``prices`` are price files laid over the shipped prices (default: the user's file).
    """
    if query is not None and not isinstance(query, str):
        raise UsageError(f"query= is part of a GPU's name, a string such as '4090', not {query!r}.")
    if min_memory_gb is not None and (
        isinstance(min_memory_gb, bool) or not isinstance(min_memory_gb, int | float)
    ):
        raise UsageError(f"min_memory_gb must be a number of GB, not {min_memory_gb!r}.")
    if min_memory_gb is not None and not (math.isfinite(min_memory_gb) and min_memory_gb >= 0):
        raise UsageError(f"--min-memory must be a number of GB from 0 up, not {min_memory_gb}.")
    catalog = load_catalog(prices)
    if arch is not None and not catalog.search(architecture=arch):
        known = sorted({g.architecture for g in catalog.all() if g.architecture})
        raise UsageError(
            f"--arch: no architecture starts with '{arch}'. Known: {', '.join(known)}."
        )
    found = catalog.search(
        query,
        vendor=_choice(Vendor, vendor, "vendor"),
        segment=_choice(Segment, segment, "segment"),
        architecture=arch,
        min_memory_gb=min_memory_gb,
    )
    return ResultList(sort_gpus(found, sort))


def gpu(name: str) -> GpuSpec:
    """One catalog GPU by name, alias or id (``"4090"``, ``"h100 sxm"``), as ``whichgpu show``
    resolves it; an unknown or ambiguous name raises ``GpuLookupError`` with suggestions."""
    return load_catalog().resolve(name)


def compare(*names: str, prices: Sequence[Path | str] | None = None) -> Comparison:
    """Several GPUs side by side, each figure with its ratio to the first (``whichgpu compare``)."""
    from whichgpu.catalog.compare import compare as compare_gpus

    if len(names) < 2:
        raise UsageError("compare needs two or more GPUs; the first is the baseline.")
    catalog = load_catalog(prices)
    return compare_gpus(catalog, [catalog.resolve(n) for n in names])


def _choice(kind: type[Vendor] | type[Segment], value: Any, what: str) -> Any:
    """``value`` as a member of ``kind`` (given as the member or its value, any case)."""
    if value is None or isinstance(value, kind):
        return value
    try:
        return kind(str(value).strip().lower())
    except ValueError:
        allowed = ", ".join(m.value for m in kind)
        raise UsageError(f"{what}: '{value}' is not one of {allowed}.") from None


@dataclass(frozen=True)
class _Step:
    """A workload's step, ready to be sized on GPUs: run options resolved, profile loaded."""

    run: RunConfig
    profile: ScalableProfile
    method: str
    memory: StepMemory
    seq_limit: int | None
    """Longest sequence the model takes (minus the new tokens of an inference run)."""
    kv_per_token: int | None
    """KV-cache bytes per token (inference of a language model), else None."""
    kv_heads: int | None = None
    """The model's key/value heads (inference of a language model), else None."""
    model_config: dict[str, Any] | None = None
    """The model's ``config.json`` (inference of a language model), else None."""


def _prepare(
    chosen: Workload,
    run: RunConfig,
    config: Path | str | None,
    progress: Callable[[str], None] | None,
    loaded: tuple[ScalableProfile, str] | None = None,
) -> _Step:
    """Resolve the run's sizes for ``chosen`` and load (or trace) its step (``loaded``: the
    profile and how it was obtained, when the caller has it already; it does not depend on
    how many GPUs share the step)."""
    if run.mode == "inference" and run.concurrency != 1 and run.batch_size is None:
        run = run.model_copy(update={"batch_size": run.concurrency})
    if chosen.info.is_sequence_model and run.seq_len is None and run.mode == "train":
        run = run.model_copy(update={"seq_len": chosen.info.default_seq_len})
    if progress is not None:
        progress(f"profiling {chosen.info.name}")
    profile, method = loaded or scalable_profile(chosen, run, progress)
    seq_limit = chosen.info.max_seq_len
    kv_per_token = kv_head_count = None
    doc: dict[str, Any] | None = None
    if "kv_cache" in profile.choices:  # inference of a language model
        from whichgpu.estimate.serving import (
            kv_bytes_per_token,
            kv_heads,
            serving_dtype_bytes,
            tensor_parallel_refusal,
        )

        context, new_tokens = inference_context(chosen.info, run)
        if seq_limit is not None:
            seq_limit -= new_tokens
        run = run.model_copy(
            update={"seq_len": context, "context": context, "new_tokens": new_tokens}
        )
        doc = _config_doc(chosen, config)
        kv_per_token = kv_bytes_per_token(doc, serving_dtype_bytes(run.precision))
        kv_head_count = kv_heads(doc)
        refusal = tensor_parallel_refusal(doc, run.gpus)
        if refusal is not None:
            raise NotSplittable(
                f"--gpus {run.gpus}: {chosen.info.name} cannot be served so: {refusal}."
            )
    elif chosen.info.is_sequence_model and run.seq_len is None:
        run = run.model_copy(update={"seq_len": chosen.info.default_seq_len})
    if run.mode == "inference" and run.gpus > 1 and kv_per_token is None:
        raise NotSplittable(
            f"--gpus with --mode inference serves a language model tensor parallel; "
            f"{chosen.info.name} does not generate, so each GPU would run a copy of it: "
            "estimate one GPU."
        )
    memory = _step_memory(chosen, run, profile)
    return _Step(run, profile, method, memory, seq_limit, kv_per_token, kv_head_count, doc)


def _step_memory(workload: Workload, run: RunConfig, profile: ScalableProfile) -> StepMemory:
    """The replays of ``profile``: of a stored profile, shared by every call in this process
    and started from the replays shipped with it (``estimate.replay_cache``)."""
    from whichgpu.estimate.replay_cache import kept_memory, step_memory
    from whichgpu.workloads.profile_cache import kept_file

    named = _is_registered(workload)
    stem = profile_key(workload.info.name, run) if named else None
    if stem is not None and load_stored(workload.info.name, run) is profile:
        return step_memory(profile, stem)
    kept = kept_file(workload, run, named=named)
    return step_memory(profile) if kept is None else kept_memory(profile, kept)


def _keep_replays() -> None:
    """Keep what this call replayed of profiles from the trace cache, for the next run."""
    from whichgpu.estimate.replay_cache import keep_new_replays

    keep_new_replays()


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
    fast: bool = False,
    **run_options: Any,
) -> ResultList[MemoryEstimate]:
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

    ``fast=True`` answers from the closed form (``whichgpu.estimate.fast``): from the shipped
    config of a named workload or the ``config`` file, without torch and without a trace, for
    full training of the models it covers on one GPU; anything else is a ``UsageError``. It
    errs high (``validate closed-form`` prints by how much).
    """
    from whichgpu.estimate.memory import estimate_on_gpu

    chosen = _select(workload, config, task, model)
    run = run_config(gpus=gpu_count, **run_options)
    if fast:
        if serving is not None:
            raise UsageError("--fast covers training; drop --serving (or --fast).")
        return _fit_fast(chosen, run, workload, config, task, gpus, stack, progress)
    engine = None
    if serving is not None:
        if run.mode != "inference":
            raise UsageError("--serving sizes a serving engine's KV cache; add --mode inference.")
        engine = get_serving_engine(serving)
    check_for_workload(run, chosen.info)
    targets = resolve_gpus(gpus)
    software = get_stack(stack)
    step = _prepare(chosen, run, config, progress)
    if engine is not None and step.kv_per_token is None:
        raise UsageError(
            f"--serving applies to language models that generate; {chosen.info.name} does not."
        )
    catalog = load_catalog()
    estimates = []
    for gpu in targets:
        if progress is not None:
            progress(gpu.name)
        estimates.append(
            estimate_on_gpu(
                step.memory,
                step.run,
                gpu,
                catalog,
                software,
                method=step.method,
                seq_limit=step.seq_limit,
                shorter_seq_when_unfit=True,
                kv_per_token_bytes=step.kv_per_token,
                kv_head_count=step.kv_heads,
                serving=engine,
            )
        )
    estimates.sort(key=lambda e: (-e.max_batch_size, -e.headroom_bytes))
    _keep_replays()
    return ResultList(estimates)


def _fit_fast(
    chosen: Workload,
    run: RunConfig,
    workload: str | None,
    config: Path | str | None,
    task: str | None,
    gpus: Sequence[str] | None,
    stack: str | None,
    progress: Callable[[str], None] | None,
) -> ResultList[MemoryEstimate]:
    """``fit(fast=True)``: the closed form's estimate on each GPU (no torch, no trace)."""
    from whichgpu.estimate import closed_form
    from whichgpu.estimate.fast import check_covered, fast_estimate_on_gpu
    from whichgpu.workloads.user import read_user_config

    if config is not None:
        doc, _ = read_user_config(Path(config), task)  # type: ignore[arg-type]
    elif workload is not None and chosen.info.name in closed_form.closed_form_workloads():
        doc = closed_form.workload_config(chosen.info.name)
    else:
        covered = ", ".join(closed_form.closed_form_workloads())
        raise UsageError(
            f"--fast answers from a Hugging Face config: one of {covered}, or --config FILE; "
            f"not {workload or 'a --model function'}. Drop --fast to use the traced path."
        )
    check_for_workload(run, chosen.info)
    if run.seq_len is None:
        run = run.model_copy(update={"seq_len": chosen.info.default_seq_len})
    check_covered(doc, run)
    software = get_stack(stack)
    catalog = load_catalog()
    estimates = []
    for gpu in resolve_gpus(gpus):
        if progress is not None:
            progress(gpu.name)
        estimates.append(
            fast_estimate_on_gpu(
                doc,
                run,
                gpu,
                catalog,
                software,
                workload=chosen.info.name,
                seq_limit=chosen.info.max_seq_len,
            )
        )
    estimates.sort(key=lambda e: (-e.max_batch_size, -e.headroom_bytes))
    return ResultList(estimates)


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
    from whichgpu.estimate.data_parallel import check_one_node
    from whichgpu.estimate.memory import estimate_on_gpu
    from whichgpu.estimate.throughput import gpu_rates

    chosen = _select(workload, config, task, model)
    run = run_config(gpus=gpu_count, **run_options)
    check_for_workload(run, chosen.info)
    check_one_node(run.gpus)
    named = bool(gpus)
    targets = resolve_gpus(gpus)
    software = get_stack(stack)
    step = _prepare(chosen, run, config, progress)
    predictor = _predictor(chosen, step)
    catalog = load_catalog()
    measured = _calibration_source(calibrate, store) if calibrate is not None else None
    if measured is not None and step.run.mode != "train":
        raise UsageError(
            "--calibrate corrects training predictions only; compare an inference "
            "prediction with your bench result (whichgpu results show) instead."
        )
    out = []
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
            software,
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
                out.append(predictor.on_gpu(gpu, rates, estimate))
                continue
            except UsageError as exc:  # the catalog lacks what timing several of it needs
                if len(targets) == 1:
                    raise
                unknown = exc
        if named:
            out.append(predictor.unknown_on_gpu(gpu, estimate, str(unknown)))
        elif unknown is not None:
            untimed.append((gpu.name, unknown))
    if measured is not None:
        from whichgpu.estimate.calibration import calibrate as correct
        from whichgpu.estimate.calibration import matching_measurement
        from whichgpu.store import catalog_gpu

        result = matching_measurement(
            measured, chosen.info.name, step.run, lambda gpu: catalog_gpu(gpu) is not None
        )
        calibration, band = _calibration(chosen, step, result, software)
        out = correct(out, calibration, band)
    out.sort(key=lambda e: -(e.throughput or 0.0))
    _keep_replays()
    alone_unfit = not out and step.run.gpus == 1
    return ResultList(out, notes=_left_out_notes(unfit, untimed, suggest_sharding=alone_unfit))


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


# --- bench: measure on a real device ---------------------------------------------------------


def bench(
    workload: str | None = None,
    *,
    config: Path | str | None = None,
    task: str | None = None,
    model: str | None = None,
    device: str = "cuda",
    gpu_count: int | None = None,
    find_max_batch: bool = False,
    max_batch_resolution: int = 1,
    find_max_seq_len: bool = False,
    memory_limit_gib: float | None = None,
    compile: bool = False,
    channels_last: bool = False,
    min_seconds: float | None = None,
    min_iters: int | None = None,
    timeout_s: float | None = None,
    progress: Callable[[BenchProgress], None] | None = None,
    on_result: Callable[[BenchResult], None] | None = None,
    **run_options: Any,
) -> ResultList[BenchResult]:
    """Measure it: throughput, memory and power of a workload on a real device.

    ``device`` is ``"cuda"``, ``"cuda:N"``, ``"cpu"``, ``"mps"`` (or ``"fake"``, a simulated
    device). ``run_options`` are the run configuration, as for ``fit``; ``gpu_count=N`` also
    measures N GPUs of this node together (DDP), after one alone, for the scaling efficiency.
    ``find_max_batch`` searches the largest batch and measures at it: from whichgpu's own
    prediction of it on this device where a stored profile gives one at once (galloping
    from it), else from 1 (doubling), then bisection to ``max_batch_resolution`` (1 =
    exact); the result's notes say how far the prediction was off. ``find_max_seq_len``
    searches the longest sequence at the batch, from its prediction the same way.
    ``memory_limit_gib`` caps the memory a step may use (on the CPU a search needs it).
    Timing warms up until steady, then runs at least ``min_iters`` steps and ``min_seconds``
    seconds (defaults: ``bench.TimingRule``). ``timeout_s`` stops a
    child process that makes no progress for that long.

    Returns one result per measurement (two with ``gpu_count`` > 1), each also passed to
    ``on_result`` as soon as it is measured; ``progress`` receives ``BenchProgress`` events.
    The catalog id of the GPU and the MFU (model FLOPs per second over the catalog's dense
    peak for the precision) are filled in here, where the device's name resolves to a
    catalog GPU.
    """
    from whichgpu.bench import BenchOptions, TimingRule, WorkloadRef, parse_device, run_bench
    from whichgpu.units import gib_to_bytes

    chosen = _select(workload, config, task, model)
    run = run_config(gpus=gpu_count, **run_options)
    check_for_workload(run, chosen.info)
    _require_positive("--memory-limit", memory_limit_gib, "GiB")
    defaults = TimingRule()
    options = BenchOptions(
        find_max_batch=find_max_batch,
        max_batch_resolution=max_batch_resolution,
        find_max_seq_len=find_max_seq_len,
        memory_limit_bytes=None if memory_limit_gib is None else gib_to_bytes(memory_limit_gib),
        compile=compile,
        channels_last=channels_last,
        rule=TimingRule(
            min_iters=defaults.min_iters if min_iters is None else min_iters,
            min_seconds=defaults.min_seconds if min_seconds is None else min_seconds,
        ),
        timeout_s=600.0 if timeout_s is None else timeout_s,
        batch_guess=_batch_guesser(chosen, run, memory_limit_gib) if find_max_batch else None,
        seq_len_guess=(
            _seq_len_guesser(chosen, run, memory_limit_gib) if find_max_seq_len else None
        ),
    )
    if options.rule.min_iters < 1 or options.rule.min_seconds < 0 or options.timeout_s <= 0:
        raise UsageError(
            "--min-iters must be at least 1, --min-seconds at least 0 and --timeout more than 0."
        )
    target = WorkloadRef.of(
        chosen.info.name if model is None and config is None else None, config, task, model
    )

    def completed(result: BenchResult) -> None:
        result = _bench_on_catalog(result)
        out.append(result)
        if on_result is not None:
            on_result(result)

    out: ResultList[BenchResult] = ResultList()
    run_bench(target, run, parse_device(device), options, progress=progress, on_result=completed)
    return out


def _batch_guesser(
    workload: Workload, run: RunConfig, memory_limit_gib: float | None
) -> Callable[[BenchEnvironment, int | None], int | None] | None:
    """whichgpu's prediction of the largest batch at a sequence length on the device a bench
    inspected, for the search to start from (see ``_size_guess``)."""
    from whichgpu.estimate.memory import largest_live_batch

    def on_gpu(environment: BenchEnvironment, seq_len: int | None) -> int | None:
        (estimate,) = _fit_on_device(workload, run, environment, None, seq_len)
        return estimate.max_batch_size

    return _size_guess(workload, run, memory_limit_gib, largest_live_batch, on_gpu)


def _seq_len_guesser(
    workload: Workload, run: RunConfig, memory_limit_gib: float | None
) -> Callable[[BenchEnvironment, int], int | None] | None:
    """whichgpu's prediction of the longest sequence at a batch size on the device a bench
    inspected, for the search to start from (see ``_size_guess``)."""
    from whichgpu.estimate.memory import MAX_SEQ_LIMIT, longest_live_seq

    upper = workload.info.max_seq_len or MAX_SEQ_LIMIT

    def on_cpu(profile: ScalableProfile, limit_bytes: int, batch_size: int) -> int:
        return longest_live_seq(profile, limit_bytes, batch_size, upper)

    def on_gpu(environment: BenchEnvironment, batch_size: int) -> int | None:
        seq_len = run.seq_len or workload.info.default_seq_len
        (estimate,) = _fit_on_device(workload, run, environment, batch_size, seq_len)
        return estimate.max_seq_len

    return _size_guess(workload, run, memory_limit_gib, on_cpu, on_gpu)


def _size_guess(
    workload: Workload,
    run: RunConfig,
    memory_limit_gib: float | None,
    on_cpu: Callable[[ScalableProfile, int, Any], int],
    on_gpu: Callable[[BenchEnvironment, Any], int | None],
) -> Callable[[BenchEnvironment, Any], int | None] | None:
    """A bench search's starting point from whichgpu's own memory estimate, or None where it
    has none to give at once.

    On the CPU under ``--memory-limit``, ``on_cpu(profile, limit_bytes, size)`` answers from
    the stored profile's traced live tensors (what the CPU device counts); on a CUDA GPU in
    the catalog, ``on_gpu(environment, size)`` from ``fit`` on it (one GPU: a search probes
    one). Only a stored profile is used, so the bench's own process never imports torch; a
    user's model, a run without a stored profile, MPS, a capped CUDA search (the cap is not
    ``fit``'s capacity) or a GPU outside the catalog get no guess, and the search starts from
    the bottom. A prediction that fails for any reason of whichgpu's is no guess either.
    """
    from whichgpu.errors import WhichGpuError
    from whichgpu.units import gib_to_bytes

    profile = load_stored(workload.info.name, _one_gpu(run)) if _is_registered(workload) else None
    if profile is None:
        return None
    limit = None if memory_limit_gib is None else gib_to_bytes(memory_limit_gib)

    def guess(environment: BenchEnvironment, size: Any) -> int | None:
        try:
            if environment.device_kind == "cpu" and limit is not None:
                return on_cpu(profile, limit, size)
            if environment.device_kind == "cuda" and limit is None:
                return on_gpu(environment, size)
        except WhichGpuError:
            pass
        return None

    return guess


def _one_gpu(run: RunConfig) -> RunConfig:
    return run.model_copy(update={"gpus": 1, "sharding": "ddp"})


def _fit_on_device(
    workload: Workload,
    run: RunConfig,
    environment: BenchEnvironment,
    batch_size: int | None,
    seq_len: int | None,
) -> ResultList[MemoryEstimate]:
    """``fit`` of one GPU of ``run`` on the catalog GPU a CUDA device is."""
    from whichgpu.units import bytes_to_gb

    total = environment.memory_total_bytes
    gpu = load_catalog().resolve(
        environment.device_name, memory_gb=bytes_to_gb(total) if total else None
    )
    options = _one_gpu(run).model_dump(
        exclude_defaults=True, exclude={"gpus", "batch_size", "concurrency", "seq_len"}
    )
    return fit(workload.info.name, gpus=[gpu.id], batch_size=batch_size, seq_len=seq_len, **options)


def _bench_on_catalog(result: BenchResult) -> BenchResult:
    """``result`` with its catalog GPU and MFU, or a note saying why there are none."""
    from whichgpu.errors import GpuLookupError
    from whichgpu.estimate.throughput import gpu_rates, peak_flops_per_s
    from whichgpu.units import TERA, bytes_to_gb

    env = result.environment
    if env.device_kind != "cuda":
        note = f"no catalog GPU and no MFU: the device is {env.device_kind}, not a CUDA GPU"
        return result.model_copy(update={"notes": (*result.notes, note)})
    memory_gb = bytes_to_gb(env.memory_total_bytes) if env.memory_total_bytes else None
    try:
        gpu = load_catalog().resolve(result.device_name, memory_gb=memory_gb)
    except GpuLookupError as exc:
        note = f"no catalog GPU and no MFU: '{result.device_name}' is not in the catalog ({exc})"
        return result.model_copy(update={"notes": (*result.notes, note)})
    update: dict[str, Any] = {"gpu": gpu.id}
    notes = list(result.notes)
    if result.flops_per_step and result.step_time_s:
        try:
            peak = peak_flops_per_s(gpu_rates(gpu), result.run.precision)
        except UsageError as exc:
            notes.append(f"no MFU: {exc}")
        else:
            update["mfu"] = result.flops_per_step * result.n_gpus / result.step_time_s / peak
            notes.append(
                f"MFU: model FLOPs per second over {gpu.name}'s dense {result.precision} peak of "
                f"{peak / TERA:.4g} TFLOP/s per GPU (catalog)"
            )
    update["notes"] = tuple(notes)
    return result.model_copy(update=update)


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
    used: bool = False,
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
    stack: str | None = None,
    store: Path | str | None = None,
    prices: Sequence[Path | str] | None = None,
    progress: Callable[[str], None] | None = None,
    **run_options: Any,
) -> Ranking:
    """Which GPU? Every catalog GPU (or ``gpus``) that fits, ranked for the question, with why.

    ``acquire``: ``"buy"`` (purchase + electricity; ``used=True`` for used prices;
    ``gpu_only=True`` when the computer is already there) or ``"rent"``
    (cloud rate; ``provider`` to pick one). A job size — ``hours``, ``samples``, ``tokens`` or
    ``epochs`` x ``dataset_size`` — ranks by the cost to finish it; without one, by throughput
    per dollar (``sort`` chooses: ``cost``, ``perf-per-dollar``, ``time``, ``throughput``).
    ``gpu_count``: N GPUs per machine, ``"auto"`` (1, 2, 4 and 8) or a range ``"1-4"``;
    ``vendor`` keeps one maker's GPUs (``"nvidia"``, ``"amd"`` …).
    ``within_hours`` leaves out what would not finish the job in time.
    ``preset`` is one of the guides' personas (``whichgpu.ranking.presets``); explicit
    arguments win over its values. Speeds come from a stored ``whichgpu bench`` result of the
    same run when ``store`` (default: the user's results store) has one, else from ``predict``,
    corrected by the newest such result on one GPU (as ``predict --calibrate`` does).
    ``prices``: CSV files of the user's own prices laid over the catalog's (default: the
    user's price file, when there is one; see ``whichgpu.catalog.load_catalog``).
    """
    from whichgpu.catalog.cost_data import get_region
    from whichgpu.estimate.calibration import calibrate as correct
    from whichgpu.estimate.memory import estimate_on_gpu
    from whichgpu.estimate.throughput import gpu_rates
    from whichgpu.ranking.presets import get_preset
    from whichgpu.ranking.rank import Option, Question, rank

    chosen_preset = get_preset(preset) if preset is not None else None
    notes: list[str] = []
    budget_given, within_given = budget_usd is not None, within_hours is not None
    if chosen_preset is not None:
        if workload is None and config is None and model is None:
            workload = chosen_preset.workload
        run_options = {
            **chosen_preset.run,
            **{k: v for k, v in run_options.items() if v is not None},
        }
        asked = chosen_preset.question
        acquire = acquire or asked.get("mode")
        budget_usd = budget_usd if budget_usd is not None else asked.get("budget_usd")
        within_hours = within_hours if within_hours is not None else asked.get("within_hours")
        if min_batch is None and asked.get("min_batch") is not None:
            if workload == chosen_preset.workload:
                min_batch = asked["min_batch"]
            else:  # a batch size means something only for the preset's own workload
                notes.append(
                    f"the preset's --min-batch {asked['min_batch']} is for its own workload "
                    f"({chosen_preset.workload}); give --min-batch for yours"
                )
        gpu_count = gpu_count if gpu_count is not None else asked.get("gpus")
        if vendor is None and asked.get("vendor"):
            vendor = asked["vendor"]
            notes.append(
                f"preset {chosen_preset.id} keeps to {Vendor(vendor).label} GPUs: "
                f"{chosen_preset.vendor_rationale}; --vendor any considers every maker"
            )
        if hours is None and samples is None and tokens is None and epochs is None:
            hours, samples, tokens = asked.get("hours"), asked.get("samples"), asked.get("tokens")
    acquire = acquire or "buy"
    if acquire not in ("buy", "rent"):
        raise UsageError(f"Choose --buy or --rent, not '{acquire}'.")
    if used and acquire == "rent":
        raise UsageError("--used prices cards to buy; drop it to rent (or use --buy).")
    if gpu_only and acquire == "rent":
        raise UsageError(
            "--gpu-only prices bought cards without a computer around them; drop it to rent "
            "(or use --buy)."
        )
    _require_positive("--budget", budget_usd, "dollars")
    _require_positive("--within", within_hours, "hours")
    _require_positive("--min-batch", min_batch, "samples")
    _require_positive("--top", top, "rows")
    job = _job_size(hours, samples, tokens, epochs, dataset_size)
    if within_hours is not None and (job is None or job.hours is not None):
        if within_given:
            raise UsageError(
                "--within is a deadline for finishing a job: give its size in work (--samples, "
                "--tokens, or --epochs with --dataset-size)."
            )
        notes.append(f"the preset's {within_hours:,.0f} h deadline needs a job size in work")
        within_hours = None
    if budget_usd is not None and acquire == "rent" and job is None:
        if budget_given:
            raise UsageError(
                "With --rent, --budget caps what the job's rental costs: give the job's size "
                "(--hours of use, --samples, --tokens, or --epochs with --dataset-size)."
            )
        notes.append(
            f"the preset's ${budget_usd:,.0f} budget is for buying; renting without a job size "
            "has no total to hold to it"
        )
        budget_usd = None
    metric = _metric(sort)
    chosen = _select(workload, config, task, model)
    counts = _gpu_counts(gpu_count)
    targets = resolve_gpus(gpus)
    maker = vendor.strip().lower() if vendor is not None else None
    if maker == "any":
        maker = None
    if maker is not None:
        makers = sorted({g.vendor.value for g in targets})
        if maker not in makers:
            raise UsageError(f"--vendor: '{vendor}' is not one of {', '.join(makers)} (or any).")
        targets = [g for g in targets if g.vendor.value == maker]
    software = get_stack(stack)
    catalog = load_catalog(prices)
    place = get_region(region)
    if provider is not None:
        from whichgpu.cost.pricing import known_providers

        providers = known_providers(catalog)
        if provider.strip().lower() not in providers:
            raise UsageError(
                f"--provider: unknown provider '{provider}'. Providers with cloud prices in the "
                f"catalog: {', '.join(providers)}."
            )
        if acquire != "rent":
            raise UsageError("--provider chooses whom to rent from; add --rent.")
    options: list[Option] = []
    measured: dict[tuple[str, int], BenchResult] = {}
    calibration: tuple[Calibration, float] | None = None
    loaded: tuple[ScalableProfile, str] | None = None
    run = run_config(**run_options)
    units_per_sample = 1
    for count in counts:
        sized = run_config(gpus=count, **run_options)
        check_for_workload(sized, chosen.info)
        try:
            step = _prepare(chosen, sized, config, progress if loaded is None else None, loaded)
        except NotSplittable as exc:
            if len(counts) == 1:
                raise
            notes.append(f"no machines of {count} GPUs: {exc}")
            continue
        loaded = (step.profile, step.method)
        if count == counts[0]:
            measured, calibration = _measurements(chosen, step, store, software, notes)
        predictor = _predictor(chosen, step)
        units_per_sample = (
            (step.run.new_tokens or 1) if predictor.serving else (step.run.seq_len or 1)
        )
        for gpu in targets:
            if progress is not None:
                progress(f"{count} x {gpu.name}" if count > 1 else gpu.name)
            memory = estimate_on_gpu(
                step.memory,
                step.run,
                gpu,
                catalog,
                software,
                method=step.method,
                search_seq_len=False,
                shorter_seq_when_unfit=True,
                kv_per_token_bytes=step.kv_per_token,
                kv_head_count=step.kv_heads,
            )
            speed = speed_unknown = None
            if memory.fits:
                try:
                    speed = predictor.on_gpu(gpu, gpu_rates(gpu), memory)
                except UsageError as exc:  # the catalog lacks what the prediction needs
                    speed_unknown = str(exc)
            if speed is not None and calibration is not None:
                speed = correct([speed], *calibration)[0]
            found = measured.get((gpu.id, count))
            options.append(
                Option(
                    gpu=gpu,
                    count=count,
                    memory=memory,
                    speed=speed,
                    measured=found,
                    speed_unknown=speed_unknown,
                )
            )
        run = step.run
    question = Question(
        mode=acquire,  # type: ignore[arg-type]
        metric=metric,
        job=job,
        budget_usd=budget_usd,
        within_hours=within_hours,
        region=place.id,
        used=used,
        gpu_only=gpu_only,
        provider=provider,
        min_batch=min_batch,
        top=top,
        preset=chosen_preset.id if chosen_preset else None,
        vendor=maker,
        notes=tuple(notes),
    )
    _keep_replays()
    return rank(
        options,
        workload=chosen.info.name,
        run=run,
        question=question,
        units_per_sample=units_per_sample,
        catalog=catalog,
        region=place.id,
    )


def _require_positive(option: str, value: float | None, unit: str = "") -> None:
    """``UsageError`` unless ``value`` (when given) is a finite number above 0."""
    if value is not None and not (math.isfinite(value) and value > 0):
        raise UsageError(
            f"{option} must be a finite number above 0{f' ({unit})' if unit else ''}, not {value}."
        )


def _job_size(
    hours: float | None,
    samples: float | None,
    tokens: float | None,
    epochs: float | None,
    dataset_size: int | None,
) -> JobSize | None:
    """The job from its one given size, or None; two sizes at once are a usage error."""
    given = [
        n
        for n, v in (
            ("--hours", hours),
            ("--samples", samples),
            ("--tokens", tokens),
            ("--epochs", epochs),
        )
        if v is not None
    ]
    if len(given) > 1:
        raise UsageError(f"Give one job size, not {' and '.join(given)}.")
    if epochs is not None and dataset_size is None:
        raise UsageError("--epochs needs --dataset-size (samples per epoch).")
    if dataset_size is not None and epochs is None:
        raise UsageError("--dataset-size goes with --epochs.")
    if not given:
        return None
    for name, v in (
        ("--hours", hours),
        ("--samples", samples),
        ("--tokens", tokens),
        ("--epochs", epochs),
        ("--dataset-size", dataset_size),
    ):
        _require_positive(name, v)
    return JobSize(
        hours=hours, samples=samples, tokens=tokens, epochs=epochs, dataset_size=dataset_size
    )


def _metric(sort: str | None) -> RankMetric | None:
    choices = ("cost", "perf-per-dollar", "time", "throughput")
    if sort is None:
        return None
    if sort not in choices:
        raise UsageError(f"--sort: '{sort}' is not one of {', '.join(choices)}.")
    return sort  # type: ignore[return-value]


def _gpu_counts(spec: int | str | None) -> list[int]:
    """``--gpus``: a count, ``auto`` (1, 2, 4, 8) or a range ``A-B`` (the powers of 2 in it),
    each within one machine."""
    from whichgpu.estimate.data_parallel import check_one_node

    if spec is None:
        return [1]
    if isinstance(spec, int):
        counts = [spec]
    else:
        text = str(spec).strip().lower()
        try:
            if text == "auto":
                counts = [1, 2, 4, 8]
            elif "-" in text:
                low, high = (int(x) for x in text.split("-", 1))
                if low > high:
                    raise UsageError(
                        f"--gpus: the range '{spec}' runs backwards; write {high}-{low}."
                    )
                counts = [n for n in (1, 2, 4, 8) if low <= n <= high] or [low]
            else:
                counts = [int(text)]
        except ValueError as exc:
            raise UsageError(
                f"--gpus: '{spec}' is not a count, 'auto' or a range like 1-4."
            ) from exc
    if any(n < 1 for n in counts):
        raise UsageError(f"--gpus: counts start at 1, not {spec}.")
    for n in counts:
        check_one_node(n)
    return counts


def _measurements(
    chosen: Workload,
    step: _Step,
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
                calibrations.append(_calibration(chosen, step, r, software))
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


# --- report: everything the HTML report shows, gathered once ---------------------------------

if TYPE_CHECKING:
    from whichgpu.report_data import ReportData


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
    used: bool = False,
    gpu_only: bool = False,
    provider: str | None = None,
    within_hours: float | None = None,
    min_batch: int | None = None,
    sort: str | None = None,
    vendor: str | None = None,
    **run_options: Any,
) -> ReportData:
    """Everything ``whichgpu report`` shows, computed once and returned as ``ReportData``.

    The recommendation (``recommend`` with the same question: ``preset``, ``used``,
    ``gpu_only``, ``provider``, ``within_hours``, ``min_batch``, ``sort`` and ``vendor`` are
    its), then for its candidates (or
    ``gpus``): throughput per GPU normalised to ``reference`` (default: the leading candidate;
    a stored ``bench`` result of the same run replaces the prediction and is marked measured),
    memory and the largest batch (``fit``), performance per dollar of the GPU alone, of 1, 2,
    4 and 8-GPU machines and rented (``cost.value`` with the predicted speeds), and renting
    against owning the leading candidate (``cost.breakeven``). ``results=True`` adds the
    stored benchmark results as Lambda's tables (``store.pivot_results``). Provenance —
    catalog version, price dates, the speed model's validation error, the run configuration,
    the tool version — comes with it.
    """
    import datetime as dt

    from whichgpu import __version__, cost
    from whichgpu.errors import WhichGpuError
    from whichgpu.estimate.throughput import error_band, error_band_basis, load_parameters
    from whichgpu.report_data import ReportData, ReportProvenance, SpeedPoint
    from whichgpu.schema import SCHEMA_VERSION, ValueTable
    from whichgpu.store import ResultPivot, ResultStore, pivot_results

    ranking = recommend(
        workload,
        config=config,
        task=task,
        model=model,
        preset=preset,
        acquire=acquire,
        used=used,
        gpu_only=gpu_only,
        provider=provider,
        within_hours=within_hours,
        min_batch=min_batch,
        sort=sort,
        vendor=vendor,
        budget_usd=budget_usd,
        gpu_count=gpu_count,
        gpus=gpus,
        hours=hours,
        samples=samples,
        tokens=tokens,
        epochs=epochs,
        dataset_size=dataset_size,
        region=region,
        top=top,
        stack=stack,
        store=store,
        prices=prices,
        progress=progress,
        **run_options,
    )
    if workload is None and config is None and model is None:
        workload = ranking.workload  # the preset's
    chosen = _select(workload, config, task, model)
    # the speeds and memory of the run the ranking answered (a preset's options included)
    run_options = ranking.run.model_dump(exclude_defaults=True, exclude={"gpus"})
    catalog = load_catalog(prices)
    notes: list[str] = []
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
    speeds_predicted = predict(
        workload, config=config, task=task, model=model, gpus=shown, stack=stack, **run_options
    )
    memory = fit(
        workload, config=config, task=task, model=model, gpus=shown, stack=stack, **run_options
    )
    # the measurements the ranking used (its assumptions carry the notes of those left out)
    one_gpu = _prepare(chosen, ranking.run.model_copy(update={"gpus": 1}), config, None)
    measured, _ = _measurements(chosen, one_gpu, store, get_stack(stack), [])
    rows: list[tuple[ThroughputEstimate, float, float, float, str]] = []
    for e in speeds_predicted:
        if e.speed_unknown is not None:
            notes.append(f"{e.gpu_name}: {e.speed_unknown}")
            continue
        if not e.fits or e.throughput is None:
            notes.append(f"{e.gpu_name}: does not fit at this run, so it has no speed.")
            continue
        m = measured.get((e.gpu, 1))
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
    speeds = tuple(
        sorted(
            (
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
            ),
            key=lambda p: -p.throughput,
        )
    )
    per_gpu = {p.gpu: p.throughput for p in speeds}
    unit = speeds[0].throughput_unit
    tables: list[ValueTable] = []

    def rate(kind: str, count: int | None) -> None:
        try:
            try:  # relative to the reference GPU when it has a price of the kind
                table = cost.value(
                    list(per_gpu),
                    price_kind=kind,
                    count=count,
                    reference=ref_id,
                    throughput=per_gpu,
                    throughput_unit=unit,
                    catalog=catalog,
                )
            except WhichGpuError:
                table = cost.value(
                    list(per_gpu),
                    price_kind=kind,
                    count=count,
                    throughput=per_gpu,
                    throughput_unit=unit,
                    catalog=catalog,
                )
            tables.append(table)
        except WhichGpuError as exc:
            what = "rented" if kind == "cloud" else f"of {count}-GPU machines" if count else ""
            notes.append(f"Performance per dollar {what or 'of the GPU alone'}: {exc}")

    for kind, count in (("buy", None), ("buy", 1), ("buy", 2), ("buy", 4), ("buy", 8)):
        rate(kind, count)
    rate("cloud", None)
    lead = ranking.ranking[0] if ranking.ranking else None
    even = None
    if lead is not None:
        try:
            even = cost.breakeven(
                gpu=lead.gpu, count=lead.count, region=ranking.region, catalog=catalog
            )
        except WhichGpuError as exc:
            notes.append(f"Cloud against own for {lead.gpu_name}: {exc}")
    pivot: ResultPivot | None = None
    n_results = 0
    store_text = None
    if results:
        result_store = ResultStore(Path(store) if store else None)
        store_text = str(result_store.path)
        stored = result_store.list()
        n_results = len(stored)
        if stored:
            pivot = pivot_results(stored)
        else:
            notes.append(f"The results store {store_text} holds no results yet (whichgpu bench).")
    params = load_parameters()
    price_dates: dict[str, str] = {}
    user_prices = False
    for gid in per_gpu:
        dates = sorted(p.as_of.isoformat() for p in catalog.prices(gid))
        user_prices = user_prices or any(p.user for p in catalog.prices(gid))
        if dates:
            price_dates[gid] = dates[0] if dates[0] == dates[-1] else f"{dates[0]} .. {dates[-1]}"
    run = ranking.run
    described = {
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
    }
    title = str(config) if config else (model or chosen.info.name)
    _keep_replays()
    return ReportData(
        title=title,
        workload=chosen.info.name,
        run=run,
        ranking=ranking,
        reference=ref_id,
        reference_name=by_id[ref_id][0].gpu_name,
        speeds=speeds,
        throughput=tuple(speeds_predicted),
        memory=tuple(memory),
        value=tuple(tables),
        breakeven=even,
        breakeven_gpu=lead.gpu if even is not None and lead is not None else None,
        breakeven_count=lead.count if lead is not None else 1,
        results=pivot,
        results_count=n_results,
        notes=tuple(notes),
        provenance=ReportProvenance(
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
            memory_method=memory[0].method if memory else "",
            run=described,
            store=store_text,
        ),
    )


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


def _calibration(
    chosen: Workload, step: _Step, result: BenchResult, software: SoftwareStack
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


def _predictor(chosen: Workload, step: _Step) -> ThroughputPredictor:
    """The throughput predictor of ``step``: what its GPUs exchange, and for a mixture of
    experts served, how its tokens are routed."""
    from whichgpu.estimate.prediction import ThroughputPredictor
    from whichgpu.estimate.serving import routed_experts

    return ThroughputPredictor(
        step.profile,
        step.run,
        family=chosen.info.family,
        method=step.method,
        state=_exchange_state(step),
        routed=None if step.model_config is None else routed_experts(step.model_config),
    )


def _exchange_state(step: _Step) -> StepState | None:
    """What several GPUs exchange for this step (None on one GPU): gradients and parameters in
    data-parallel training, hidden states in tensor-parallel inference."""
    from whichgpu.estimate.prediction import StepState
    from whichgpu.estimate.serving import layer_shape, serving_dtype_bytes
    from whichgpu.estimate.sharding import Parallel, working_bytes

    if step.run.gpus <= 1:
        return None
    if step.model_config is not None:  # a language model served tensor parallel
        layers, hidden = layer_shape(step.model_config)
        return StepState(
            layers=layers,
            hidden_bytes_per_token=hidden * serving_dtype_bytes(step.run.precision),
            kv_heads=step.kv_heads or 0,
        )
    gradient_bytes = sum(step.memory.state_sizes("gradient"))
    parameter_bytes = sum(step.memory.state_sizes("parameter"))
    if step.memory.plan(Parallel(step.run.gpus, step.run.sharding)).working_parameters:
        # the GPUs gather and reduce the plan's 16-bit working copies
        gradient_bytes = working_bytes(gradient_bytes)
        parameter_bytes = working_bytes(parameter_bytes)
    return StepState(gradient_bytes=gradient_bytes, parameter_bytes=parameter_bytes)

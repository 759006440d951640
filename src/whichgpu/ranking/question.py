"""The question ``recommend`` answers, checked once: how to acquire the GPUs, for what job,
under which constraints.

``ask`` turns what the caller gave (keywords, and a preset whose values fill what was not
given) into a ``Question`` and the run options to size, applying every rule on how the
options combine: one job size, ``--within`` only with a job in work, ``--used``/``--new`` and
``--gpu-only`` only to buy, a renter's ``--budget`` only with a job. Where a preset's value
cannot apply it is dropped with a note rather than refused; where the user's can not, it is
a ``UsageError``. ``gpu_counts``, ``keep_vendor`` and ``check_provider`` check the options that
need the catalog.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from whichgpu.catalog.query import Catalog
from whichgpu.errors import UsageError, option, require_positive
from whichgpu.schema import AcquireMode, GpuSpec, JobSize, RankMetric, ServingEngine, Vendor

METRICS: tuple[RankMetric, ...] = ("cost", "perf-per-dollar", "time", "throughput")
"""What ``sort`` may choose (the default depends on the job: see ``whichgpu.ranking.rank``)."""


@dataclass(frozen=True)
class Question:
    """What the user asked: how to acquire, for what job, under which constraints."""

    mode: AcquireMode = "buy"
    metric: RankMetric | None = None
    job: JobSize | None = None
    budget_usd: float | None = None
    within_hours: float | None = None
    region: str | None = None
    used: bool = False
    """Buying: rank each GPU at its used price where that is lower than its new one."""
    gpu_only: bool = False
    provider: str | None = None
    min_batch: int | None = None
    top: int | None = None
    preset: str | None = None
    vendor: str | None = None
    serving: ServingEngine | None = None
    """``--serving ENGINE`` (inference of a language model): a candidate fits when the
    engine's KV cache holds the asked concurrency, and ranks by the engine's output tokens/s;
    None: plain PyTorch generation."""
    notes: tuple[str, ...] = ()
    """What the question took for granted beyond its fields (a preset's maker), for the
    assumptions."""


@dataclass(frozen=True)
class Asked:
    """A question with a preset's values merged in and checked, before the catalog is asked:
    the ``Question`` (its ``region`` and ``vendor`` still to be resolved) and what sizes it."""

    question: Question
    workload: str | None
    """The workload named, else the preset's (None when neither names one)."""
    run_options: dict[str, Any] = field(default_factory=dict)
    """The run options: the given ones over the preset's."""
    gpu_count: int | str | None = None
    """GPUs per machine as given (a count, ``auto`` or a range; see ``gpu_counts``)."""
    vendor: str | None = None
    """The maker asked for, as given (see ``keep_vendor``)."""


def ask(
    *,
    workload: str | None,
    named: bool,
    run_options: Mapping[str, Any],
    preset: str | None = None,
    acquire: str | None = None,
    budget_usd: float | None = None,
    within_hours: float | None = None,
    used: bool | None = None,
    gpu_only: bool = False,
    provider: str | None = None,
    gpu_count: int | str | None = None,
    vendor: str | None = None,
    hours: float | None = None,
    samples: float | None = None,
    tokens: float | None = None,
    epochs: float | None = None,
    dataset_size: int | None = None,
    min_batch: int | None = None,
    top: int | None = None,
    sort: str | None = None,
    serving: str | None = None,
) -> Asked:
    """The question asked, checked. ``named``: the caller names its own model (a ``config``
    file or a ``model`` function), so the preset's workload does not replace it; explicit
    arguments win over the preset's values. ``used``: True (``--used``) or None (not said)
    ranks a GPU to buy at its used price where that is lower than its new one; False
    (``--new``) at new prices only."""
    from whichgpu.ranking.presets import get_preset

    chosen = get_preset(preset) if preset is not None else None
    notes: list[str] = []
    budget_given, within_given = budget_usd is not None, within_hours is not None
    options = dict(run_options)
    if chosen is not None:
        if workload is None and not named:
            workload = chosen.workload
        options = {**chosen.run, **{k: v for k, v in run_options.items() if v is not None}}
        asked = chosen.question
        acquire = acquire or asked.get("mode")
        budget_usd = budget_usd if budget_usd is not None else asked.get("budget_usd")
        within_hours = within_hours if within_hours is not None else asked.get("within_hours")
        if min_batch is None and asked.get("min_batch") is not None:
            if workload == chosen.workload:
                min_batch = asked["min_batch"]
            else:  # a batch size means something only for the preset's own workload
                notes.append(
                    f"the preset's --min-batch {asked['min_batch']} is for its own workload "
                    f"({chosen.workload}); give --min-batch for yours"
                )
        gpu_count = gpu_count if gpu_count is not None else asked.get("gpus")
        if vendor is None and asked.get("vendor"):
            vendor = asked["vendor"]
            notes.append(
                f"preset {chosen.id} keeps to {Vendor(vendor).label} GPUs: "
                f"{chosen.vendor_rationale}; --vendor any considers every maker"
            )
        if hours is None and samples is None and tokens is None and epochs is None:
            hours, samples, tokens = asked.get("hours"), asked.get("samples"), asked.get("tokens")
    mode = _acquire(acquire or "buy", used=used, gpu_only=gpu_only)
    open_to_used = mode == "buy" and used is not False
    require_positive("budget_usd", budget_usd, "dollars")
    require_positive("within_hours", within_hours, "hours")
    require_positive("min_batch", min_batch, "samples")
    require_positive("top", top, "rows")
    job = job_size(hours, samples, tokens, epochs, dataset_size)
    engine = serving_engine(serving, options.get("mode"))
    if within_hours is not None and (job is None or job.hours is not None):
        if within_given:
            raise UsageError(
                "--within is a deadline for finishing a job: give its size in work (--samples, "
                "--tokens, or --epochs with --dataset-size)."
            )
        notes.append(f"the preset's {within_hours:,.0f} h deadline needs a job size in work")
        within_hours = None
    if budget_usd is not None and mode == "rent" and job is None:
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
    question = Question(
        mode=mode,
        metric=metric(sort),
        job=job,
        budget_usd=budget_usd,
        within_hours=within_hours,
        used=open_to_used,
        gpu_only=gpu_only,
        provider=provider,
        min_batch=min_batch,
        top=top,
        preset=chosen.id if chosen else None,
        serving=engine,
        notes=tuple(notes),
    )
    return Asked(question, workload, options, gpu_count, vendor)


def serving_engine(serving: str | None, mode: str | None) -> ServingEngine | None:
    """The serving engine ``serving`` names (None: plain PyTorch generation); an engine serves
    inference only."""
    if serving is None:
        return None
    if mode != "inference":
        raise UsageError(
            f"{option('serving')} ranks GPUs by a serving engine's KV cache and speed; add "
            f"{option('mode')} inference."
        )
    from whichgpu.catalog.stacks import get_serving_engine

    return get_serving_engine(serving)


def _acquire(acquire: str, *, used: bool | None, gpu_only: bool) -> AcquireMode:
    """``buy`` or ``rent``, checked against the options that only buying takes."""
    if acquire not in ("buy", "rent"):
        raise UsageError(f"Choose --buy or --rent, not '{acquire}'.")
    if used is not None and acquire == "rent":
        said = "--used" if used else "--new"
        raise UsageError(f"{said} prices cards to buy; drop it to rent (or use --buy).")
    if gpu_only and acquire == "rent":
        raise UsageError(
            "--gpu-only prices bought cards without a computer around them; drop it to rent "
            "(or use --buy)."
        )
    return "rent" if acquire == "rent" else "buy"


def job_size(
    hours: float | None,
    samples: float | None,
    tokens: float | None,
    epochs: float | None,
    dataset_size: int | None,
) -> JobSize | None:
    """The job from its one given size, or None; two sizes at once are a usage error."""
    sizes = (("hours", hours), ("samples", samples), ("tokens", tokens), ("epochs", epochs))
    given = [n for n, v in sizes if v is not None]
    if len(given) > 1:
        raise UsageError(f"Give one job size, not {' and '.join(option(n) for n in given)}.")
    if epochs is not None and dataset_size is None:
        raise UsageError(f"{option('epochs')} needs {option('dataset_size')} (samples per epoch).")
    if dataset_size is not None and epochs is None:
        raise UsageError(f"{option('dataset_size')} goes with {option('epochs')}.")
    if not given:
        return None
    for name, v in (*sizes, ("dataset_size", dataset_size)):
        require_positive(name, v)
    return JobSize(
        hours=hours, samples=samples, tokens=tokens, epochs=epochs, dataset_size=dataset_size
    )


def metric(sort: str | None) -> RankMetric | None:
    """The metric ``sort`` names (None: the job decides)."""
    if sort is None:
        return None
    if sort not in METRICS:
        raise UsageError(f"--sort: '{sort}' is not one of {', '.join(METRICS)}.")
    return sort


AUTO_COUNTS = (1, 2, 4, 8)
"""``--gpus auto``: the GPUs of one machine (``max_gpus_per_node`` in the link data is 8)."""
AUTO_CLUSTERS = (16, 32, 64)
"""``--gpus auto`` beyond one machine: clusters of 2, 4 and 8 machines of 8, ranked only when
no machine of ``AUTO_COUNTS`` meets the question's deadline (``whichgpu.api.recommend``)."""


def gpu_counts(
    spec: int | str | None,
    mode: str = "train",
    network: str | None = None,
) -> list[int]:
    """``--gpus``: a count, ``auto`` (``AUTO_COUNTS``: one machine) or a range ``A-B`` (the
    powers of 2 in it). Beyond one machine's 8 the GPUs are a cluster of machines of 8 joined
    by the fabric ``network`` names (None: the default): ``check_gpu_count`` refuses what
    cannot be timed there (a count 8 does not divide, more than 4,096, serving across
    machines, an unknown fabric), a range's counts included."""
    from whichgpu.estimate.data_parallel import check_gpu_count

    if spec is None:
        counts = [1]
    elif isinstance(spec, int):
        counts = [spec]
    else:
        text = str(spec).strip().lower()
        try:
            if text == "auto":
                counts = list(AUTO_COUNTS)
            elif "-" in text:
                low, high = (int(x) for x in text.split("-", 1))
                if low > high:
                    raise UsageError(
                        f"--gpus: the range '{spec}' runs backwards; write {high}-{low}."
                    )
                powers = (2**k for k in range(max(high, 1).bit_length()))
                counts = [n for n in powers if low <= n <= high] or [low]
            else:
                counts = [int(text)]
        except ValueError as exc:
            raise UsageError(
                f"--gpus: '{spec}' is not a count, 'auto' or a range like 1-4."
            ) from exc
    if any(n < 1 for n in counts):
        raise UsageError(f"--gpus: counts start at 1, not {spec}.")
    for n in counts:
        check_gpu_count(n, mode, network)
    return counts


def keep_vendor(targets: Sequence[GpuSpec], vendor: str | None) -> tuple[list[GpuSpec], str | None]:
    """The GPUs of the maker ``vendor`` names (``any`` or None: every maker), and the maker."""
    maker = vendor.strip().lower() if vendor is not None else None
    if maker == "any":
        maker = None
    if maker is None:
        return list(targets), None
    makers = sorted({g.vendor.value for g in targets})
    if maker not in makers:
        raise UsageError(f"--vendor: '{vendor}' is not one of {', '.join(makers)} (or any).")
    return [g for g in targets if g.vendor.value == maker], maker


def check_provider(provider: str | None, mode: AcquireMode, catalog: Catalog) -> None:
    """A provider to rent from must have cloud prices in ``catalog``, and goes with renting."""
    if provider is None:
        return
    from whichgpu.cost.pricing import known_providers

    providers = known_providers(catalog)
    if provider.strip().lower() not in providers:
        raise UsageError(
            f"--provider: unknown provider '{provider}'. Providers with cloud prices in the "
            f"catalog: {', '.join(providers)}."
        )
    if mode != "rent":
        raise UsageError("--provider chooses whom to rent from; add --rent.")

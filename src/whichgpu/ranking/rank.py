"""Join fit, speed and prices into a ranking with reasons (``whichgpu recommend``).

Over 600 lines because pricing, filtering, ordering and the reasons of one ranking read the
same options and write one ``Ranking``; its helpers are private to that flow.

The caller (``whichgpu.api.recommend``) sizes the step on every candidate GPU and count
(``estimate.memory``), predicts its speed (``estimate.prediction``) and finds any stored
measurement of it; this module prices each option (``whichgpu.cost``), applies the user's
constraints, orders the survivors by the metric the question calls for and writes down why.

- The metric: the cost to finish the job when its size is given as work (samples, tokens,
  epochs); for a job given in hours of use, the work done per dollar over those hours (buy:
  machine + electricity; rent: the rental), since the cost of a fixed time does not depend on
  speed and would favour the slowest cheap card; else performance per dollar (buy: throughput
  per $1,000 of machine; rent: units per dollar of rental).
- Buy: the GPUs' price (the lower of the freshest new and used, else launch; the new one
  where the question keeps to new prices, ``--new``) times the count, plus the base system
  of the smallest build class that holds them; the job adds its electricity at the region's
  price (board power of the GPUs plus the class's CPU figure).
- Rent: the cheapest on-demand rate per GPU-hour (or the provider's) offered for that many GPUs
  in one machine (``Price.instance_gpus``), times the count.
- A cluster (more GPUs than a node's 8: ``estimate.data_parallel.node_count`` machines of 8
  joined by the run's fabric): each machine priced as one 8-GPU machine (rent: the rate for 8
  in one machine; buy: 8 GPUs + the server's base system, and each machine's electricity),
  times the machines; the fabric's switches and cables are not priced (no sourced figure), and
  the assumptions say that a rate does not tell which clouds join their machines by it.
- Uncertainty: a predicted throughput carries its band; when the runner-up's best case beats
  the leader's worst case on the metric, the ranking says they are too close to call.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from whichgpu.catalog.cost_data import build_class_for, shipped_cost_data
from whichgpu.catalog.freshness import stale_note, stale_policy
from whichgpu.catalog.query import Catalog
from whichgpu.catalog.software import SupportVerdict, support_for
from whichgpu.cost import build_checks, job_energy, machine_power_w
from whichgpu.cost.base_system import base_system_cost
from whichgpu.cost.pricing import cloud_price, machine_sizes, price_note, purchase_price
from whichgpu.errors import UsageError
from whichgpu.estimate.data_parallel import fabric_note, get_fabric, node_count
from whichgpu.estimate.prediction import half_precision_note
from whichgpu.numbers import significant
from whichgpu.ranking.question import Question
from whichgpu.schema import (
    EXCLUSION_LABELS,
    BenchResult,
    Candidate,
    Exclusion,
    ExclusionKind,
    GpuSpec,
    JobSize,
    MemoryEstimate,
    Price,
    Ranking,
    RankMetric,
    RunConfig,
    ThroughputEstimate,
    Vendor,
    gpus_label,
)
from whichgpu.units import DAYS_PER_YEAR, GIB, HOURS_PER_DAY, SECONDS_PER_HOUR

_BETTER_HIGH = {"cost": False, "time": False, "throughput": True, "perf-per-dollar": True}


@dataclass(frozen=True)
class Option:
    """One GPU at one count, sized and timed, before prices and constraints."""

    gpu: GpuSpec
    """The GPU."""
    count: int
    """How many of it."""
    memory: MemoryEstimate
    """Fit at the batch considered (its largest, unless the user gave one)."""
    speed: ThroughputEstimate | None
    """Predicted speed (None when the catalog lacks the specs to predict it)."""
    measured: BenchResult | None = None
    """A stored measurement of the same run on this GPU and count, newest first."""
    speed_unknown: str | None = None
    """Why ``speed`` is None although the GPU fits: what the catalog lacks to predict it."""


def job_units(job: JobSize, unit: str, units_per_sample: int) -> float | None:
    """The job in the throughput's unit (None for a job given in hours)."""
    if job.hours is not None:
        return None
    tokens = unit.startswith(("tokens", "output tokens", "prompt tokens"))
    if job.tokens is not None:
        if not tokens:
            raise UsageError(
                f"--tokens sizes a language model's job; this workload counts {unit}. Give "
                "--samples (or --epochs with --dataset-size) instead."
            )
        return job.tokens
    samples = job.samples
    if samples is None and job.epochs is not None and job.dataset_size is not None:
        samples = job.epochs * job.dataset_size
    if samples is None:
        raise UsageError("--epochs needs --dataset-size (samples per epoch).")
    return samples * (units_per_sample if tokens else 1)


@dataclass
class _Priced:
    option: Option
    throughput: float
    low: float
    high: float
    source: str
    purchase_usd: float | None
    hourly_usd: float | None
    cost_usd: float
    hours: float | None
    time_s: float | None
    energy_kwh: float | None
    electricity_usd: float | None
    co2_kg: float | None
    ppd: float
    note: str
    extra: list[str]
    ranking_band: float = 0.0
    """Error of its throughput against another GPU's (0: measured)."""
    price: Price | None = None
    """The price it was ranked with (its date and age go into the answer)."""
    owned_hourly_usd: float | None = None
    """Buying a serving machine: its price over the cost data's ``default_years`` of use plus
    an hour's electricity at full load, USD per hour (None: renting, or no power figure)."""
    tier: int = 0
    """0: its stack runs everything the run needs; 1: some of it only with limits, so it ranks
    after every tier-0 option (``SOFTWARE_TIER_NOTE``)."""


def _buying_price(catalog: Catalog, gpu_id: str, used: bool) -> Price | None:
    """What one GPU costs to buy today (``Catalog.purchase_price``): open to used cards
    (``used``), the lower of the freshest new and used prices; with ``--new``, the freshest new
    one; either way the launch price where neither is known."""
    return catalog.purchase_price(gpu_id, used=None if used else False)


def engine_name(label: str) -> str:
    """A serving engine's name and version from its label, without its arguments: ``vLLM 0.11
    (V1 engine)`` of ``vLLM 0.11 (V1 engine), default engine arguments``."""
    return label.split(",")[0]


def _gib(nbytes: int, other: int | None = None) -> str:
    """GiB (as ``fit`` shows memory) with one decimal, or two when ``other`` would print the
    same."""
    digits = 2 if other is not None and round(nbytes / GIB, 1) == round(other / GIB, 1) else 1
    return f"{nbytes / GIB:,.{digits}f} GiB"


def rank(
    options: Sequence[Option],
    *,
    workload: str,
    run: RunConfig,
    question: Question,
    units_per_sample: int,
    catalog: Catalog,
    region: str,
) -> Ranking:
    """Price, filter and order ``options`` for ``question``; every exclusion gets a reason."""
    q = question
    metric: RankMetric = q.metric or ("cost" if _work_job(q) else "perf-per-dollar")
    excluded: list[Exclusion] = []
    priced: list[_Priced] = []

    def exclude(option: Option, kind: ExclusionKind, reason: str) -> None:
        excluded.append(
            Exclusion(
                gpu=option.gpu.id,
                gpu_name=option.gpu.name,
                count=option.count,
                kind=kind,
                reason=reason,
            )
        )

    unit = ""
    for option in options:
        memory = option.memory
        served = memory.serving
        if not memory.fits and served is not None:  # --serving: the engine's KV cache decides
            asked = memory.batch_size if memory.batch_given else 1
            per_gpu = f", per GPU of {option.count}, tensor parallel" if option.count > 1 else ""
            reason = (
                f"{engine_name(served.engine_label)}: {served.holds_words()}, not {asked} ("
                + (
                    f"{_gib(served.kv_cache_budget_bytes)} of KV budget{per_gpu})"
                    if served.kv_cache_budget_bytes > 0
                    else f"the weights and activations leave no KV budget{per_gpu})"
                )
            )
            exclude(option, "memory", reason)
            continue
        if not memory.fits or (q.min_batch is not None and memory.max_batch_size < q.min_batch):
            at = q.min_batch or memory.batch_size
            reason = (
                f"needs {_gib(memory.device_total_bytes, memory.capacity_bytes)} at batch "
                f"{memory.batch_size}, has {_gib(memory.capacity_bytes, memory.device_total_bytes)}"
                if not memory.fits
                else f"largest batch {memory.max_batch_size} is below --min-batch {at}"
            )
            if option.count > 1:
                reason += f" per GPU ({option.count} GPUs, {run.parallelism()})"
            if not memory.fits and memory.fits_at_seq_len and memory.batch_size == 1:
                noun = "context" if run.mode == "inference" else "sequence length"
                reason += f"; batch 1 fits at {noun} {memory.fits_at_seq_len:,}"
            unfused = memory.overheads.get("attention_kernels", 0)
            if unfused:
                reason += (
                    f"; attention on PyTorch's math path adds {_gib(unfused)}, as no fused "
                    f"kernel takes {run.precision} on this GPU (--precision fp16 runs fused)"
                )
            exclude(option, "memory" if not memory.fits else "batch", reason)
            continue
        verdicts = support_for(option.gpu, memory.run)
        blocked = [v for v in verdicts if v.effect == "exclude"]
        if blocked:
            exclude(option, "build", SOFTWARE_PREFIX + "; ".join(v.describe() for v in blocked))
            continue
        speed = option.speed
        if option.measured is not None and option.measured.throughput:
            throughput = low = high = option.measured.throughput
            unit = option.measured.throughput_unit
            source = "measured"
            ranking_band = 0.0
        elif speed is not None and speed.serving_speed is not None:  # --serving
            engine_speed = speed.serving_speed
            if engine_speed.new_tokens == 0:  # prefill-only requests: prompt tokens/s
                throughput = low = high = engine_speed.prompt_tokens_per_s or 0.0
                unit = "prompt tokens/s"
            else:
                throughput = low = high = engine_speed.output_tokens_per_s
                unit = "output tokens/s"
            source = "predicted"
            ranking_band = 0.0
        elif speed is not None and speed.throughput is not None:
            throughput = speed.throughput
            low, high = speed.low or throughput, speed.high or throughput
            unit = speed.throughput_unit
            source = "predicted"
            ranking_band = speed.ranking_band
        else:
            exclude(option, "speed", option.speed_unknown or "its speed cannot be predicted")
            continue
        extra: list[str] = list(half_precision_note(option.gpu, run.precision))
        software, tier = _software_reasons(verdicts)
        if option.gpu.vendor != Vendor.NVIDIA:
            extra.append(
                f"made by {option.gpu.vendor.value.upper()}: the estimates assume PyTorch's "
                "kernels and allocator as on CUDA; "
                + (
                    "the software lines say what this run's libraries support on it"
                    if software
                    else "check that your libraries support it, or keep to --vendor nvidia"
                )
            )
        extra += software
        purchase = hourly = None
        # beyond one machine's GPUs: machines of the node's size, each priced as one machine
        machines = node_count(option.count)
        per_machine = option.count // machines
        if q.mode == "buy":
            price = _buying_price(catalog, option.gpu.id, q.used)
            if price is None:
                exclude(option, "price", "no purchase price in the catalog (add one with --prices)")
                continue
            note = f"{option.count} x {price_note(price)}"
            purchase = price.usd * option.count
            if not q.gpu_only:
                # modules (SXM, OAM) sit on a server's baseboard, never in a desktop
                module = option.gpu.is_module
                build = build_class_for(per_machine, module=module)
                base = base_system_cost(option.gpu, per_machine, build, shipped_cost_data().rules)
                if base is None:
                    exclude(option, "price", f"no base system cost for a {build.id}")
                    continue
                purchase += base.usd * machines
                note += f" + {machines} x " if machines > 1 else " + "
                note += base.describe()
                if module:
                    form = option.gpu.form_factor.value.upper() if option.gpu.form_factor else ""
                    extra.append(
                        f"a {form} module: it needs a GPU server's baseboard (priced as the "
                        "server build class); such boards usually take 4 or 8"
                    )
            if machines > 1:
                note = f"{machines} machines of {per_machine}: {note}"
            if price.kind == "launch":
                extra.append(
                    f"only its launch price ({price.as_of:%Y}) is in the catalog; today's street "
                    "price may differ (add yours with --prices)"
                )
            cheaper = _used_instead(catalog, option.gpu.id, price, q.used)
            if q.budget_usd is not None and purchase > q.budget_usd:
                reason = (
                    f"over budget by ${purchase - q.budget_usd:,.0f} "
                    f"(${purchase:,.0f} for the "
                    f"{'GPUs' if q.gpu_only else 'machine' if machines == 1 else 'machines'})"
                )
                if cheaper is not None:
                    saving = (price.usd - cheaper.usd) * option.count
                    fits = purchase - saving <= q.budget_usd
                    reason += f"; used it is ${cheaper.usd:,.0f} a GPU ({cheaper.as_of}), " + (
                        "which fits: drop --new" if fits else "still over"
                    )
                exclude(option, "budget", reason)
                continue
            if cheaper is not None:
                extra.append(
                    f"a used one is ${cheaper.usd:,.0f} ({cheaper.as_of}, {cheaper.source}), "
                    f"${price.usd - cheaper.usd:,.0f} below the price ranked: without --new "
                    "it ranks with it"
                )
        else:
            try:
                price = cloud_price(catalog, option.gpu, q.provider, gpus=per_machine)
            except UsageError:
                exclude(option, "price", _no_rental(catalog, option.gpu, per_machine, q.provider))
                continue
            hourly = price.usd * option.count
            note = f"{option.count} x {price_note(price)}"
            if machines > 1:
                note = f"{machines} machines of {per_machine}: {note}"
            if per_machine > 1 and price.instance_gpus is None:
                extra.append(
                    f"the source of {price.provider}'s rate does not say that it rents "
                    f"{per_machine} in one machine; check before counting on their links"
                )
            if machines > 1:
                extra.append(
                    f"assumes {price.provider} rents {machines} such machines at once, joined "
                    f"by {get_fabric(run.network).name}: its rate in the catalog does not say "
                    "which fabric joins its machines, nor how many it has free"
                )
        units = job_units(q.job, unit, units_per_sample) if q.job is not None else None
        hours = q.job.hours if q.job is not None else None
        time_s = None
        if units is not None:
            time_s = units / throughput
            hours = time_s / SECONDS_PER_HOUR
            if q.within_hours is not None and hours > q.within_hours:
                exclude(
                    option,
                    "time",
                    f"takes {hours:,.0f} h, more than the {q.within_hours:,.0f} h asked",
                )
                continue
        energy_kwh = electricity = co2 = None
        if q.mode == "buy":
            assert purchase is not None
            cost = purchase
            if hours is not None and option.gpu.tdp_w is not None:
                power = machine_power_w(option.gpu, per_machine, catalog=catalog) * machines
                energy = job_energy(power, hours, region=region)
                energy_kwh, electricity, co2 = (
                    energy.energy_kwh,
                    energy.electricity_usd,
                    (energy.co2_kg),
                )
                cost += electricity or 0.0
            ppd = (
                throughput * SECONDS_PER_HOUR * hours / cost
                if _hours_job(q) and hours is not None
                else throughput / (purchase / 1000)
            )
        else:
            assert hourly is not None
            cost = hourly * hours if hours is not None else hourly
            if q.budget_usd is not None and hours is not None and cost > q.budget_usd:
                exclude(
                    option,
                    "budget",
                    f"the job's rental ${cost:,.0f} is over budget by ${cost - q.budget_usd:,.0f}",
                )
                continue
            ppd = throughput * SECONDS_PER_HOUR / hourly
        if option.count > 1 and q.mode == "buy":
            try:
                report = build_checks(option.gpu, per_machine, catalog=catalog)
            except UsageError as exc:  # not a card to build into a machine (a SoC, a TPU)
                exclude(option, "build", str(exc))
                continue
            supply = next(c for c in report.checks if c.name == "power")
            if supply.status == "fail" and report.psu_w is not None:
                exclude(
                    option,
                    "build",
                    f"priced as a {report.build_class} with a {report.psu_w:,.0f} W power "
                    f"supply, below the {report.load_w or 0:,.0f} W the machine draws; a bigger "
                    "or second supply is not in the price (whichgpu cost build --gpu "
                    f"{option.gpu.id} --count {per_machine})",
                )
                continue
            extra += [
                f"build: {c.name} {c.status}: {c.reason}" for c in report.checks if c.status != "ok"
            ]
        owned_hourly = None
        if q.mode == "buy" and q.serving is not None and option.gpu.tdp_w is not None:
            assert purchase is not None
            power = machine_power_w(option.gpu, per_machine, catalog=catalog) * machines
            years = shipped_cost_data().rules.default_years
            hour = job_energy(power, 1.0, region=region).electricity_usd
            if hour is not None:
                owned_hourly = purchase / (years * DAYS_PER_YEAR * HOURS_PER_DAY) + hour
        priced.append(
            _Priced(
                option,
                throughput,
                low,
                high,
                source,
                purchase,
                hourly,
                cost,
                hours,
                time_s,
                energy_kwh,
                electricity,
                co2,
                ppd,
                note,
                extra,
                ranking_band,
                price,
                owned_hourly,
                tier,
            )
        )

    timed = _work_job(q)

    def value(p: _Priced, throughput: float) -> float:
        """The metric of ``p`` if its throughput were ``throughput`` (for the bands)."""
        slower = p.throughput / throughput
        if metric == "throughput":
            return throughput
        if metric == "perf-per-dollar":
            return p.ppd / slower
        if metric == "time":
            return (p.time_s or 0.0) * slower
        rental = p.cost_usd if timed else 0.0
        varying = (p.electricity_usd or 0.0) if q.mode == "buy" else rental
        return p.cost_usd - varying + varying * slower

    high_is_good = _BETTER_HIGH[metric]
    # a stack that runs the method only with limits ranks after every one that runs it fully
    priced.sort(
        key=lambda p: (p.tier, -value(p, p.throughput) if high_is_good else value(p, p.throughput))
    )
    if metric == "time" and q.job is None:
        raise UsageError("--sort time needs a job size (--samples, --tokens or --epochs).")
    closeness = _closeness(priced, value, high_is_good)
    shown = priced[: q.top] if q.top else priced
    candidates = tuple(_candidate(i + 1, p, priced, metric, q, unit) for i, p in enumerate(shown))
    return Ranking(
        workload=workload,
        run=run,
        mode=q.mode,
        metric=metric,
        job=q.job,
        budget_usd=q.budget_usd,
        within_hours=q.within_hours,
        region=region,
        preset=q.preset,
        vendor=q.vendor,
        ranking=candidates,
        excluded=tuple(excluded),
        answer=" ".join(
            (
                _answer(candidates, excluded, q, metric, run),
                # when nothing qualifies, the answer's advice already names the sharding
                *(_sharding_hint(excluded, run) if candidates else ()),
            )
        ),
        closeness=closeness,
        assumptions=_assumptions(q, metric, priced),
    )


SOFTWARE_PREFIX = "software: "
"""How the reason of a GPU left out because its stack cannot run the method begins (such an
exclusion has the kind ``build``: the machine, its software included, cannot run the job)."""
SOFTWARE_TIER_NOTE = (
    "software: a GPU whose stack runs a method this run needs only with limits (software "
    "support data, sourced and dated) is ranked after every GPU whose stack runs it fully; "
    "one that cannot run it is left out"
)
"""The assumption a ranking states when some candidates were ranked lower for software."""


def _software_reasons(verdicts: Sequence[SupportVerdict]) -> tuple[list[str], int]:
    """A candidate's software lines and its tier (1 when a needed feature runs only with
    limits). Features whose lack only costs a note are mentioned only where they fall short."""
    lines: list[str] = []
    tier = 0
    for v in verdicts:
        if v.effect == "rank-lower":
            tier = 1
            lines.append(
                f"{SOFTWARE_PREFIX}ranked after the GPUs that run it fully: {v.describe()}"
            )
        elif v.effect == "note" or v.feature.effect_unsupported != "note":
            # a shortfall that only costs a note; else a check that matters: runs, or not known
            lines.append(f"{SOFTWARE_PREFIX}{v.describe()}")
    return lines, tier


def _used_instead(catalog: Catalog, gpu_id: str, price: Price, used: bool) -> Price | None:
    """With ``--new``: the newest used price of the GPU where it is below ``price`` (what
    ranking without ``--new`` would use); None otherwise."""
    if used or price.kind == "used":
        return None
    second_hand = purchase_price(catalog, gpu_id, "used")
    return second_hand if second_hand is not None and second_hand.usd < price.usd else None


def _sharding_hint(excluded: list[Exclusion], run: RunConfig) -> tuple[str, ...]:
    """A note naming the machines of several GPUs left out for memory because each of their
    GPUs holds the whole model state (data parallel without sharding it, nor splitting the
    model tensor or pipeline parallel)."""
    if (
        run.mode != "train"
        or run.sharding not in ("ddp", "zero1", "zero2")
        or run.model_parallel() > 1
    ):
        return ()
    machines = [e for e in excluded if e.kind == "memory" and e.count > 1]
    if not machines:
        return ()
    by_gpu: dict[str, list[int]] = {}
    for e in machines:
        by_gpu.setdefault(e.gpu_name, []).append(e.count)
    named = [f"{', '.join(map(str, sorted(c)))} x {name}" for name, c in by_gpu.items()]
    shown = "; ".join(named[:3]) + (f"; and {len(named) - 3} more GPUs" if len(named) > 3 else "")
    return (
        f"{len(machines)} machines of several GPUs were left out for memory ({shown}): under "
        f"{run.sharding} every GPU holds the whole model state; --sharding fsdp (or zero3) "
        "splits the weights, gradients and optimizer state over them.",
    )


def _closeness(
    priced: list[_Priced], value: Callable[[_Priced, float], float], high_is_good: bool
) -> tuple[str, ...]:
    """Pairs of neighbours among the leaders that the error of one GPU's speed against the
    other's could swap on the metric (``too_close_to_rank``: the predictions' relative bands,
    not their absolute ones, whose error the GPUs largely share)."""
    notes = []
    for a, b in itertools.pairwise(priced[:4]):
        if a.tier != b.tier:  # ordered by software support, not by the metric
            continue
        band = max(a.ranking_band, b.ranking_band)
        a_slower, b_as_is = value(a, a.throughput / (1 + band)), value(b, b.throughput)
        if (b_as_is >= a_slower) if high_is_good else (b_as_is <= a_slower):
            notes.append(f"{_label(a)} ≈ {_label(b)}")
    return tuple(notes)


def _label(p: _Priced) -> str:
    o = p.option
    return gpus_label(o.count, o.gpu.name, node_count(o.count))


def _work_job(q: Question) -> bool:
    """Whether the job is sized as work (samples, tokens, epochs): its time depends on speed."""
    return q.job is not None and q.job.hours is None


def _hours_job(q: Question) -> bool:
    """Whether the job is sized in hours of use."""
    return q.job is not None and q.job.hours is not None


def _metric_text(p: _Priced, metric: RankMetric, unit: str, q: Question) -> str:
    if metric == "cost":
        return f"${p.cost_usd:,.0f}"
    if metric == "time":
        return f"{(p.time_s or 0) / SECONDS_PER_HOUR:,.1f} h"
    if metric == "throughput":
        return f"{p.throughput:,.0f} {unit}"
    return f"{significant(p.ppd)} {_ppd_unit(unit, q)}"


def _ppd_unit(unit: str, q: Question) -> str:
    """Buy: throughput per $1,000 of machine; rent, or a job in hours: units per dollar."""
    if q.mode == "buy" and not _hours_job(q):
        return f"{unit} per $1k"
    return f"{unit.removesuffix('/s')} per $"


def _candidate(
    rank_: int,
    p: _Priced,
    everyone: list[_Priced],
    metric: RankMetric,
    q: Question,
    unit: str,
) -> Candidate:
    o = p.option
    m = o.memory
    served = o.speed.serving_speed if o.speed is not None else None
    if m.serving is not None:
        fits = (
            f"fits: {engine_name(m.serving.engine_label)}'s KV cache holds "
            f"{m.max_batch_size} sequences of {m.serving.tokens_per_sequence:,} tokens "
            "(context + new tokens)"
            + (f" over the {o.count} GPUs (tensor parallel)" if o.count > 1 else "")
            + f"; {m.batch_size if m.batch_given else 'its most'} asked"
        )
    elif m.run.mode == "inference" and o.count > 1:
        # tensor parallel: the GPUs serve the sequences together, each holding a share
        fits = (
            f"fits: at most {m.max_batch_size} sequences served over the {o.count} GPUs "
            f"(tensor parallel); each GPU holds {_gib(m.device_total_bytes)} of "
            f"{_gib(m.capacity_bytes)} at {m.batch_size} sequences"
        )
    else:
        fits = (
            f"fits: largest batch {m.max_batch_size} per GPU; {_gib(m.device_total_bytes)} "
            f"of {_gib(m.capacity_bytes)} at batch {m.batch_size}"
        )
    if m.max_batch_capped:
        fits += (
            f" (the batch search stops at {m.max_batch_size}: more fits, and the speed is "
            "taken at that batch)"
        )
    reasons = [fits]
    if p.source == "measured" and o.measured is not None:
        reasons.append(
            f"measured {p.throughput:,.0f} {unit} at batch {o.measured.batch_size} (whichgpu "
            f"bench result {o.measured.id[:8]}, {o.measured.created_at:%Y-%m-%d})"
        )
    elif served is not None:
        reasons.append(
            f"predicted {p.throughput:,.0f} {unit} under {engine_name(served.engine_label)} "
            f"at concurrency {served.concurrency}: TTFT {served.ttft_s * 1000:,.0f} ms, "
            + (
                f"TPOT {served.tpot_s * 1000:,.1f} ms"
                if served.tpot_s is not None
                else f"{served.requests_per_s or 0:,.1f} requests/s (prefill only, no TPOT)"
            )
        )
        which = "output" if served.tpot_s is not None else "prompt"
        if p.hourly_usd is not None and p.throughput > 0:
            per_million = p.hourly_usd / (p.throughput * SECONDS_PER_HOUR) * 1e6
            reasons.append(f"${per_million:,.2f} per million {which} tokens, kept busy")
        if p.owned_hourly_usd is not None and p.throughput > 0:
            per_million = p.owned_hourly_usd / (p.throughput * SECONDS_PER_HOUR) * 1e6
            years = shipped_cost_data().rules.default_years
            reasons.append(
                f"owned: ${per_million:,.3f} per million {which} tokens, kept busy: the machine's "
                f"${p.purchase_usd or 0:,.0f} over {years:g} years of use (the cost data's "
                "default) and its electricity at full load at the region's price; no resale"
            )
    else:
        reasons.append(f"predicted {p.throughput:,.0f} {unit} (band {p.low:,.0f}-{p.high:,.0f})")
        if o.speed is not None and o.speed.calibrated_on:
            reasons.append(o.speed.calibrated_on)
    machines = node_count(o.count)
    network = None
    if machines > 1:
        fabric = get_fabric(m.run.network)
        network = fabric.id
        reasons.append(
            f"a cluster of {machines} machines of {o.count // machines} x {o.gpu.name} joined by "
            f"{fabric.name} ({fabric.id}): fit is per GPU of the {o.count}, the throughput "
            "theirs together; each machine is priced as one"
        )
    if o.count > 1 and o.speed is not None and o.speed.scaling_efficiency is not None:
        reasons.append(
            f"{o.count} GPUs scale to {o.speed.scaling_efficiency:.0%} of {o.count} x one over "
            f"{o.speed.link}"
        )
    reasons.append(f"price: {p.note}")
    if p.time_s is not None and q.job is not None:
        done = f"finishes {q.job.describe()} in {p.time_s / SECONDS_PER_HOUR:,.1f} h"
        if p.electricity_usd is not None and p.energy_kwh is not None:
            done += f"; electricity {p.energy_kwh:,.1f} kWh, ${p.electricity_usd:,.2f}"
        slow_h = p.time_s * p.throughput / p.low / SECONDS_PER_HOUR if p.low > 0 else None
        if q.within_hours is not None and slow_h is not None and slow_h > q.within_hours:
            done += (
                f"; at the slow end of its band it takes {slow_h:,.1f} h, past the "
                f"{q.within_hours:,.0f} h deadline"
            )
        reasons.append(done)
    first = everyone[0]
    here = _metric_text(p, metric, unit, q)
    if p is first and len(everyone) > 1:
        second = everyone[1]
        reasons.append(
            f"best by {metric}: {here}; next is {_label(second)} at "
            f"{_metric_text(second, metric, unit, q)}"
        )
    elif p is not first:
        reasons.append(
            f"{metric}: {here}, against {_metric_text(first, metric, unit, q)} "
            f"for #1 {_label(first)}"
        )
    reasons += p.extra
    return Candidate(
        rank=rank_,
        gpu=o.gpu.id,
        gpu_name=o.gpu.name,
        count=o.count,
        machines=machines,
        network=network,
        fits=True,
        max_batch_size=m.max_batch_size,
        batch_size=m.batch_size,
        throughput=p.throughput,
        throughput_unit=unit,
        throughput_low=p.low,
        throughput_high=p.high,
        throughput_source="measured" if p.source == "measured" else "predicted",
        time_s=p.time_s,
        cost_usd=p.cost_usd,
        purchase_usd=p.purchase_usd,
        hourly_usd=p.hourly_usd,
        energy_kwh=p.energy_kwh,
        electricity_usd=p.electricity_usd,
        co2_kg=p.co2_kg,
        perf_per_dollar=p.ppd,
        perf_per_dollar_unit=_ppd_unit(unit, q),
        price_note=p.note,
        price_as_of=p.price.as_of if p.price is not None else None,
        price_stale=p.price is not None and stale_policy().is_stale(p.price),
        reasons=tuple(reasons),
    )


def _answer(
    candidates: tuple[Candidate, ...],
    excluded: list[Exclusion],
    q: Question,
    metric: RankMetric,
    run: RunConfig,
) -> str:
    if not candidates:
        if not excluded:
            return "No GPU in the catalog was considered."
        counts: dict[str, int] = {}
        for e in excluded:
            counts[e.kind] = counts.get(e.kind, 0) + 1
        common = ", ".join(
            f"{n} {EXCLUSION_LABELS[kind]}"
            for kind, n in sorted(counts.items(), key=lambda kv: -kv[1])
        )
        single = all(e.count == 1 for e in excluded)
        software = sum(e.kind == "build" and e.reason.startswith(SOFTWARE_PREFIX) for e in excluded)
        if software:
            counts["build"] -= software
        hints = _next_steps(counts, q, run, single_gpu=single, software=software)
        return f"No GPU in the catalog does this as asked ({common}). See the excluded list." + (
            f" {hints}" if hints else ""
        )
    top = candidates[0]
    what = _what(top)
    if top.network is not None:
        what += f" joined by {get_fabric(top.network).name}"
    verb = "Buy" if q.mode == "buy" else "Rent"
    how = {
        "cost": f"the cheapest way to finish {q.job.describe() if q.job else 'the job'}: "
        f"${top.cost_usd:,.0f}",
        "perf-per-dollar": f"the most {top.perf_per_dollar_unit.split(' per ')[0]} per "
        + (
            f"dollar over {q.job.describe()}: {significant(top.perf_per_dollar)} "
            f"(${top.cost_usd:,.0f})"
            if q.job is not None and _hours_job(q)
            else f"{'$1k of machine' if q.mode == 'buy' else 'dollar'}: "
            f"{significant(top.perf_per_dollar)}"
        ),
        "time": f"the fastest to finish: {(top.time_s or 0) / SECONDS_PER_HOUR:,.1f} h",
        "throughput": f"the fastest: {top.throughput:,.0f} {top.throughput_unit}",
    }[metric]
    serve = f" to serve with {engine_name(q.serving.label)}" if q.serving is not None else ""
    text = f"{verb} {what}{serve}: {how}"
    if top.time_s is not None and metric != "time":
        text += f", done in {top.time_s / SECONDS_PER_HOUR:,.1f} h"
    if len(candidates) > 1:
        text += f". Runner-up: {_what(candidates[1])}."
    else:
        text += "."
    return text


def _what(c: Candidate) -> str:
    """The candidate's GPUs in words: ``H100 SXM``, ``8 x H100 SXM``, ``2 machines of 8 x H100
    SXM (16 GPUs)``."""
    if c.machines > 1:
        return f"{c.machines} machines of {c.count // c.machines} x {c.gpu_name} ({c.count} GPUs)"
    return f"{c.count} x {c.gpu_name}" if c.count > 1 else c.gpu_name


def _no_rental(catalog: Catalog, gpu: GpuSpec, count: int, provider: str | None) -> str:
    """Why ``count`` x ``gpu`` has no rate: no cloud price, or none for that machine size."""
    rows = catalog.prices(gpu.id, "cloud-on-demand")
    if provider is not None:
        rows = [p for p in rows if p.provider == provider.strip().lower()]
    where = f" from {provider}" if provider else ""
    if not rows:
        return f"no cloud price{where} in the catalog"
    return f"no offer of {count} in one machine{where} in the catalog ({machine_sizes(rows)})"


def _next_steps(
    counts: dict[str, int], q: Question, run: RunConfig, *, single_gpu: bool, software: int = 0
) -> str:
    """What the user can change when nothing qualifies: the options that relax what ruled most
    GPUs out (only those not already set)."""
    steps: list[str] = []
    if counts.get("memory"):
        steps += run.memory_levers()
        # data-parallel training holds the whole model state on every GPU: more GPUs relieve
        # memory only when they shard it
        shard = (
            run.mode == "train"
            and run.sharding in ("ddp", "zero1", "zero2")
            and run.model_parallel() == 1
        )
        if single_gpu:
            steps.append(
                "--gpus auto --sharding fsdp (machines of 2, 4 or 8 GPUs that split the "
                "weights, gradients and optimizer state)"
                if shard
                else "--gpus auto (machines of 2, 4 or 8 GPUs)"
            )
        elif shard:
            steps.append(
                "--sharding fsdp (split the weights, gradients and optimizer state over the GPUs)"
            )
        if run.mode == "train" and run.sharding != "ddp":
            # a sharded state shrinks with every GPU more, past one machine too
            steps.append(
                "more GPUs: a --gpus count or range past what was tried (e.g. --gpus 16-256, "
                "machines of 8 joined by --network)"
            )
    if counts.get("budget") and q.mode == "buy":
        if not q.gpu_only:
            steps.append("--gpu-only if you have the computer")
        if not q.used:
            steps.append("used prices (drop --new)")
    if counts.get("price") and not counts.get("budget"):
        steps.append("--prices FILE with your own prices")
    if counts.get("batch") and q.min_batch is not None:
        steps.append(f"a smaller --min-batch than {q.min_batch}")
    if counts.get("time") and q.within_hours is not None:
        steps.append(f"a later --within than {q.within_hours:,.0f} h")
    if counts.get("build"):
        steps.append("--gpu-only to price the cards alone (you size the machine)")
    if software:
        steps.append(
            "another --method, --optimizer or --precision that the left-out GPUs' software runs"
        )
    return f"To widen the search, try: {'; '.join(steps)}." if steps else ""


def _assumptions(q: Question, metric: RankMetric, priced: list[_Priced]) -> tuple[str, ...]:
    stale = stale_note([p.price for p in priced if p.price is not None])
    notes = [] if stale is None else [stale]
    notes += [
        f"ranked by {metric}"
        + (" (cost to finish the job)" if metric == "cost" else "")
        + (
            (
                " (the work done in the job's hours per dollar of "
                + ("machine and electricity" if q.mode == "buy" else "rental")
                + ": the cost of a fixed time does not depend on speed)"
            )
            if metric == "perf-per-dollar" and _hours_job(q)
            else " (buy: throughput per $1,000 of machine; rent: units per dollar)"
            if metric == "perf-per-dollar"
            else ""
        ),
    ]
    if q.mode == "buy":
        base = (
            "(--gpu-only: no base system)"
            if q.gpu_only
            else "+ the base system of the smallest build class that holds them: a one-GPU "
            "desktop by parts with the power supply sized to the GPU's board power (component "
            "data, sourced and dated), other machines the class's whole-build figure (cost data)"
        )
        notes.append(
            "buy: GPU price (the lower of the newest new and used, else launch; the new one "
            f"with --new) x count {base}; a "
            "job adds its electricity at the region's price (board power + the class's CPU "
            "figure, for the job's hours); resale is not counted (see whichgpu cost breakeven)"
        )
    else:
        notes.append(
            "rent: the cheapest on-demand rate per GPU-hour in the catalog (or --provider's) "
            "offered for that many GPUs in one machine, x "
            "count; regions of cloud prices are not filtered; no egress, storage or idle time"
        )
    if any(p.tier for p in priced):
        notes.append(SOFTWARE_TIER_NOTE)
    if q.mode == "buy" and not q.used:
        notes.append(
            "prices: new prices (--new); a GPU with no new price is ranked at its used price"
        )
    elif q.mode == "buy":
        notes.append(
            "prices: a GPU is ranked at its used price where the catalog has one below its new "
            "price (marked 'used'; a second-hand card, usually without the maker's warranty); "
            "--new ranks at new prices"
        )
    if q.serving is not None:
        notes.append(
            f"--serving {q.serving.id}: a GPU fits when the KV cache of {q.serving.label} "
            "holds the asked concurrency at context + new tokens (whichgpu fit --serving); "
            "speed is the engine's output tokens/s at that concurrency (CUDA-graph decode "
            "bound by the bytes it reads, chunked prefill: whichgpu predict --serving), "
            "without a band; stored bench results (plain PyTorch) are not used"
        )
    else:
        notes.append(
            "speed: a stored whichgpu bench result of the same run when there is one, else "
            "whichgpu predict's prediction with its band (see its assumptions)"
        )
    if any(p.option.count > 1 and p.option.memory.run.mode == "train" for p in priced):
        notes.append("several GPUs train data parallel, each with its own batch")
    clusters = sorted({p.option.count for p in priced if node_count(p.option.count) > 1})
    if clusters:
        notes.append(_cluster_assumption(q, clusters, priced[0].option.memory.run.network))
    notes.extend(q.notes)
    if any(p.option.memory.run.mode == "inference" and p.option.count > 1 for p in priced):
        notes.append(
            "several GPUs serve one model tensor parallel: 1/N of the weights, the KV cache and "
            "the work each, and two all-reduces of the hidden states per layer"
        )
    return tuple(notes)


def _cluster_assumption(q: Question, counts: Sequence[int], network: str | None) -> str:
    """What ranking clusters of machines (``counts`` GPUs, machines of a node's size) assumes,
    in words: the fabric, and how the cluster is priced."""
    machines = ", ".join(str(node_count(n)) for n in counts)
    gpus = ", ".join(str(n) for n in counts)
    size = counts[0] // node_count(counts[0])
    text = (
        f"clusters: {gpus} GPUs are {machines} machines of {size} joined by "
        f"{fabric_note(network)} (whichgpu predict --gpus N --network: data parallel across "
        "the machines); "
    )
    if q.mode == "rent":
        return text + (
            f"rented at the rate of one {size}-GPU machine (as above) x machines, assuming the "
            "provider rents that many at once joined by that fabric: the catalog's rates do not "
            "say which clouds join their machines by InfiniBand or RoCE"
        )
    machine = "its GPUs alone (--gpu-only)" if q.gpu_only else "GPUs + the server build class"
    return text + (
        f"bought as that many {size}-GPU machines, each priced as one ({machine}), and their "
        "electricity x machines; the fabric's switches, cables and network cards are not "
        "priced (the cost data has no sourced figure for them)"
    )

"""``whichgpu validate throughput``: predicted training throughput against measured.

Over 600 lines because the fit, its out-of-sample errors and the baselines share one table of
cases (``CaseBatch``); the fit (``fit_parameters``) is the seam along which it splits next.

The main reference is Lambda's 2020 table (12 models x 8 GPUs, throughput at each GPU's
largest batch), read with the settings of ``lambda2020.LAMBDA_MODELS``. The predictor's
constants and speed factors are fitted by ``fit_parameters`` (the shipped ones by
``scripts/fit_throughput.py`` on all rows); the error reported here is out of sample:

- leave-one-GPU-out: refit without a GPU, predict every model on it (each model with the
  speed factor its other GPUs gave it: a new GPU for a known workload);
- leave-one-model-out: refit without a model, predict it on every GPU (with its workload
  type's factor: a workload never measured);

beside two baselines computed case by case the same way: a measurement of the same model on
each other GPU scaled by the ratio of memory bandwidths, or of AMP tensor rates (FP32 rate
for GPUs without tensor cores), averaged over the other GPUs. Rows whose measured FLOP rate
exceeds the peak of the engines their settings allow are reported and left out (they cannot
be what the table says they are).

Beside it, ``predict`` against runs measured outside that fit: whichgpu's own GPU bench
results (``validate.measured``), the step times of the H200 measurements (``validate.h200``),
llm-foundry's published tokens/s per GPU (``validate.llm_foundry``), published serving
measurements (``validate.serving``) and published tensor- and pipeline-parallel training
(``validate.parallel``), with a summary line per reference (``sources`` picks which are
compared).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import numpy as np
import numpy.typing as npt

from whichgpu.catalog import load_catalog
from whichgpu.estimate.throughput import (
    FitPriors,
    GpuRates,
    OpTable,
    PerfParameters,
    SerialWork,
    gpu_rates,
    load_fit_priors,
    load_parameters,
    matrix_engines,
    merge_repeats,
    op_table,
    operator_times,
    peak_limited_s,
    serial_work,
    step_time,
    with_values,
    workload_type,
)
from whichgpu.profiles.scalable import ScalableProfile
from whichgpu.schema import (
    BenchResult,
    ErrorStats,
    GpuSpec,
    Precision,
    ReferenceSource,
    SourceSummary,
    ThroughputValidation,
    ThroughputValidationCase,
)
from whichgpu.validate.lambda2020 import LAMBDA_MODELS, lambda_rows
from whichgpu.validate.summary import SOURCES, error_summary
from whichgpu.workloads import get_workload, run_config


@dataclass(frozen=True)
class ThroughputCase:
    """One measured (model, GPU) throughput, with what the predictor needs."""

    model: str
    """Model as the table names it."""
    workload: str
    """The workload that stands for it."""
    family: str
    """The workload's family (its type picks the speed factor of an unfitted workload)."""
    gpu: GpuSpec
    """The GPU."""
    precision: Precision
    """Precision of the run."""
    table: OpTable
    """The step's operators at the measured batch."""
    rates: GpuRates
    """The GPU's peaks."""
    measured: float
    """Measured throughput, units per second."""
    unit: str
    """The table's unit."""
    reference: GpuRates
    """The peaks of the GPU whose modelled time scales the run's host time
    (``PerfParameters.host_reference_gpu``)."""

    def modelled(self, params: PerfParameters) -> float:
        """Throughput the operator model gives with ``params``, before any speed factor."""
        merged = self.merged
        step = step_time(merged, self.rates, self.precision, params, self.merged_engines)
        return merged.units_per_step / step.step_time_s

    def reference_time(self, params: PerfParameters) -> float:
        """Modelled GPU time per unit of the same step on the reference GPU, before any speed
        factor (the scale of the run's host time)."""
        merged = self.merged
        step = step_time(merged, self.reference, self.precision, params, self.reference_engines)
        return step.step_time_s / merged.units_per_step

    @functools.cached_property
    def merged(self) -> OpTable:
        """``table`` with repeated operators merged (the same times, many times faster)."""
        return merge_repeats(self.table)

    @functools.cached_property
    def merged_engines(self) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.bool_]]:
        """``engines`` of ``merged``."""
        return matrix_engines(self.merged, self.rates, self.precision)

    @functools.cached_property
    def reference_engines(self) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.bool_]]:
        """``engines`` of ``merged`` on the reference GPU."""
        return matrix_engines(self.merged, self.reference, self.precision)

    def predicted(self, params: PerfParameters) -> float:
        """Predicted throughput of the measured run with ``params``: the operator model's
        GPU time plus the run's host time, both over the speed factor."""
        factor = params.speed_factor(self.workload, self.family)
        share = params.host_share(self.workload, self.family)
        return float(
            measured_rate(
                self.modelled(params), self.reference_time(params), factor, share, self.limit_s
            )
        )

    @functools.cached_property
    def limit_s(self) -> float:
        """GPU time per unit at the GPU's peak rates (``peak_limited_s``): no speed factor
        takes the modelled time below it."""
        merged = self.merged
        return peak_limited_s(merged, self.rates, self.precision, self.merged_engines) / (
            merged.units_per_step
        )

    @functools.cached_property
    def engines(self) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.bool_]]:
        """Each operator's engine peak and tensor flag (they do not depend on the constants)."""
        return matrix_engines(self.table, self.rates, self.precision)

    def peak_share(self) -> float:
        """Measured FLOP rate over the highest peak its operators may use."""
        peak, _ = self.engines
        flops_per_s = float(self.table.flops.sum()) * self.measured / self.table.units_per_step
        return flops_per_s / float(peak.max())


def measured_rate(
    modelled: float | npt.NDArray[np.float64],
    reference_s: float | npt.NDArray[np.float64],
    factor: float | npt.NDArray[np.float64],
    host_share: float | npt.NDArray[np.float64],
    limit_s: float | npt.NDArray[np.float64],
) -> float | npt.NDArray[np.float64]:
    """Throughput of a measured run: per unit, the modelled GPU time (``1 / modelled``) plus
    the host time (``host_share x reference_s``), both over the workload's speed ``factor``;
    the GPU time no shorter than ``limit_s``, its time at the GPU's peak rates (as
    ``predict`` caps it)."""
    gpu_s = np.maximum(1 / (modelled * factor), limit_s)
    return 1 / (gpu_s + host_share * reference_s / factor)


@dataclass(frozen=True)
class CaseBatch:
    """The operators of many cases on their GPUs and on the reference GPU as one table, so
    the fit times them all in a few array operations (rows of case ``i`` on its own GPU are
    group ``i``, on the reference GPU group ``n + i``)."""

    group: npt.NDArray[np.intp]
    flops: npt.NDArray[np.float64]
    bytes_moved: npt.NDArray[np.float64]
    weights: npt.NDArray[np.float64]
    is_matrix: npt.NDArray[np.bool_]
    peak: npt.NDArray[np.float64]
    tensor: npt.NDArray[np.bool_]
    vector_peak: npt.NDArray[np.float64]
    bandwidth: npt.NDArray[np.float64]
    sm_count: npt.NDArray[np.float64]
    serial: SerialWork
    """The native bf16 batch norms' loops of every row (``estimate.throughput.SerialWork``)."""
    units: npt.NDArray[np.float64]
    """Throughput units per step of each case."""
    limits: npt.NDArray[np.float64]
    """GPU time per unit of each case at its GPU's peak rates (``ThroughputCase.limit_s``)."""

    @classmethod
    def of(cls, cases: Sequence[ThroughputCase]) -> CaseBatch:
        """The batch of ``cases``."""
        parts = []
        serial = []
        for offset, on_reference in ((0, False), (len(cases), True)):
            for i, case in enumerate(cases):
                table = case.merged
                rates = case.reference if on_reference else case.rates
                engines = case.reference_engines if on_reference else case.merged_engines
                n = len(table.kinds)
                serial.append(serial_work(table, case.precision))
                parts.append(
                    (
                        np.full(n, offset + i),
                        table.flops,
                        table.bytes_moved,
                        table.weights,
                        table.is_matrix,
                        engines[0],
                        engines[1],
                        np.full(n, rates.vector_flops_per_s),
                        np.full(n, rates.bandwidth_bytes_per_s),
                        np.full(n, float(rates.sm_count)),
                    )
                )
        group, flops, moved, weights, matrix, peak, tensor, vector, bandwidth, sms = (
            np.concatenate(column) for column in zip(*parts, strict=True)
        )
        return cls(
            group=group,
            flops=flops,
            bytes_moved=moved,
            weights=weights,
            is_matrix=matrix,
            peak=peak,
            tensor=tensor,
            vector_peak=vector,
            bandwidth=bandwidth,
            sm_count=sms,
            serial=SerialWork.concat(serial),
            units=np.array([float(c.merged.units_per_step) for c in cases]),
            limits=np.array([c.limit_s for c in cases]),
        )

    def times_per_unit(
        self, params: PerfParameters
    ) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]]:
        """Modelled GPU time per unit of each case on its GPU and on the reference GPU, before
        any speed factor (``step_time``'s sum, for all cases at once)."""
        each, _, _ = operator_times(
            self.flops,
            self.bytes_moved,
            self.is_matrix,
            (self.peak, self.tensor),
            (self.vector_peak, self.bandwidth, self.sm_count),
            params,
            self.serial,
        )
        n = len(self.units)
        seconds = np.bincount(self.group, weights=each * self.weights, minlength=2 * n)
        return seconds[:n] / self.units, seconds[n:] / self.units


def _profile(workload: str, precision: Precision) -> ScalableProfile:
    from whichgpu.api import scalable_profile

    run = run_config(precision=precision)
    profile, _ = scalable_profile(get_workload(workload), run)
    return profile


def lambda_cases(
    progress: Callable[[str], None] | None = None,
) -> tuple[list[ThroughputCase], list[tuple[str, str, str]]]:
    """Every usable row of the table as a case, and the rows left out with why."""
    catalog = load_catalog()
    reference = gpu_rates(catalog.get(load_parameters().host_reference_gpu))
    profiles: dict[str, ScalableProfile] = {}
    cases: list[ThroughputCase] = []
    left_out: list[tuple[str, str, str]] = []
    unreadable: dict[str, list[ThroughputCase]] = {}
    for row in lambda_rows():
        if not row["throughput"]:
            continue
        model = LAMBDA_MODELS[row["model"]]
        if model.workload not in profiles:
            if progress is not None:
                progress(model.workload)
            profiles[model.workload] = _profile(model.workload, model.precision)
        profile = profiles[model.workload]
        info = get_workload(model.workload).info
        seq_len = (model.seq_len or info.default_seq_len) if profile.is_sequence_model else None
        batch = int(row["max_batch_size"])
        if row["batch_unit"] == "tokens":
            assert seq_len is not None
            batch = max(1, round(batch / seq_len))
        gpu = catalog.resolve(row["gpu"])
        case = ThroughputCase(
            model=row["model"],
            workload=model.workload,
            family=info.family,
            gpu=gpu,
            precision=model.precision,
            table=op_table(profile, batch, seq_len),
            rates=gpu_rates(gpu),
            measured=float(row["throughput"]),
            unit=row["throughput_unit"],
            reference=reference,
        )
        if model.unreadable_throughput is not None:
            unreadable.setdefault(row["model"], []).append(case)
            continue
        share = case.peak_share()
        if share > 1.0:
            left_out.append(
                (row["model"], gpu.id, f"measured FLOP rate is {share:.0%} of the peak allowed")
            )
            continue
        cases.append(case)
    for name, rows in unreadable.items():
        why = LAMBDA_MODELS[name].unreadable_throughput
        over = [f"{share:.0%}" for share in (c.peak_share() for c in rows) if share > 1.0]
        proof = (
            f"; read at {rows[0].table.seq_len} tokens, {len(over)} of "
            f"its {len(rows)} rows would run above the peak ({', '.join(over)})"
            if over
            else ""
        )
        left_out.extend((name, c.gpu.id, f"{why}{proof}") for c in rows)
    return cases, left_out


_LOWER = np.log([1e-3, 1e-3, 1e-2, 1e3, 1e-7])
_UPPER = np.log([1.0, 1.0, 1.0, 1e13, 1e-3])
_FACTOR_BOUND = 5.0
"""Largest |log| of a speed factor (x150 either way: far beyond any plausible one)."""


_HOST_SHARE_BOUND = 10.0
"""Largest host share (ten times the reference GPU's time: far beyond any plausible one)."""


def fit_parameters(
    cases: Sequence[ThroughputCase], start: PerfParameters, priors: FitPriors | None = None
) -> PerfParameters:
    """Constants, speed factors and host shares of the maximum a-posteriori fit over ``cases``.

    Minimises, in natural log, the squared errors of predicted throughput (over the expected
    scatter of a measurement), the constants' distances from their priors, each workload's
    factor's distance from its type's, and each type's factor's distance from 1 (each over
    its spread in ``priors``); and, linearly, each workload's host share's distance from its
    type's and each type's from 0. Workloads absent from ``cases`` get no factor or share of
    their own.
    """
    from scipy.optimize import least_squares

    priors = priors or load_fit_priors()
    batch = CaseBatch.of(cases)
    workloads = sorted({c.workload for c in cases})
    kind_of = {c.workload: workload_type(c.family) for c in cases}
    kinds = sorted(set(kind_of.values()))
    w_index = [workloads.index(c.workload) for c in cases]
    k_index = [kinds.index(kind_of[w]) for w in workloads]
    n, n_w, n_k = len(start.vector), len(workloads), len(kinds)
    measured = np.log([c.measured for c in cases])
    prior_log = np.log(priors.values)
    cut = np.cumsum([n, n_w, n_k, n_w])

    def residuals(x: np.ndarray) -> np.ndarray:
        constants, factors, kind_factors, shares, kind_shares = np.split(x, cut)
        gpu_s, reference_s = batch.times_per_unit(with_values(start, np.exp(constants)))
        rate = measured_rate(
            1 / gpu_s, reference_s, np.exp(factors[w_index]), shares[w_index], batch.limits
        )
        return np.concatenate(
            [
                (np.log(rate) - measured) / priors.data_sd_log,
                (constants - prior_log) / priors.sd_log,
                (factors - kind_factors[k_index]) / priors.workload_sd_log,
                kind_factors / priors.type_sd_log,
                (shares - kind_shares[k_index]) / priors.host_share_sd,
                kind_shares / priors.type_host_share_sd,
            ]
        )

    groups = n_w + n_k
    lower = np.concatenate([_LOWER, np.full(groups, -_FACTOR_BOUND), np.zeros(groups)])
    upper = np.concatenate(
        [_UPPER, np.full(groups, _FACTOR_BOUND), np.full(groups, _HOST_SHARE_BOUND)]
    )
    x0 = np.concatenate(
        [
            np.log(start.vector),
            [math.log(start.workload_factors.get(w, 1.0)) for w in workloads],
            [math.log(start.type_factors.get(k, 1.0)) for k in kinds],
            [start.workload_host_shares.get(w, 0.1) for w in workloads],
            [start.type_host_shares.get(k, 0.1) for k in kinds],
        ]
    )
    x0 = np.clip(x0, lower + 1e-9, upper - 1e-9)
    x = least_squares(residuals, x0, bounds=(lower, upper), x_scale="jac").x
    constants, factors, kind_factors, shares, kind_shares = np.split(x, cut)
    # A type the cases do not cover (and ``default``) gets the typical type's factor and share.
    return replace(
        with_values(start, np.exp(constants)),
        workload_factors={w: float(np.exp(v)) for w, v in zip(workloads, factors, strict=True)},
        type_factors={
            **{k: float(np.exp(v)) for k, v in zip(kinds, kind_factors, strict=True)},
            "default": float(np.exp(np.mean(kind_factors))),
        },
        workload_host_shares={w: float(v) for w, v in zip(workloads, shares, strict=True)},
        type_host_shares={
            **{k: float(v) for k, v in zip(kinds, kind_shares, strict=True)},
            "default": float(np.mean(kind_shares)),
        },
    )


def summarize(method: str, errors: Sequence[float]) -> ErrorStats:
    """Summary of signed relative errors ``predicted / measured - 1``."""
    absolute = np.abs(np.asarray(errors))
    return ErrorStats(
        method=method,
        mape=float(absolute.mean()),
        median=float(np.median(absolute)),
        p90=float(np.percentile(absolute, 90)),
        cases=len(absolute),
    )


def held_out_errors(
    cases: Sequence[ThroughputCase],
    start: PerfParameters,
    group: Callable[[ThroughputCase], str],
    progress: Callable[[str], None] | None = None,
) -> dict[int, float]:
    """Signed relative error of each case, predicted with constants fitted without its group."""
    errors: dict[int, float] = {}
    for name in sorted({group(c) for c in cases}):
        if progress is not None:
            progress(f"refit without {name}")
        train = [c for c in cases if group(c) != name]
        params = fit_parameters(train, start)
        for i, case in enumerate(cases):
            if group(case) == name:
                errors[i] = case.predicted(params) / case.measured - 1
    return errors


def baseline_errors(
    cases: Sequence[ThroughputCase], metric: Callable[[GpuSpec], float]
) -> list[float]:
    """Per case: the mean signed error of scaling each other GPU's measurement by ``metric``."""
    out = []
    for case in cases:
        others = [c for c in cases if c.model == case.model and c.gpu.id != case.gpu.id]
        guesses = [o.measured * metric(case.gpu) / metric(o.gpu) for o in others]
        out.append(float(np.mean([g / case.measured - 1 for g in guesses])))
    return out


def bandwidth(gpu: GpuSpec) -> float:
    """Baseline metric: memory bandwidth."""
    return float(gpu.memory_bandwidth_gbps or math.nan)


def amp_rate(gpu: GpuSpec) -> float:
    """Baseline metric: the AMP tensor rate (FP32 vector rate without tensor cores)."""
    return float(gpu.fp16_tensor_tflops or gpu.fp32_tflops or math.nan)


def spearman(a: Sequence[float], b: Sequence[float]) -> float:
    """Spearman rank correlation (no ties expected)."""
    ra = np.argsort(np.argsort(a))
    rb = np.argsort(np.argsort(b))
    if len(a) < 2:
        return math.nan
    return float(np.corrcoef(ra, rb)[0, 1])


SEED_RATIOS = (
    ("a100-sxm4-40gb", "v100-sxm2-16gb", "resnet50", 1.45, "A100 vs V100, computer vision"),
    ("a100-sxm4-40gb", "v100-sxm2-16gb", "bert-large", 1.70, "A100 vs V100, NLP"),
    ("rtx-3090", "rtx-2080-ti", "resnet50", 1.57, "RTX 3090 vs RTX 2080 Ti, convnets"),
    ("rtx-3090", "rtx-2080-ti", "bert-large", 1.50, "RTX 3090 vs RTX 2080 Ti, transformers"),
)
"""Speed ratios the seed guides state (``reference/README.md``: Dettmers 2020), mixed precision."""


def seed_checks(params: PerfParameters) -> list[str]:
    """Each seed ratio against the predicted one (fp16 AMP, both GPUs at the default batch)."""
    catalog = load_catalog()
    profiles: dict[str, ScalableProfile] = {}
    out = []
    for fast, slow, workload, stated, label in SEED_RATIOS:
        info = get_workload(workload).info
        if workload not in profiles:  # bf16: the same operators and bytes as fp16
            profiles[workload] = _profile(workload, "bf16")
        profile = profiles[workload]
        table = op_table(profile, info.default_batch_size, info.default_seq_len)
        times = [
            step_time(table, gpu_rates(catalog.resolve(g)), "fp16", params).step_time_s
            for g in (fast, slow)
        ]
        predicted = times[1] / times[0]
        out.append(
            f"{label} ({workload}): stated {stated:.2f}x, predicted {predicted:.2f}x "
            f"({predicted / stated - 1:+.0%})"
        )
    return out


def validate_throughput(
    params: PerfParameters,
    progress: Callable[[str], None] | None = None,
    measurements: Sequence[BenchResult] | None = None,
    sources: Sequence[ReferenceSource] = SOURCES,
) -> ThroughputValidation:
    """For the chosen references (default: all): out-of-sample errors on the Lambda 2020
    table, the baselines, and the seed ratios; ``predict`` against whichgpu's own GPU
    measurements (``measurements``, default: those shipped in ``validate/data/measured``);
    against the H200 measurements' step times, llm-foundry's and the published tensor- and
    pipeline-parallel runs' tokens/s per GPU and the published serving measurements; and a
    summary line per reference."""
    from whichgpu.validate.h200 import h200_throughput
    from whichgpu.validate.llm_foundry import foundry_throughput, stale_profiles_note
    from whichgpu.validate.measured import compare_throughputs, shipped_measurements, speed_ratios
    from whichgpu.validate.parallel import left_out_rows, parallel_throughput, split_ratios
    from whichgpu.validate.recipes import recipes_throughput
    from whichgpu.validate.serving import QUANTITIES, by_publication, serving_throughput

    own = (
        compare_throughputs(
            list(shipped_measurements() if measurements is None else measurements), progress
        )
        if "own" in sources
        else []
    )
    own_errors = [c.error for c in own if c.error is not None]
    references = [
        *(h200_throughput(progress=progress) if "h200-2026-11" in sources else ()),
        *(foundry_throughput(progress=progress) if "llm-foundry" in sources else ()),
        *(serving_throughput(progress=progress) if "serving" in sources else ()),
        *(parallel_throughput(progress=progress) if "parallel" in sources else ()),
        *(recipes_throughput(progress=progress) if "recipes" in sources else ()),
    ]
    lambda_part = _lambda_throughput(params, progress) if "lambda2020" in sources else _NO_LAMBDA
    by_source: list[SourceSummary] = []
    if "lambda2020" in sources:
        held_out = next(s for s in lambda_part.summaries if "one GPU out" in s.method)
        by_source.append(
            error_summary(
                "lambda2020",
                "speed, leave one GPU out",
                [c.leave_gpu_out / c.measured - 1 for c in lambda_part.cases],
                f"median {held_out.median:.1%}, P90 {held_out.p90:.1%}",
            )
        )
    if "own" in sources:
        by_source.append(
            error_summary(
                "own", "speed", own_errors, "" if own_errors else "no GPU measurement shipped"
            )
        )
    for source, quantity in (
        ("h200-2026-11", "speed (step time)"),
        ("llm-foundry", "tokens/s per GPU"),
        ("parallel", "tokens/s per GPU"),
        ("recipes", "tokens/s per GPU"),
    ):
        if source not in sources:
            continue
        mine = [c for c in references if c.source == source]
        if source == "parallel":  # the rows left out are listed, not compared
            mine = [c for c in mine if c.predicted is not None]
        errors = [c.error for c in mine if c.error is not None]
        unfit = sum(not c.fits for c in mine)
        notes = [f"{unfit} of {len(mine)} timed although fit says they do not fit" if unfit else ""]
        if source == "llm-foundry":
            notes.append(stale_profiles_note())
        if source == "parallel":
            out = [r for r, _ in left_out_rows()]
            unlisted = sum(r.measured_tokens_per_s() is None for r in out)
            without = f"; {unlisted} without a published tokens/s not listed" if unlisted else ""
            notes.append(f"{len(out)} rows left out (their notes say why{without})")
            ratios = split_ratios(references)
            if ratios:
                notes.append("split / data-parallel tokens/s per GPU: " + "; ".join(ratios))
        note = "; ".join(n for n in notes if n)
        by_source.append(error_summary(source, quantity, errors, note))  # type: ignore[arg-type]
    if "serving" in sources:
        for quantity in QUANTITIES.values():
            mine = [c for c in references if c.source == "serving" and c.quantity == quantity]
            if mine:
                errors = [c.error for c in mine if c.error is not None]
                by_source.append(error_summary("serving", quantity, errors, by_publication(mine)))
    return lambda_part.model_copy(
        update={
            "measured": tuple(own),
            "measured_summary": (
                summarize("whichgpu predict, own GPU measurements (out of sample)", own_errors)
                if own_errors
                else None
            ),
            "speed_ratios": tuple(speed_ratios(own)),
            "references": tuple(references),
            "sources": tuple(s for s in SOURCES if s in sources),
            "summaries_by_source": tuple(by_source),
        }
    )


_NO_LAMBDA = ThroughputValidation(
    cases=(), summaries=(), rank_correlation={}, left_out=(), seed_checks=(), assumptions=()
)
"""The Lambda part of a validation that does not compare Lambda's table."""


def _lambda_throughput(
    params: PerfParameters, progress: Callable[[str], None] | None
) -> ThroughputValidation:
    """Lambda's 2020 table, out of sample, with the baselines and the seed ratios."""
    cases, left_out = lambda_cases(progress)
    by_gpu = held_out_errors(cases, params, lambda c: c.gpu.id, progress)
    by_model = held_out_errors(cases, params, lambda c: c.model, progress)
    bw = baseline_errors(cases, bandwidth)
    amp = baseline_errors(cases, amp_rate)
    transfer = transfer_errors(cases, by_model)
    gpu_errors = [by_gpu[i] for i in range(len(cases))]
    summaries = [
        summarize("whichgpu, leave one GPU out", gpu_errors),
        summarize("whichgpu, leave one model out", [by_model[i] for i in range(len(cases))]),
        summarize("whichgpu, model left out + one measured GPU (calibrated)", transfer),
        summarize("baseline: another GPU's measurement x bandwidth ratio", bw),
        summarize("baseline: another GPU's measurement x AMP-rate ratio", amp),
    ]
    ranks = {}
    for model in dict.fromkeys(c.model for c in cases):
        idx = [i for i, c in enumerate(cases) if c.model == model]
        predicted = [cases[i].measured * (1 + by_gpu[i]) for i in idx]
        ranks[model] = spearman(predicted, [cases[i].measured for i in idx])
    rows = tuple(
        ThroughputValidationCase(
            model=c.model,
            workload=c.workload,
            gpu=c.gpu.id,
            unit=c.unit,
            measured=c.measured,
            leave_gpu_out=c.measured * (1 + by_gpu[i]),
            leave_model_out=c.measured * (1 + by_model[i]),
            bandwidth_baseline=c.measured * (1 + bw[i]),
        )
        for i, c in enumerate(cases)
    )
    settings = tuple(
        f"{name}: {m.precision}" + (f", {m.seq_len} tokens" if m.seq_len else "") + f" ({m.why})"
        for name, m in LAMBDA_MODELS.items()
    )
    return ThroughputValidation(
        cases=rows,
        summaries=tuple(summaries),
        rank_correlation=ranks,
        left_out=_grouped(left_out),
        seed_checks=tuple(seed_checks(params)),
        assumptions=(
            "throughput at the table's largest batch; translation batches = tokens / 128",
            *settings,
        ),
    )


def _grouped(left_out: Sequence[tuple[str, str, str]]) -> tuple[str, ...]:
    """``model on gpu, gpu …: why``, one entry per model and reason."""
    gpus: dict[tuple[str, str], list[str]] = {}
    for model, gpu, why in left_out:
        gpus.setdefault((model, why), []).append(gpu)
    return tuple(f"{m} on {', '.join(g)}: {why}" for (m, why), g in gpus.items())


def transfer_errors(cases: Sequence[ThroughputCase], held_out: dict[int, float]) -> list[float]:
    """Per case: the held-out prediction corrected by one other GPU's measured/predicted ratio
    (``predict --calibrate``'s rule, without shrinkage), averaged over the other GPUs."""
    out = []
    for i, case in enumerate(cases):
        ratios = [
            (1 + held_out[i]) / (1 + held_out[j])
            for j, other in enumerate(cases)
            if other.model == case.model and other.gpu.id != case.gpu.id
        ]
        out.append(float(np.mean(ratios)) - 1)
    return out

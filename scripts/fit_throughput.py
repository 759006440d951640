"""Fit the throughput predictor's constants and write them to the package data.

Run from the repository root:

    python scripts/fit_throughput.py [--h200 PATH] [--quick]

A joint maximum a-posteriori fit (log-normal priors of ``fit_priors`` in the data file) over
two kinds of measurements:

- Lambda's 2020 table (``whichgpu.validate.throughput.lambda_cases``): 2020 frameworks on real
  datasets, so each of its workloads keeps a speed factor and a host share (hierarchical, as
  ``whichgpu.validate.throughput.fit_parameters`` fits them);
- runs of today's software on synthetic data (``TODAY_SOURCES``; now the H200 runs of
  2026-11, an independent eager PyTorch 2.11 loop): no speed factor and no host time, so they
  pin the constants themselves.

The fitted constants are the five of ``whichgpu.estimate.throughput.FIT_FIELDS`` and
``misaligned_efficiency``. Then the out-of-sample errors: leave one GPU of the Lambda table
out (the prediction bands, as before), leave one model of it out, leave each source of today's
runs out (all its cases predicted from a fit without them), and leave each model of today's
runs out. Writes ``src/whichgpu/estimate/data/throughput.json`` (other keys kept) unless
``--quick`` (print only, no leave-one-out refits of the Lambda table).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import numpy.typing as npt

from whichgpu.catalog import load_catalog
from whichgpu.catalog.stacks import get_stack
from whichgpu.estimate.throughput import (
    FIT_FIELDS,
    OpTable,
    PerfParameters,
    SerialWork,
    gpu_rates,
    load_fit_priors,
    load_parameters,
    matrix_engines,
    op_table,
    operator_times,
    serial_work,
    shard_optimizer,
    with_values,
    workload_type,
)
from whichgpu.schema import Precision
from whichgpu.validate.throughput import (
    ThroughputCase,
    lambda_cases,
    measured_rate,
    transfer_errors,
)
from whichgpu.workloads import get_workload

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "src" / "whichgpu" / "estimate" / "data" / "throughput.json"
BAND_PERCENTILE = 80
H200_SOURCE = "h200-2026-11"
FOUNDRY_SOURCE = "llm-foundry"
TODAY_SOURCES = (H200_SOURCE, FOUNDRY_SOURCE)
EXTRA_FIELDS = ("misaligned_efficiency",)
"""Fitted constants beyond ``FIT_FIELDS`` (which ``validate throughput`` refits)."""
_LOWER = np.log([1e-3, 1e-3, 1e-2, 1e3, 1e-7, 0.02])
_UPPER = np.log([1.0, 1.0, 1.0, 1e13, 1e-3, 1.0])
_FACTOR_BOUND = 5.0
_HOST_SHARE_BOUND = 10.0


@dataclass(frozen=True)
class TodayCase:
    """A run of today's software on synthetic data: no speed factor, no host time."""

    source: str
    """The measurement set (``h200-2026-11``)."""
    name: str
    """The run, as its source names it."""
    case: ThroughputCase
    """What the operator model needs (``measured`` in units per second)."""


def _case(
    name: str,
    workload: str,
    family: str,
    gpu_id: str,
    precision: Precision,
    table: OpTable,
    measured: float,
    unit: str,
    stack: str | None = None,
) -> ThroughputCase:
    """One of today's runs on ``gpu_id`` under the software ``stack`` (None: the default)."""
    catalog = load_catalog()
    gpu = catalog.resolve(gpu_id)
    reference = gpu_rates(catalog.get(load_parameters().host_reference_gpu))
    return ThroughputCase(
        model=name,
        workload=workload,
        family=family,
        gpu=gpu,
        precision=precision,
        table=table,
        rates=gpu_rates(gpu, get_stack(stack)),
        measured=measured,
        unit=unit,
        reference=reference,
    )


def h200_cases() -> list[TodayCase]:
    """The timed training runs of the H200 measurements shipped in the package
    (``whichgpu.validate.h200``: one H200, torch 2.11, eager, synthetic data)."""
    from whichgpu.api import scalable_profile
    from whichgpu.validate.h200 import GPU
    from whichgpu.validate.h200 import h200_cases as shipped

    out = []
    for c in shipped():
        # the second session's runs (h200-2026-11-27) stay out of the fit: held-out checks
        if c.step_s is None or c.run.batch_size is None or c.session != H200_SOURCE:
            continue
        workload = get_workload(c.workload)
        profile, _ = scalable_profile(workload, c.run)
        seq = c.run.seq_len if profile.is_sequence_model else None
        table = op_table(profile, c.run.batch_size, seq)
        unit = "tokens/s" if seq else "samples/s"
        case = _case(
            c.case,
            workload.info.name,
            workload.info.family,
            GPU,
            c.run.precision,
            table,
            table.units_per_step / c.step_s,
            unit,
        )
        out.append(TodayCase(H200_SOURCE, c.case, case))
    return out


def foundry_cases() -> list[TodayCase]:
    """llm-foundry's compared rows (``whichgpu.validate.llm_foundry``): one GPU's micro-batch
    step of an 8-GPU FSDP run, its optimizer on the GPU's shard (``shard_optimizer``), against
    the published tokens/s per GPU. FSDP's gathers and reduce-scatters hide behind the step
    (``estimate.data_parallel``: under 0.1 % of these steps is exposed), so no exchange time."""
    from whichgpu.api import _prepare, _select
    from whichgpu.validate.llm_foundry import STACK, compared_runs, config_file, place_profile

    out = []
    for r in compared_runs():
        with config_file(r.model) as path:
            place_profile(r.model, path, r.run)
            step = _prepare(_select(None, path, None, None), r.run, path, None)
        table = shard_optimizer(op_table(step.profile, r.micro_batch_size, r.seq_len), r.n_gpus)
        case = _case(
            r.case,
            r.model,
            "llm",
            r.gpu,
            r.run.precision,
            table,
            r.tokens_per_s_per_gpu,
            "tokens/s",
            STACK,
        )
        out.append(TodayCase(FOUNDRY_SOURCE, r.case, case))
    return out


@dataclass(frozen=True)
class _Batch:
    """Every case's merged operators on its GPU (and, for Lambda cases, on the reference GPU)
    as one table; raw engine peaks, with the misaligned operators flagged."""

    group: npt.NDArray[np.intp]
    flops: npt.NDArray[np.float64]
    moved: npt.NDArray[np.float64]
    weights: npt.NDArray[np.float64]
    matrix: npt.NDArray[np.bool_]
    peak: npt.NDArray[np.float64]
    tensor: npt.NDArray[np.bool_]
    misaligned: npt.NDArray[np.bool_]
    vector: npt.NDArray[np.float64]
    bandwidth: npt.NDArray[np.float64]
    sms: npt.NDArray[np.float64]
    groups: int
    serial: SerialWork

    @classmethod
    def of(cls, parts: Sequence[tuple[ThroughputCase, bool]]) -> _Batch:
        columns = []
        serial = []
        for g, (case, on_reference) in enumerate(parts):
            table = case.merged
            serial.append(serial_work(table, case.precision))
            rates = case.reference if on_reference else case.rates
            peak, tensor = matrix_engines(table, rates, case.precision, 1.0)
            n = len(table.kinds)
            mis = table.misaligned if table.misaligned is not None else np.zeros(n, bool)
            columns.append(
                (
                    np.full(n, g),
                    table.flops,
                    table.bytes_moved,
                    table.weights,
                    table.is_matrix,
                    peak,
                    tensor,
                    mis & table.is_half & tensor,
                    np.full(n, rates.vector_flops_per_s),
                    np.full(n, rates.bandwidth_bytes_per_s),
                    np.full(n, float(rates.sm_count)),
                )
            )
        (group, flops, moved, weights, matrix, peak, tensor, mis, vector, bandwidth, sms) = (
            np.concatenate(c) for c in zip(*columns, strict=True)
        )
        return cls(
            group,
            flops,
            moved,
            weights,
            matrix,
            peak,
            tensor,
            mis,
            vector,
            bandwidth,
            sms,
            len(parts),
            SerialWork.concat(serial),
        )

    def seconds(self, params: PerfParameters) -> npt.NDArray[np.float64]:
        """Modelled GPU seconds of each group (no factor)."""
        peak = np.where(self.misaligned, self.peak * params.misaligned_efficiency, self.peak)
        each, _, _ = operator_times(
            self.flops,
            self.moved,
            self.matrix,
            (peak, self.tensor),
            (self.vector, self.bandwidth, self.sms),
            params,
            self.serial,
        )
        seconds: npt.NDArray[np.float64] = np.bincount(
            self.group, weights=each * self.weights, minlength=self.groups
        ).astype(np.float64)
        return seconds


def _params(start: PerfParameters, constants: npt.NDArray[np.float64]) -> PerfParameters:
    values = np.exp(constants)
    return replace(
        with_values(start, values[: len(FIT_FIELDS)]), misaligned_efficiency=float(values[-1])
    )


def fit(
    lam: Sequence[ThroughputCase], today: Sequence[TodayCase], start: PerfParameters
) -> PerfParameters:
    """The joint maximum a-posteriori fit (see the module's docstring)."""
    from scipy.optimize import least_squares

    priors = load_fit_priors()
    doc = json.loads(OUT.read_text(encoding="utf-8"))["fit_priors"]
    prior_values = np.array([*priors.values, *(doc[f]["value"] for f in EXTRA_FIELDS)])
    prior_sd = np.array([*priors.sd_log, *(doc[f]["sd_log"] for f in EXTRA_FIELDS)])
    today_sd = float(doc["today_data_sd_log"])
    parts = [(c, False) for c in lam] + [(c, True) for c in lam] + [(t.case, False) for t in today]
    batch = _Batch.of(parts)
    n_l = len(lam)
    units_l = np.array([float(c.merged.units_per_step) for c in lam])
    units_t = np.array([float(t.case.merged.units_per_step) for t in today])
    limits_l = np.array([c.limit_s for c in lam])
    limits_t = np.array([t.case.limit_s * t.case.merged.units_per_step for t in today])
    workloads = sorted({c.workload for c in lam})
    kind_of = {c.workload: workload_type(c.family) for c in lam}
    kinds = sorted(set(kind_of.values()))
    w_index = [workloads.index(c.workload) for c in lam]
    k_index = [kinds.index(kind_of[w]) for w in workloads]
    measured_l = np.log([c.measured for c in lam]) if lam else np.zeros(0)
    measured_t = np.log([t.case.measured for t in today]) if today else np.zeros(0)
    n, n_w, n_k = len(prior_values), len(workloads), len(kinds)
    cut = np.cumsum([n, n_w, n_k, n_w])

    def residuals(x: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
        constants, factors, kind_factors, shares, kind_shares = np.split(x, cut)
        seconds = batch.seconds(_params(start, constants))
        gpu_s, ref_s = seconds[:n_l] / units_l, seconds[n_l : 2 * n_l] / units_l
        rate_l = measured_rate(
            1 / gpu_s, ref_s, np.exp(factors[w_index]), shares[w_index], limits_l
        )
        rate_t = units_t / np.maximum(seconds[2 * n_l :], limits_t)
        return np.concatenate(
            [
                (np.log(rate_l) - measured_l) / priors.data_sd_log,
                (np.log(rate_t) - measured_t) / today_sd,
                (constants - np.log(prior_values)) / prior_sd,
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
            np.log([*start.vector, start.misaligned_efficiency]),
            [math.log(start.workload_factors.get(w, 1.0)) for w in workloads],
            [math.log(start.type_factors.get(k, 1.0)) for k in kinds],
            [start.workload_host_shares.get(w, 0.1) for w in workloads],
            [start.type_host_shares.get(k, 0.1) for k in kinds],
        ]
    )
    x0 = np.clip(x0, lower + 1e-9, upper - 1e-9)
    x = least_squares(residuals, x0, bounds=(lower, upper), x_scale="jac").x
    constants, factors, kind_factors, shares, kind_shares = np.split(x, cut)
    params = _params(start, constants)
    if not lam:
        return params
    return replace(
        params,
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


def today_error(case: TodayCase, params: PerfParameters) -> float:
    """Signed error of the predicted throughput of a run of today's software (no factor)."""
    seconds = _Batch.of([(case.case, False)]).seconds(params)[0]
    limit = case.case.limit_s * case.case.merged.units_per_step
    return float(case.case.merged.units_per_step / max(seconds, limit) / case.case.measured - 1)


def held_out(
    lam: Sequence[ThroughputCase],
    today: Sequence[TodayCase],
    start: PerfParameters,
    lambda_group: Callable[[ThroughputCase], str] | None,
    today_group: Callable[[TodayCase], str] | None,
    progress: Callable[[str], None] = print,
) -> tuple[dict[int, float], dict[int, float]]:
    """Signed errors of the Lambda cases and of today's cases, each predicted by a fit without
    its group (a group function of None keeps all of that kind's cases in every fit)."""
    names = {lambda_group(c) for c in lam} if lambda_group else set()
    names |= {today_group(t) for t in today} if today_group else set()
    errors_l: dict[int, float] = {}
    errors_t: dict[int, float] = {}
    for name in sorted(names):
        progress(f"refit without {name}")
        train_l = [c for c in lam if lambda_group is None or lambda_group(c) != name]
        train_t = [t for t in today if today_group is None or today_group(t) != name]
        params = fit(train_l, train_t, start)
        for i, c in enumerate(lam):
            if lambda_group is not None and lambda_group(c) == name:
                errors_l[i] = c.predicted(params) / c.measured - 1
        for i, t in enumerate(today):
            if today_group is not None and today_group(t) == name:
                errors_t[i] = today_error(t, params)
    return errors_l, errors_t


def _mape(errors: Sequence[float]) -> float:
    return float(np.mean(np.abs(errors))) if len(errors) else math.nan


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument(
        "--lambda-only",
        action="store_true",
        help="fit on Lambda's table only (today's runs then only validate the fit)",
    )
    args = parser.parse_args()
    lam, left_out = lambda_cases(lambda name: print(f"profile {name}", flush=True))
    for model, gpu, why in left_out:
        print(f"left out: {model} on {gpu}: {why}")
    today = h200_cases() + foundry_cases()
    fitted_today = [] if args.lambda_only else today
    start = load_parameters()
    params = fit(lam, fitted_today, start)
    print("constants (prior):")
    doc_priors = json.loads(OUT.read_text(encoding="utf-8"))["fit_priors"]
    for name in (*FIT_FIELDS, *EXTRA_FIELDS):
        print(f"  {name} = {getattr(params, name):.4g} (prior {doc_priors[name]['value']:.4g})")
    in_sample = [today_error(t, params) for t in today]
    if args.lambda_only:
        by_source = dict(enumerate(in_sample))
        by_model = by_source
    else:
        # each source of today's runs predicted by a fit without it; each model without it
        _, by_source = held_out(lam, today, start, None, lambda t: t.source)
        _, by_model = held_out(lam, today, start, None, lambda t: f"{t.source}:{t.case.workload}")
    print(f"{'case':38s} {'measured':>10s} {'fit':>7s} {'source out':>10s} {'model out':>9s}")
    for i, t in enumerate(today):
        print(
            f"{t.name:38s} {t.case.measured:10.0f} {in_sample[i]:+7.1%} {by_source[i]:+10.1%} "
            f"{by_model[i]:+9.1%}"
        )
    validation: dict[str, float] = {}
    for source in TODAY_SOURCES:
        rows = [i for i, t in enumerate(today) if t.source == source]
        validation[f"{source}_in_sample"] = _mape([in_sample[i] for i in rows])
        validation[f"{source}_in_sample_bias"] = float(np.mean([in_sample[i] for i in rows]))
        validation[f"{source}_leave_source_out"] = _mape([by_source[i] for i in rows])
        validation[f"{source}_leave_one_model_out"] = _mape([by_model[i] for i in rows])
        print(
            f"{source}: MAPE in sample {validation[f'{source}_in_sample']:.1%} (bias "
            f"{validation[f'{source}_in_sample_bias']:+.1%}), fitted without it "
            f"{validation[f'{source}_leave_source_out']:.1%}, leave one model out "
            f"{validation[f'{source}_leave_one_model_out']:.1%}"
        )
    if args.quick:
        return 0
    by_gpu, _ = held_out(lam, fitted_today, start, lambda c: c.gpu.id, None)
    by_lmodel, _ = held_out(lam, fitted_today, start, lambda c: c.model, None)
    gpu_errors = [by_gpu[i] for i in range(len(lam))]
    print(f"Lambda 2020 leave one GPU out: MAPE {_mape(gpu_errors):.1%}")
    print(f"Lambda 2020 leave one model out: MAPE {_mape(list(by_lmodel.values())):.1%}")
    bands = _bands(lam, gpu_errors)
    unseen = _bands(lam, [by_lmodel[i] for i in range(len(lam))])
    calibrated = _bands(lam, transfer_errors(lam, by_lmodel))
    existing = json.loads(OUT.read_text(encoding="utf-8"))
    doc = {
        **existing,
        "fitted_on": (
            f"Lambda 2020 table, {len(lam)} (model, GPU) throughputs at the largest batch, read "
            "with the settings of whichgpu.validate.lambda2020; and "
            f"{len(fitted_today)} training runs of today's software on synthetic data "
            f"({H200_SOURCE}: one H200, torch 2.11, eager PyTorch; {FOUNDRY_SOURCE}: MosaicML's "
            "published MPT tokens/s per GPU, 8 A100 / H100 80GB with FSDP"
            + ("; validation only, not fitted" if args.lambda_only else "")
            + ")"
        ),
        "method": (
            "scripts/fit_throughput.py: joint maximum a-posteriori fit of log(predicted / "
            "measured) throughput with the constants' priors; Lambda's rows with hierarchical "
            "speed factors and host shares (fit_priors, host_time), today's runs with neither; "
            "error_bands = P80 of |leave-one-GPU-out error| of the Lambda table by workload type "
            "(a new GPU, the workload measured); unseen_error_bands = P80 of "
            "|leave-one-model-out error| (a workload never measured); calibrated_error_bands = "
            "P80 of the error of a held-out model's prediction corrected by another GPU's "
            "measured / predicted ratio (predict --calibrate)"
        ),
        "fitted_date": dt.date.today().isoformat(),
        "today_sources": sorted({t.source for t in fitted_today}) or [H200_SOURCE],
        "parameters": {name: float(getattr(params, name)) for name in (*FIT_FIELDS, *EXTRA_FIELDS)},
        "workload_factors": params.workload_factors,
        "type_factors": params.type_factors,
        "workload_host_shares": params.workload_host_shares,
        "type_host_shares": params.type_host_shares,
        "error_bands": bands,
        "unseen_error_bands": unseen,
        "calibrated_error_bands": calibrated,
        "validation": {
            "about": "out-of-sample errors of the fit (scripts/fit_throughput.py), MAPE",
            "lambda2020_leave_one_gpu_out": _mape(gpu_errors),
            "lambda2020_leave_one_model_out": _mape(list(by_lmodel.values())),
            **validation,
        },
        "coverage": coverage(lam, fitted_today),
    }
    OUT.write_text(json.dumps(doc, indent=2) + "\n", encoding="utf-8")
    print(f"bands: {bands}\nunseen bands: {unseen}\ncalibrated bands: {calibrated}\nwrote {OUT}")
    return 0


def coverage(lam: Sequence[ThroughputCase], today: Sequence[TodayCase]) -> dict[str, object]:
    """What the fitted runs covered: their GPUs' architectures, and which of them ran matrix
    operators on tensor cores (``FitCoverage`` in the package)."""
    cases = [*lam, *(t.case for t in today)]
    tensor = [case for case in cases if bool(case.engines[1].any())]
    return {
        "about": (
            "what the fitted runs covered; predict names a GPU architecture outside it, and "
            "what the tensor-core efficiency rests on"
        ),
        "architectures": sorted({str(case.gpu.architecture) for case in cases}),
        "tensor_runs": len(tensor),
        "tensor_workloads": sorted({case.workload for case in tensor}),
        "tensor_precisions": sorted({case.precision for case in tensor}),
        "tensor_architectures": sorted({str(case.gpu.architecture) for case in tensor}),
    }


def _bands(cases: Sequence[ThroughputCase], errors: Sequence[float]) -> dict[str, float]:
    """P80 of the absolute ``errors`` by workload type, and over all as ``default``."""
    by_type: dict[str, list[float]] = {}
    for case, error in zip(cases, errors, strict=True):
        by_type.setdefault(workload_type(case.family), []).append(abs(error))
    bands = {k: float(np.percentile(v, BAND_PERCENTILE)) for k, v in sorted(by_type.items())}
    bands["default"] = float(np.percentile(np.abs(errors), BAND_PERCENTILE))
    return bands


if __name__ == "__main__":
    raise SystemExit(main())

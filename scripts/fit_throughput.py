"""Fit the throughput predictor's constants and write them to the package data.

Run from the repository root:

    python scripts/fit_throughput.py

Fits the five constants of ``whichgpu.estimate.throughput`` on every usable row of the
Lambda 2020 table (``whichgpu.validate.throughput.lambda_cases``), starting from the shipped
values, then refits without each GPU in turn to measure the out-of-sample error that becomes
the prediction bands (80th percentile of the absolute leave-one-GPU-out error, by workload
type) and of a prediction corrected by another GPU's measurement (`predict --calibrate`),
and writes them into ``src/whichgpu/estimate/data/throughput.json`` (other keys kept).
"""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

import numpy as np

from whichgpu.estimate.throughput import FIT_FIELDS, load_parameters, workload_type
from whichgpu.validate.throughput import (
    fit_parameters,
    held_out_errors,
    lambda_cases,
    transfer_errors,
)
from whichgpu.workloads import get_workload

OUT = (
    Path(__file__).resolve().parent.parent / "src" / "whichgpu" / "estimate" / "data"
) / "throughput.json"
BAND_PERCENTILE = 80


def main() -> int:
    cases, left_out = lambda_cases(lambda name: print(f"profile {name}", flush=True))
    for model, gpu, why in left_out:
        print(f"left out: {model} on {gpu}: {why}")
    start = load_parameters()
    params = fit_parameters(cases, start)
    held_out = held_out_errors(cases, params, lambda c: c.gpu.id, print)
    by_type: dict[str, list[float]] = {}
    for i, case in enumerate(cases):
        kind = workload_type(get_workload(case.workload).info.family)
        by_type.setdefault(kind, []).append(abs(held_out[i]))
    everything = [abs(e) for e in held_out.values()]
    bands = {k: float(np.percentile(v, BAND_PERCENTILE)) for k, v in sorted(by_type.items())}
    bands["default"] = float(np.percentile(everything, BAND_PERCENTILE))
    transfer = transfer_errors(cases, held_out)
    calibrated_by_type: dict[str, list[float]] = {}
    for i, case in enumerate(cases):
        kind = workload_type(get_workload(case.workload).info.family)
        calibrated_by_type.setdefault(kind, []).append(abs(transfer[i]))
    calibrated = {
        k: float(np.percentile(v, BAND_PERCENTILE)) for k, v in sorted(calibrated_by_type.items())
    }
    calibrated["default"] = float(np.percentile([abs(e) for e in transfer], BAND_PERCENTILE))
    existing = json.loads(OUT.read_text(encoding="utf-8")) if OUT.exists() else {}
    doc = {
        **existing,
        "fitted_on": (
            f"Lambda 2020 table, {len(cases)} (model, GPU) throughputs at the largest batch, "
            "read with the settings of whichgpu.validate.lambda2020"
        ),
        "method": (
            "scripts/fit_throughput.py: least squares on log(predicted / measured) "
            "throughput; bands = P80 of |leave-one-GPU-out error| by workload type; calibrated "
            "bands = P80 of the error of that held-out prediction corrected by another GPU's "
            "measured / predicted ratio (predict --calibrate)"
        ),
        "fitted_date": dt.date.today().isoformat(),
        "parameters": {name: float(getattr(params, name)) for name in FIT_FIELDS},
        "error_bands": bands,
        "calibrated_error_bands": calibrated,
    }
    OUT.write_text(json.dumps(doc, indent=2) + "\n", encoding="utf-8")
    for name in FIT_FIELDS:
        print(f"{name} = {getattr(params, name):.4g}")
    print(f"bands: {bands}")
    print(f"calibrated bands: {calibrated}")
    print(f"wrote {OUT}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

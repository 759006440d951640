"""Fit the throughput predictor's constants and speed factors and write them to the package data.

Run from the repository root:

    python scripts/fit_throughput.py

Fits the five constants of ``whichgpu.estimate.throughput``, the speed factors of the
measured workloads and their types, and the host shares of their measured runs (the time per
unit spent outside the GPU; a maximum a-posteriori fit with the priors of ``fit_priors`` in the
data file) on every usable row of the Lambda 2020 table
(``whichgpu.validate.throughput.lambda_cases``). Then refits without each GPU in turn and
without each model in turn to measure the out-of-sample errors that become the prediction
bands (80th percentile of the absolute error, by workload type): ``error_bands`` for a new GPU
of a measured workload, ``unseen_error_bands`` for a workload never measured, and
``calibrated_error_bands`` for an unmeasured workload corrected by one measurement on another
GPU (``predict --calibrate``). Writes them into ``src/whichgpu/estimate/data/throughput.json``
(other keys kept).
"""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

import numpy as np

from whichgpu.estimate.throughput import FIT_FIELDS, load_parameters, workload_type
from whichgpu.validate.throughput import (
    ThroughputCase,
    fit_parameters,
    held_out_errors,
    lambda_cases,
    transfer_errors,
)

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
    by_gpu = held_out_errors(cases, params, lambda c: c.gpu.id, print)
    by_model = held_out_errors(cases, params, lambda c: c.model, print)
    bands = _bands(cases, [by_gpu[i] for i in range(len(cases))])
    unseen = _bands(cases, [by_model[i] for i in range(len(cases))])
    calibrated = _bands(cases, transfer_errors(cases, by_model))
    existing = json.loads(OUT.read_text(encoding="utf-8")) if OUT.exists() else {}
    doc = {
        **existing,
        "fitted_on": (
            f"Lambda 2020 table, {len(cases)} (model, GPU) throughputs at the largest batch, "
            "read with the settings of whichgpu.validate.lambda2020"
        ),
        "method": (
            "scripts/fit_throughput.py: maximum a-posteriori fit of log(predicted / measured) "
            "throughput with the constants' priors, hierarchical speed factors and host shares "
            "(fit_priors, host_time); "
            "error_bands = P80 of |leave-one-GPU-out error| by workload type (a new GPU, the "
            "workload measured); unseen_error_bands = P80 of |leave-one-model-out error| (a "
            "workload never measured); calibrated_error_bands = P80 of the error of a "
            "held-out model's prediction corrected by another GPU's measured / predicted ratio "
            "(predict --calibrate)"
        ),
        "fitted_date": dt.date.today().isoformat(),
        "parameters": {name: float(getattr(params, name)) for name in FIT_FIELDS},
        "workload_factors": params.workload_factors,
        "type_factors": params.type_factors,
        "workload_host_shares": params.workload_host_shares,
        "type_host_shares": params.type_host_shares,
        "error_bands": bands,
        "unseen_error_bands": unseen,
        "calibrated_error_bands": calibrated,
        "coverage": coverage(cases),
    }
    OUT.write_text(json.dumps(doc, indent=2) + "\n", encoding="utf-8")
    for name in FIT_FIELDS:
        print(f"{name} = {getattr(params, name):.4g}")
    print(f"workload factors: {params.workload_factors}")
    print(f"type factors: {params.type_factors}")
    print(f"host shares: {params.workload_host_shares}")
    print(f"type host shares: {params.type_host_shares}")
    print(f"bands: {bands}")
    print(f"unseen bands: {unseen}")
    print(f"calibrated bands: {calibrated}")
    print(f"wrote {OUT}")
    return 0


def coverage(cases: list[ThroughputCase]) -> dict[str, object]:
    """What the fitted runs covered: their GPUs' architectures, and which of them ran matrix
    operators on tensor cores (``FitCoverage`` in the package)."""
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


def _bands(cases: list[ThroughputCase], errors: list[float]) -> dict[str, float]:
    """P80 of the absolute ``errors`` by workload type, and over all as ``default``."""
    by_type: dict[str, list[float]] = {}
    for case, error in zip(cases, errors, strict=True):
        by_type.setdefault(workload_type(case.family), []).append(abs(error))
    bands = {k: float(np.percentile(v, BAND_PERCENTILE)) for k, v in sorted(by_type.items())}
    bands["default"] = float(np.percentile(np.abs(errors), BAND_PERCENTILE))
    return bands


if __name__ == "__main__":
    raise SystemExit(main())

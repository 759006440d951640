"""Fit the serving constants to published serving runs and write them to the package data.

Run from the repository root:

    python scripts/fit_serving.py [--quick]

Two constants of ``inference`` in ``src/whichgpu/estimate/data/throughput.json``:
``decode_memory_efficiency``, the share of the DRAM bandwidth a decode step's bytes stream at
(``predict --serving``'s engine model, compiled and eager decoding), and
``fp8_tensor_efficiency``, the share of the catalog's fp8 tensor peak a serving engine's fp8
weight matrix products (W8A8) reach. This predicts every row of ``validate --source serving``
of the quantities ``validate.serving.FITTED_QUANTITIES`` names (engines' output tokens/s and
TPOT, compiled decoding's tokens/s) at points of the two constants: each in turn over 0.40 to
0.95 by 0.05, then by 0.01 around the best, twice; the point of the least mean squared
``log(predicted / measured)`` is kept (``validate.serving.fit_serving``). Each publication is
then left out in turn: its rows predicted at the evaluated point that fits the others best.
TTFT rows are not fitted; they stay an independent check. Writes the constants, how they were
fitted and their out-of-sample error to the data file (other keys kept) unless ``--quick``.
Takes several minutes (each point predicts every row; the first run traces the compiled
rows' steps).
"""

from __future__ import annotations

import argparse
import copy
import datetime as dt
import json
from pathlib import Path
from unittest import mock

from whichgpu.estimate import throughput
from whichgpu.schema import ReferenceThroughputCase
from whichgpu.validate.serving import (
    Point,
    best_point,
    fit_serving,
    fitted_rows,
    serving_throughput,
)

OUT = Path("src/whichgpu/estimate/data/throughput.json")

COARSE = [round(0.40 + 0.05 * i, 2) for i in range(12)]
"""Each constant's coarse grid."""


def predicted_at(point: Point) -> list[ReferenceThroughputCase]:
    """The fitted rows predicted with the constants set to ``point`` (decode bandwidth share,
    fp8 efficiency), the shipped data otherwise."""
    doc = copy.deepcopy(throughput._shipped_document())
    doc["inference"]["decode_memory_efficiency"], doc["inference"]["fp8_tensor_efficiency"] = point
    with mock.patch.object(throughput, "_shipped_document", lambda: doc):
        return serving_throughput(fitted_rows())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="print the fit, write nothing")
    args = parser.parse_args()
    by_point: dict[Point, list[ReferenceThroughputCase]] = {}

    def along(axis: int, point: Point, values: list[float]) -> Point:
        """Evaluate ``point`` with its ``axis`` constant at each of ``values``; the best."""
        tried = []
        for value in values:
            moved = (value, point[1]) if axis == 0 else (point[0], value)
            if moved not in by_point:
                by_point[moved] = predicted_at(moved)
                print(f"share {moved[0]:.2f}, fp8 efficiency {moved[1]:.2f}: evaluated", flush=True)
            tried.append(moved)
        return best_point({p: by_point[p] for p in tried})

    inference = throughput.load_inference_parameters()
    point = (
        round(inference.decode_memory_efficiency, 2),
        round(inference.fp8_tensor_efficiency, 2),
    )
    for axis in (0, 1):
        point = along(axis, point, COARSE)
    for width in (4, 2):
        for axis in (0, 1):
            near = [round(point[axis] + 0.01 * i, 2) for i in range(-width, width + 1)]
            point = along(axis, point, near)
    fit = fit_serving(by_point)
    share, fp8 = fit.point
    print(f"decode bandwidth share {share:.2f}, fp8 efficiency {fp8:.2f} over {fit.rows} rows")
    print(f"{'publication':30s} {'in sample':>9s} {'left out':>9s} {'point without':>13s}")
    for name in fit.in_sample:
        without = fit.held_out_point[name]
        print(
            f"{name:30s} {fit.in_sample[name]:9.1%} {fit.held_out[name]:9.1%} "
            f"{without[0]:6.2f} {without[1]:6.2f}"
        )
    print(f"all rows, each publication left out: mean |error| {fit.held_out_all:.1%}")
    if args.quick:
        return 0
    doc = json.loads(OUT.read_text(encoding="utf-8"))
    fitted = (
        f"fitted {dt.date.today().isoformat()} to {fit.rows} published serving measurements "
        "(engines' output tokens/s and TPOT, compiled decoding's tokens/s: validate --source "
        "serving; scripts/fit_serving.py); each publication predicted from the others' "
        f"fit: mean |error| {fit.held_out_all:.1%}"
    )
    doc["inference"].update(
        decode_memory_efficiency=share,
        source=fitted,
        fp8_tensor_efficiency=fp8,
        fp8_source=f"{fitted}; the 16-bit efficiency is the throughput fit's",
        fit={
            "about": "scripts/fit_serving.py: mean |error| by publication, in sample and "
            "fitted without it, and the constants fitted without it (decode bandwidth share, "
            "fp8 efficiency)",
            "in_sample": fit.in_sample,
            "held_out": fit.held_out,
            "held_out_point": {k: list(v) for k, v in fit.held_out_point.items()},
        },
    )
    OUT.write_text(json.dumps(doc, indent=2) + "\n", encoding="utf-8")
    print(f"wrote {OUT}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

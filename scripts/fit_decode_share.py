"""Fit the decode bandwidth share to published decode measurements and write it to the package data.

Run from the repository root:

    python scripts/fit_decode_share.py [--quick]

``inference.decode_memory_efficiency`` of ``src/whichgpu/estimate/data/throughput.json`` is the
share of the DRAM bandwidth a decode step's bytes stream at, in ``predict --serving`` (the
engine's step model) and in compiled and eager decoding. This predicts every row of
``validate --source serving`` that a decode step sets (``validate.serving.DECODE_QUANTITIES``:
serving engines' output tokens/s and TPOT, compiled decoding's tokens/s) at a grid of shares,
0.40 to 0.95 by 0.05 and then by 0.01 around the best, and keeps the share of the least mean
squared ``log(predicted / measured)`` (``validate.serving.fit_share``). Each publication is then
left out in turn: its rows predicted at the share that fits the others. TTFT rows are not
fitted (a prompt's prefill is mostly matrix work); they stay a check. Writes the share, how it
was fitted and its out-of-sample error to the data file (other keys kept) unless ``--quick``.
Takes a few minutes (each share predicts every row; the first run traces the compiled rows'
steps).
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
from whichgpu.validate.serving import decode_rows, fit_share, serving_throughput

OUT = Path("src/whichgpu/estimate/data/throughput.json")


def predicted_at(share: float) -> list[ReferenceThroughputCase]:
    """The decode rows predicted with the decode share set to ``share`` (the shipped data
    otherwise)."""
    doc = copy.deepcopy(throughput._shipped_document())
    doc["inference"]["decode_memory_efficiency"] = share
    with mock.patch.object(throughput, "_shipped_document", lambda: doc):
        return serving_throughput(decode_rows())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="print the fit, write nothing")
    args = parser.parse_args()
    by_share: dict[float, list[ReferenceThroughputCase]] = {}

    def evaluate(shares: list[float]) -> None:
        for share in shares:
            if share not in by_share:
                by_share[share] = predicted_at(share)
                print(f"share {share:.2f}: evaluated", flush=True)

    evaluate([round(0.40 + 0.05 * i, 2) for i in range(12)])
    coarse = fit_share(by_share).share
    evaluate([round(coarse + 0.01 * i, 2) for i in range(-4, 5)])
    fit = fit_share(by_share)
    print(f"decode bandwidth share {fit.share:.2f} over {fit.rows} rows")
    print(f"{'publication':30s} {'in sample':>9s} {'left out':>9s} {'share without':>13s}")
    for name in fit.in_sample:
        print(
            f"{name:30s} {fit.in_sample[name]:9.1%} {fit.held_out[name]:9.1%} "
            f"{fit.held_out_share[name]:13.2f}"
        )
    print(f"all rows, each publication left out: mean |error| {fit.held_out_all:.1%}")
    if args.quick:
        return 0
    doc = json.loads(OUT.read_text(encoding="utf-8"))
    doc["inference"]["decode_memory_efficiency"] = fit.share
    doc["inference"]["source"] = (
        f"fitted {dt.date.today().isoformat()} to {fit.rows} published decode measurements "
        "(serving engines' output tokens/s and TPOT, compiled decoding's tokens/s: validate "
        "--source serving; scripts/fit_decode_share.py); each publication predicted from the "
        f"others' fit: mean |error| {fit.held_out_all:.1%}"
    )
    doc["inference"]["fit"] = {
        "about": "scripts/fit_decode_share.py: mean |error| by publication, in sample and "
        "fitted without it",
        "in_sample": fit.in_sample,
        "held_out": fit.held_out,
        "held_out_share": fit.held_out_share,
    }
    OUT.write_text(json.dumps(doc, indent=2) + "\n", encoding="utf-8")
    print(f"wrote {OUT}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Compare the closed-form peak of allocated bytes with the traced (stored) profiles.

For every stored profile of a transformer workload whose model the closed form covers, the
replayed peak allocated bytes (``StepMemory.replay``, no workspaces) at b in {1, 4, 16} and
L in {512, 2048} (BERT capped at its 512 positions) are compared with
``whichgpu.estimate.closed_form.estimate``; the table of relative errors is printed.

With ``--fit`` it first fits the closed form's one named coefficient and writes it, with
provenance, to ``src/whichgpu/estimate/data/closed_form_coefficients.json``:
``safety_fraction``, the largest shortfall of the analytic phases against any point of the
table, rounded up to 0.1 %, so that no point is below its trace.

Run: ``.venv/bin/python scripts/calibrate_closed_form.py [--fit]``
"""

from __future__ import annotations

import datetime
import json
import math
import sys
from pathlib import Path

from whichgpu.estimate import closed_form
from whichgpu.estimate.closed_form import DEFAULT_POINTS, cross_check

DATA = Path(__file__).resolve().parents[1] / "src/whichgpu/estimate/data"


def _write(safety: float, note: str) -> None:
    doc = {
        "safety_fraction": safety,
        "provenance": note,
    }
    (DATA / closed_form.COEFFICIENTS_FILE).write_text(json.dumps(doc, indent=2) + "\n")


def fit() -> None:
    """Fit the coefficient (see the module docstring) and store it."""
    _write(0.0, "fitting")
    rows = cross_check(points=DEFAULT_POINTS)
    lowest = min(r.relative_error for r in rows)
    safety = math.ceil(max(0.0, 1 / (1 + lowest) - 1) * 1000) / 1000
    today = datetime.date.today().isoformat()
    _write(
        safety,
        f"scripts/calibrate_closed_form.py --fit, {today}: {len(rows)} points (b in 1, 4, 16; "
        "L in 512, 2048, capped at the model's positions) of the stored bf16/fp32 AdamW "
        "profiles of gpt2*, llama*, mistral-7b, qwen2.5-*, bert-base/large/squad",
    )


def main(argv: list[str]) -> int:
    if "--fit" in argv:
        fit()
    rows = cross_check(points=DEFAULT_POINTS)
    worst = 0.0
    print("| profile | b | L | traced bytes | closed-form bytes | error | phase |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        worst = max(worst, abs(r.relative_error))
        print(
            f"| {r.profile} | {r.batch_size} | {r.seq_len} | {r.traced_bytes} | "
            f"{r.closed_form_bytes} | {r.relative_error:+.2%} | {r.phase} |"
        )
    low = [r for r in rows if r.relative_error < 0]
    print(f"\n{len(rows)} points; worst |error| {worst:.2%}; {len(low)} below the trace.")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

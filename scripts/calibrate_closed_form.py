"""Compare the closed-form peak of allocated bytes with the traced (stored) profiles.

For every stored profile of a transformer workload whose model the closed form covers, the
replayed peak allocated bytes (``StepMemory.replay``, no workspaces) at b in {1, 4, 16} and
L in {512, 2048} (BERT capped at its 512 positions) are compared with
``whichgpu.estimate.closed_form.estimate``; the table of relative errors is printed.

Then the peak *reserved* bytes: at b in {1, 4, 16, 64} and the same lengths, each profile is
replayed with the cuBLAS workspaces of both GPU classes (compute capability 9.0 and the
others, default software stack); the workspaces' own segments
(``memory.workspace_reserved_bytes``) are taken out, and the rest is divided by the closed
form's peak allocated bytes. The script prints the allocator's own ratio (traced reserved /
traced allocated), the ratio the closed form needs, and the residuals of the shipped factor
(``closed_form.reserved_bytes`` + workspaces against the traced reserved bytes).

With ``--fit`` it first fits the closed form's two named coefficients and writes them, with
provenance, to ``src/whichgpu/estimate/data/closed_form_coefficients.json``:

- ``safety_fraction``: the largest shortfall of the analytic phases against any point of the
  allocated table, rounded up to 0.1 %, so that no point is below its trace;
- ``reserved_factor``: the largest ratio of the reserved table, rounded up to 0.1 %, so that
  ``fit --fast`` is never below the traced reserved bytes at these points.

Run: ``.venv/bin/python scripts/calibrate_closed_form.py [--fit]``
"""

from __future__ import annotations

import datetime
import json
import math
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

from whichgpu.catalog.stacks import get_stack
from whichgpu.estimate import closed_form
from whichgpu.estimate.closed_form import DEFAULT_POINTS, RESERVED_POINTS, cross_check
from whichgpu.estimate.memory import StepMemory, workspace_reserved_bytes
from whichgpu.profiles.stored import load_stored
from whichgpu.schema import RunConfig

DATA = Path(__file__).resolve().parents[1] / "src/whichgpu/estimate/data"
PROFILES = "the stored bf16/fp32 AdamW profiles of gpt2*, llama*, mistral-7b, qwen2.5-*, bert-*"


@dataclass(frozen=True)
class ReservedPoint:
    """One profile at one size with one GPU class's workspaces."""

    profile: str
    batch_size: int
    seq_len: int
    gpu_class: str
    traced_allocated: int
    """Peak allocated bytes of the replay without workspaces."""
    traced_reserved: int
    """Peak reserved bytes of the replay with the workspaces."""
    workspace_reserved: int
    """The workspaces' own segments."""
    closed_form_allocated: int

    @property
    def needed_factor(self) -> float:
        """Reserved bytes (workspaces out) per closed-form allocated byte."""
        return (self.traced_reserved - self.workspace_reserved) / self.closed_form_allocated

    @property
    def fast_error(self) -> float:
        """The shipped factor's reserved bytes (workspaces in) against the trace's."""
        fast = closed_form.reserved_bytes(self.closed_form_allocated) + self.workspace_reserved
        return fast / self.traced_reserved - 1


def reserved_points() -> list[ReservedPoint]:
    """Every profile at ``RESERVED_POINTS`` (lengths capped at the model's positions)."""
    stack = get_stack(None)
    classes = {
        "sm90": (stack.cublas_workspace_sm90_bytes, stack.cublaslt_workspace_bytes) * 2,
        "other": (stack.cublas_workspace_bytes, stack.cublaslt_workspace_bytes) * 2,
    }
    out: list[ReservedPoint] = []
    for name in closed_form.closed_form_workloads():
        config = closed_form.workload_config(name)
        positions = closed_form.parse_config(config).positions
        for run in (RunConfig(precision="bf16"), RunConfig(precision="fp32")):
            profile = load_stored(name, run)
            if profile is None:
                continue
            memory = StepMemory(profile)
            seen: set[tuple[int, int]] = set()
            for b, length in RESERVED_POINTS:
                length = min(length, positions) if positions else length
                if (b, length) in seen:
                    continue
                seen.add((b, length))
                allocated = memory.replay(b, length, ()).peak_allocated_bytes
                closed = closed_form.estimate(config, run, b, length).peak_allocated_bytes
                for gpu_class, workspaces in classes.items():
                    reserved = memory.replay(b, length, workspaces).peak_reserved_bytes
                    out.append(
                        ReservedPoint(
                            profile=f"{name}_{run.precision}",
                            batch_size=b,
                            seq_len=length,
                            gpu_class=gpu_class,
                            traced_allocated=allocated,
                            traced_reserved=reserved,
                            workspace_reserved=workspace_reserved_bytes(workspaces),
                            closed_form_allocated=closed,
                        )
                    )
    return out


def _read() -> dict[str, object]:
    doc: dict[str, object] = json.loads((DATA / closed_form.COEFFICIENTS_FILE).read_text())
    return doc


def _write(doc: dict[str, object]) -> None:
    (DATA / closed_form.COEFFICIENTS_FILE).write_text(json.dumps(doc, indent=2) + "\n")
    closed_form.load_coefficients.cache_clear()


def fit() -> None:
    """Fit the coefficients (see the module docstring) and store them."""
    today = datetime.date.today().isoformat()
    doc = _read()
    _write({**doc, "safety_fraction": 0.0, "provenance": "fitting"})
    rows = cross_check(points=DEFAULT_POINTS)
    lowest = min(r.relative_error for r in rows)
    safety = math.ceil(max(0.0, 1 / (1 + lowest) - 1) * 1000) / 1000
    doc = {
        **doc,
        "safety_fraction": safety,
        "provenance": f"scripts/calibrate_closed_form.py --fit, {today}: {len(rows)} points (b "
        f"in 1, 4, 16; L in 512, 2048, capped at the model's positions) of {PROFILES}",
    }
    _write(doc)
    points = reserved_points()
    factor = math.ceil(max(p.needed_factor for p in points) * 1000) / 1000
    _write(
        {
            **doc,
            "reserved_factor": factor,
            "reserved_provenance": f"scripts/calibrate_closed_form.py --fit, {today}: the "
            f"largest of {len(points)} ratios of replayed peak reserved bytes (workspaces out) "
            f"to closed-form peak allocated bytes, b in 1, 4, 16, 64, L in 512, 2048, "
            f"rounded up to 0.1 %, on {PROFILES}",
        }
    )


def _allocated_table() -> None:
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


def _reserved_table() -> None:
    points = reserved_points()
    print("\n| profile | b | L | GPU class | traced reserved / allocated | needed factor | fast |")
    print("|---|---|---|---|---|---|---|")
    for p in points:
        ratio = (p.traced_reserved - p.workspace_reserved) / p.traced_allocated
        print(
            f"| {p.profile} | {p.batch_size} | {p.seq_len} | {p.gpu_class} | {ratio:.4f} | "
            f"{p.needed_factor:.4f} | {p.fast_error:+.2%} |"
        )
    ratios = [(p.traced_reserved - p.workspace_reserved) / p.traced_allocated for p in points]
    needed = [p.needed_factor for p in points]
    errors = [p.fast_error for p in points]
    factor = closed_form.load_coefficients().reserved_factor
    print(
        f"\n{len(points)} points. Allocator (traced reserved / traced allocated): "
        f"{min(ratios):.4f} … {max(ratios):.4f}, median {statistics.median(ratios):.4f}. "
        f"Needed by the closed form: {min(needed):.4f} … {max(needed):.4f}, median "
        f"{statistics.median(needed):.4f}. With the shipped factor {factor:.3f}, fast vs "
        f"traced reserved: {min(errors):+.2%} … {max(errors):+.2%}, median "
        f"{statistics.median(errors):+.2%}; {sum(e < 0 for e in errors)} below the trace, "
        f"{sum(e > 0.08 for e in errors)} more than 8 % above."
    )


def main(argv: list[str]) -> int:
    if "--fit" in argv:
        fit()
    _allocated_table()
    _reserved_table()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

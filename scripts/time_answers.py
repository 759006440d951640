"""Time whole-catalog answers for the named workloads, each in a fresh process, as a user runs them.

Run from the repository root:

    python scripts/time_answers.py                  # predict and fit of every named workload
    python scripts/time_answers.py bert-large gpt2  # some workloads

Each command is ``whichgpu predict NAME --json`` (or ``fit``) on every catalog GPU, started as a
new process, so the time includes Python's start, the imports, reading the catalog and the
stored profile, and rendering. Prints the median of three runs and the slowest workload; the
target is under a second without torch.
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import time
from pathlib import Path

from whichgpu.workloads import all_workloads

WHICHGPU = str(Path(sys.executable).with_name("whichgpu"))
RUNS = 3


def seconds(args: list[str]) -> float:
    """Median wall time of ``whichgpu ARGS`` over ``RUNS`` fresh processes."""
    times = []
    for _ in range(RUNS):
        started = time.perf_counter()
        subprocess.run([WHICHGPU, *args], check=True, stdout=subprocess.DEVNULL)
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def main(names: list[str]) -> int:
    workloads = [w.info.name for w in all_workloads() if not names or w.info.name in names]
    print(f"{'workload':16s} {'predict':>9s} {'fit':>9s}")
    slowest = (0.0, "")
    for name in workloads:
        row = [seconds([command, name, "--json"]) for command in ("predict", "fit")]
        slowest = max(slowest, (max(row), name))
        print(f"{name:16s} {row[0]:8.2f}s {row[1]:8.2f}s", flush=True)
    print(f"slowest: {slowest[1]} {slowest[0]:.2f} s (median of {RUNS} fresh processes)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

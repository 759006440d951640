"""Trace the compiled step of a few named training runs and store their partitions.

``predict --compile`` and ``fit --compile`` need AOTAutograd's min-cut partition of the step
at batch 1 and 2 of the run's length (``api.step.CompiledStep``): seconds for a small model,
minutes for a 70B one on every fresh machine. This stores them, as package data, for the runs
whichgpu's own validation asks about (``validate throughput``: its H200 measurements of Llama
3.2 1B at 2,048 tokens and NVIDIA's published Llama 3 runs at 8,192) and the common lengths of
Llama 3.1 8B. Run from the repository root with the torch extra installed:

    python scripts/make_compiled.py

Writes ``src/whichgpu/workloads/profiles/compiled/<stem>.json.gz``
(``profiles.stored.compiled_stem``) with the versions of torch and transformers traced with,
and prints each trace's time. ``python scripts/make_compiled.py llama-3.1-8b:16384`` traces
only the stored runs named (workload:length, or workload:length:policy for a checkpointed
one), leaving the other files as they are.
"""

from __future__ import annotations

import gzip
import importlib.metadata
import json
import sys
import time
from pathlib import Path

from whichgpu.api.step import compiled_trace
from whichgpu.profiles.stored import COMPILED_DIR, compiled_stem
from whichgpu.workloads import get_workload, run_config

OUT = Path(__file__).resolve().parents[1] / "src/whichgpu/workloads/profiles" / COMPILED_DIR

STORED = (
    ("llama-3.2-1b", 2048, None),
    ("llama-3.1-8b", 2048, None),
    ("llama-3.1-8b", 4096, None),
    ("llama-3.1-8b", 8192, None),
    ("llama-3.1-8b", 16384, None),
    ("llama-3.1-8b", 32768, None),
    ("llama-3.1-8b", 65536, None),
    ("llama-3.1-8b", 131072, None),
    ("llama-3.1-70b", 8192, None),
    ("llama-3.1-8b", 8192, "selective"),
    ("mixtral-8x7b", 4096, None),
)
"""(workload, sequence length, checkpointing policy or None) of the stored bf16 AMP training
runs (fp8 runs take their bf16 step's partition); Llama 3.1 8B's long ones are NVIDIA's
long-sequence runs (``validate/data/parallel``), its selectively checkpointed one the published
recipe runs (``validate/data/recipes``), Mixtral 8x7B's at 4,096 NVIDIA's expert-parallel
rows."""


def main(argv: list[str]) -> int:
    OUT.mkdir(parents=True, exist_ok=True)
    wanted = {_named(a) for a in argv}
    unknown = wanted - set(STORED)
    if unknown:
        print(f"not among the stored runs: {sorted(unknown)}", file=sys.stderr)
        return 2
    for name, length, policy in STORED:
        if wanted and (name, length, policy) not in wanted:
            continue
        workload = get_workload(name)
        checkpointed = {} if policy is None else {"checkpointing_policy": policy}
        run = run_config(mode="train", precision="bf16", seq_len=length, **checkpointed)
        started = time.perf_counter()
        batches = {str(b): compiled_trace(workload, run, b).to_json() for b in (1, 2)}
        doc = {
            "workload": name,
            "run": run.model_dump(mode="json"),
            "versions": {lib: importlib.metadata.version(lib) for lib in ("torch", "transformers")},
            "batches": batches,
        }
        path = OUT / f"{compiled_stem(name, run)}.json.gz"
        with gzip.open(path, "wt", encoding="utf-8", compresslevel=9) as fh:
            json.dump(doc, fh, separators=(",", ":"))
        seconds = time.perf_counter() - started
        print(f"{path.name}: {seconds:.0f} s, {path.stat().st_size / 1024:.0f} KiB")
    return 0


def _named(argument: str) -> tuple[str, int, str | None]:
    """``workload:length[:policy]`` as a ``STORED`` entry."""
    name, length, *policy = argument.split(":")
    return name, int(length), policy[0] if policy else None


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

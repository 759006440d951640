"""Trace the named workloads on their size grids and store their scalable profiles.

Run from the repository root with the torch extra installed:

    python scripts/make_profiles.py                 # every workload, every stored run
    python scripts/make_profiles.py resnet50 gpt2   # some workloads
    python scripts/make_profiles.py --mode inference llama-3.1-8b   # only its inference run
    python scripts/make_profiles.py --missing       # only runs with no stored profile yet

Writes ``src/whichgpu/workloads/profiles/<key>.json.gz`` (see ``whichgpu.profiles.stored``)
and prints each workload's trace time. A test regenerates one profile and compares it.
The replays shipped with the old files no longer apply: run ``scripts/warm_replays.py`` next
(a test fails until it has run).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from whichgpu.profiles.stored import profile_key
from whichgpu.schema import RunConfig
from whichgpu.trace.scaling import ProfileNotScalable, trace_scalable
from whichgpu.workloads import all_workloads, run_config
from whichgpu.workloads.base import Workload

OUT = Path(__file__).resolve().parent.parent / "src" / "whichgpu" / "workloads" / "profiles"

SEED_FAMILIES = {"seed_nasnet", "seed_detection", "seed_gan", "seed_translation"}
"""Families of Lambda's 2020 benchmark, also stored in fp32 for `validate memory`."""

INFERENCE_FAMILIES = {"llm"}
"""Families whose default inference run (bf16 weights, the default new tokens; concurrency
and context are the profile's variables) is stored too."""


PURE_BF16 = {"llama-3.2-1b"}
"""Workloads whose full training in pure bf16 (bf16 weights and optimizer states, no fp32
master copy) is stored too: the issue's 1-3B full fine-tune is measured in both conventions."""

FINETUNED = {"llama-3.1-8b"}
"""Workloads whose fine-tuning on one card is stored too: QLoRA with and without gradient
checkpointing (`whichgpu recommend --for llm-finetune`; the product's student example) and
LoRA with it."""


PIPELINED = {"llama-3.2-1b", "llama-3.1-8b", "llama-3.1-70b"}
"""Workloads whose training with gradient accumulation is stored too: a pipeline-parallel run
(`--pipeline-parallel`) needs micro-batches, so its step is the accumulating one, and the
published many-GPU runs `validate --source parallel` compares are of these models."""


H200_MEASURED = {"llama-3.2-1b": {"checkpointing": True}}
"""A run of the H200 measurements of 2026-11-26 that no other rule stores, so that `validate`
answers it from a stored profile instead of tracing it after each update. (GPT-2 fp32, the
other, stays traced: `validate closed-form` checks every stored profile against the closed
form, which covers GPT-2 under AMP only.)"""


PUBLISHED_RECIPES = {"llama-3.1-8b": {"checkpointing": True, "checkpointing_policy": "selective"}}
"""The eager step of the published recipe runs `validate --source recipes` compares (compiled
and selectively checkpointed: `validate/data/recipes`), so that it is not traced after each
update."""


def stored_runs(workload: Workload) -> list[RunConfig]:
    """The run configurations stored for a workload."""
    runs = [run_config()]
    if workload.info.name in PURE_BF16:
        runs.append(run_config(precision="bf16-pure"))
    if workload.info.name in FINETUNED:
        runs.append(run_config(method="qlora", checkpointing=True))
        runs.append(run_config(method="qlora"))
        runs.append(run_config(method="lora", checkpointing=True))
    if workload.info.family in SEED_FAMILIES or workload.info.family in {"encoders", "vision"}:
        runs.append(run_config(precision="fp32"))
    if workload.info.family == "seed_translation":
        runs.append(run_config(precision="fp16"))  # fairseq's recipes train with --fp16
    if workload.info.name in PIPELINED:
        runs.append(run_config(grad_accum=2))
    for extras in (H200_MEASURED, PUBLISHED_RECIPES):
        extra = extras.get(workload.info.name)
        if extra is not None and run_config(**extra) not in runs:
            runs.append(run_config(**extra))
    if workload.info.family in INFERENCE_FAMILIES:
        runs.append(run_config(mode="inference"))
    return runs


def main(args: list[str]) -> int:
    mode = None
    if args[:1] == ["--mode"]:
        mode, args = args[1], args[2:]
    missing_only = "--missing" in args
    names = [a for a in args if a != "--missing"]
    OUT.mkdir(parents=True, exist_ok=True)
    failures = 0
    for workload in all_workloads():
        if names and workload.info.name not in names:
            continue
        for run in stored_runs(workload):
            if mode is not None and run.mode != mode:
                continue
            key = profile_key(workload.info.name, run)
            path = OUT / f"{key}.json.gz"
            if missing_only and path.exists():
                continue
            started = time.perf_counter()
            try:
                profile = trace_scalable(workload, run)
            except ProfileNotScalable as exc:
                print(f"{key:48s} NOT STORED: {exc}", flush=True)
                failures += 1
                continue
            profile.save(path)
            print(
                f"{key:48s} {time.perf_counter() - started:6.1f} s  "
                f"{len(profile.events):6d} events {len(profile.ops):6d} ops  "
                f"{path.stat().st_size / 1024:7.1f} KiB",
                flush=True,
            )
    print("next: python scripts/warm_replays.py (the new files need their replays)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

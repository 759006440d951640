"""Measure whichgpu's reference set on this machine and save it as validation data.

Run from the repository root:

    python scripts/measure_reference.py --device cpu      # live-tensor peaks on the CPU
    python scripts/measure_reference.py --device cuda     # the GPU set (issue: memory, bench)
    python scripts/measure_reference.py --device cuda --only gpt2 resnet50
    python scripts/measure_reference.py --trace-only    # after a tracer change: re-trace only

Each measurement of the plan for the device is a ``whichgpu bench`` run (random weights,
synthetic data; the largest-batch searches probe in child processes). The results, with the
environment each ran in, are written in the ``whichgpu results export`` format to
``src/whichgpu/validate/data/measured/<device>.json`` (``cpu``, or the catalog id of the GPU),
replacing the measurements of the same plan entries and keeping the others, so a session with
little time can measure part of the plan. ``whichgpu validate memory`` compares every shipped
measurement with the prediction for the same run.

On the CPU the script also traces each measured run with the CPU's own dropout and attention
kernels, with the torch that measured it, into ``measured/cpu-kernels/`` (what the CPU cases
are predicted from: ``whichgpu.validate.measured``). ``--trace-only`` re-traces those
profiles for the shipped CPU measurements without measuring again (after a tracer change).

The plans use run configurations whose profiles are stored with whichgpu where they can, so the
validation needs no torch; the CPU plan keeps to sizes a CPU steps through in seconds.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from whichgpu.api import bench
from whichgpu.profiles.stored import profile_key
from whichgpu.schema import BenchResult
from whichgpu.store import read_results_file, write_results_file
from whichgpu.validate.measured import CPU_KERNEL_DIR
from whichgpu.workloads import get_workload

OUT_DIR = (
    Path(__file__).resolve().parent.parent / "src" / "whichgpu" / "validate" / "data" / "measured"
)


PLAN_NOTE = "measured by scripts/measure_reference.py: "
"""Start of the note that names the plan entry a result measures."""


@dataclass(frozen=True)
class Measurement:
    """One entry of a plan: a workload and the ``bench`` options to measure it with."""

    workload: str
    options: dict[str, Any] = field(default_factory=dict)

    @property
    def label(self) -> str:
        """The entry as a command line would say it."""
        flags = " ".join(
            f"--{k.replace('_', '-')}" + ("" if v is True else f" {v}")
            for k, v in self.options.items()
        )
        return f"{self.workload} {flags}".strip()


CPU_PLAN = (
    Measurement("resnet50", {"precision": "fp32", "batch_size": 4}),
    Measurement("resnet50", {"precision": "fp32", "find_max_batch": True, "memory_limit_gib": 2.0}),
    Measurement("vit-b-16", {"precision": "fp32", "batch_size": 4}),
    Measurement("bert-base", {"precision": "fp32", "seq_len": 128, "batch_size": 4}),
    Measurement(
        "bert-base",
        {"precision": "fp32", "seq_len": 128, "find_max_batch": True, "memory_limit_gib": 3.0},
    ),
    Measurement("gpt2", {"precision": "bf16", "seq_len": 256, "batch_size": 2}),
    Measurement("yolov3", {"precision": "fp32", "batch_size": 1}),
    # the fine-tuning methods, checkpointing, pure bf16 and the other optimizers
    Measurement("gpt2", {"precision": "bf16", "seq_len": 256, "batch_size": 2, "method": "lora"}),
    Measurement(
        "gpt2",
        {
            "precision": "bf16",
            "seq_len": 256,
            "method": "lora",
            "find_max_batch": True,
            "memory_limit_gib": 2.0,
        },
    ),
    Measurement("gpt2", {"precision": "bf16", "seq_len": 256, "batch_size": 2, "method": "qlora"}),
    Measurement(
        "gpt2", {"precision": "bf16", "seq_len": 256, "batch_size": 2, "checkpointing": True}
    ),
    Measurement("gpt2", {"precision": "bf16-pure", "seq_len": 256, "batch_size": 2}),
    Measurement(
        "gpt2", {"precision": "bf16", "seq_len": 256, "batch_size": 2, "optimizer": "adamw-8bit"}
    ),
    Measurement(
        "bert-base", {"precision": "fp32", "seq_len": 128, "batch_size": 4, "optimizer": "sgd"}
    ),
    Measurement(
        "bert-base",
        {"precision": "fp32", "seq_len": 128, "batch_size": 4, "optimizer": "adafactor"},
    ),
    # inference: a forward pass without gradients; a language model serves a request batch
    Measurement("resnet50", {"mode": "inference", "precision": "fp32", "batch_size": 4}),
    Measurement(
        "bert-base", {"mode": "inference", "precision": "fp32", "seq_len": 128, "batch_size": 4}
    ),
    Measurement(
        "gpt2",
        {
            "mode": "inference",
            "precision": "bf16",
            "context": 256,
            "new_tokens": 16,
            "batch_size": 4,
        },
    ),
)
"""Small steps whose live tensors the CPU counts exactly (``bench.tensor_memory``): the model
families, LoRA and QLoRA, checkpointing, pure bf16, each optimizer, and inference (a language
model's: a request batch served with a static KV cache)."""

CUDA_PLAN = (
    Measurement("resnet50", {"precision": "bf16", "find_max_batch": True}),
    Measurement("resnet50", {"precision": "fp32", "find_max_batch": True}),
    Measurement("vit-b-16", {"precision": "bf16", "find_max_batch": True}),
    Measurement("bert-large", {"precision": "bf16", "seq_len": 512, "find_max_batch": True}),
    Measurement("gpt2", {"precision": "bf16", "seq_len": 1024, "find_max_batch": True}),
    Measurement("gpt2-xl", {"precision": "bf16", "seq_len": 1024, "find_max_batch": True}),
    Measurement("llama-3.2-1b", {"precision": "bf16", "seq_len": 2048, "find_max_batch": True}),
    Measurement(
        "llama-3.2-1b", {"precision": "bf16-pure", "seq_len": 2048, "find_max_batch": True}
    ),
    Measurement(
        "llama-3.1-8b",
        {
            "precision": "bf16",
            "seq_len": 2048,
            "method": "qlora",
            "checkpointing": True,
            "find_max_batch": True,
        },
    ),
    Measurement(
        "llama-3.2-1b",
        {"mode": "inference", "precision": "bf16", "context": 4096, "find_max_batch": True},
    ),
)
"""The issue's spread: CNNs, BERT, GPT-2, a 1B LLM in AMP and pure bf16, an 8B QLoRA, and
inference with a KV cache, each at its largest batch."""


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N")
    parser.add_argument("--only", nargs="*", default=[], help="workloads of the plan to run")
    parser.add_argument("--min-seconds", type=float, default=None)
    parser.add_argument(
        "--trace-only",
        action="store_true",
        help="re-trace the CPU-kernel profiles of the shipped CPU measurements; measure nothing",
    )
    args = parser.parse_args(argv)
    if args.trace_only:
        write_cpu_kernel_profiles(r for _, r in read_results_file(OUT_DIR / "cpu.json", "json"))
        return 0
    on_cpu = args.device == "cpu"
    plan = [
        m for m in (CPU_PLAN if on_cpu else CUDA_PLAN) if not args.only or m.workload in args.only
    ]
    timing: dict[str, Any] = {"min_seconds": 1.0, "min_iters": 2} if on_cpu else {}
    if args.min_seconds is not None:
        timing["min_seconds"] = args.min_seconds
    fresh: list[BenchResult] = []
    for entry in plan:
        print(f"measuring {entry.label} on {args.device}", flush=True)
        results = bench(entry.workload, device=args.device, **timing, **entry.options)
        for result in results:
            note = f"{PLAN_NOTE}{entry.label}"
            fresh.append(result.model_copy(update={"notes": (*result.notes, note)}))
            print(
                f"  batch {result.batch_size} (max {result.max_batch_size}): allocated "
                f"{result.peak_allocated_bytes}, reserved {result.peak_reserved_bytes}, "
                f"device {result.device_used_bytes}, {result.throughput:.4g} "
                f"{result.throughput_unit}",
                flush=True,
            )
    if not fresh:
        print("nothing measured")
        return 1
    name = "cpu" if on_cpu else (fresh[0].gpu or "cuda")
    out = OUT_DIR / f"{name}.json"
    measured = {f"{PLAN_NOTE}{entry.label}" for entry in plan}
    kept = []
    if out.exists():
        kept = [r for _, r in read_results_file(out, "json") if not set(r.notes) & measured]
    OUT_DIR.mkdir(parents=True, exist_ok=True)
    write_results_file(out, [*kept, *fresh], "json")
    print(f"wrote {len(fresh)} results ({len(kept)} kept) to {out}")
    if on_cpu:
        write_cpu_kernel_profiles(fresh)
    return 0


def write_cpu_kernel_profiles(results: Iterable[BenchResult]) -> None:
    """Trace each run of ``results`` with the CPU's kernels into ``measured/cpu-kernels/``."""
    from whichgpu.trace.scaling import trace_scalable

    folder = OUT_DIR / CPU_KERNEL_DIR
    folder.mkdir(parents=True, exist_ok=True)
    done: set[str] = set()
    for result in results:
        stem = profile_key(result.workload, result.run)
        if stem in done:
            continue
        done.add(stem)
        print(f"tracing {stem} with the CPU's kernels", flush=True)
        profile = trace_scalable(get_workload(result.workload), result.run, kernels="cpu")
        profile.save(folder / f"{stem}.json.gz")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

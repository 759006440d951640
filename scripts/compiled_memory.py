"""What ``torch.compile`` saves of a training step's activations, derived (not fitted).

For (a) ``llama-3.2-1b`` at batch 8 x 2048 and (b) the Llama 3.1 8B shape cut to 8 layers
(``src/whichgpu/workloads/configs/llama-3.1-8b.json`` with ``num_hidden_layers`` 8, given as a
config file, as ``whichgpu fit --config FILE`` takes it) at batch 4 x 2048, both bf16 AMP with
AdamW, ``whichgpu.trace.compiled.compiled_activations`` traces one forward pass and loss
through AOTAutograd under fake tensors and prints the bytes the forward pass saves for the
backward pass under ``default_partition`` (eager) and under inductor's min-cut partitioner
(compiled), their difference, and the largest saved tensors of each. The traces run at the
full sizes (fake tensors allocate nothing; the time goes to tracing and partitioning, which
do not depend on the batch).

It then prints what inductor's fusion does to the DRAM traffic of the step
(``Partition.forward_kernels``, ``backward_kernels``): per phase, the fused kernels and the
extern kernels (matrix products, attention) with their bytes, for the compiled (min-cut) and,
for comparison, the eager (default) partition; and the eager traffic, where each fusible aten
operator is its own kernel (``Partition.unfused_bytes``). The traffic fusion removes, priced at
the H200's bandwidth and whichgpu's fitted DRAM efficiency (a first-order check, nothing is
fitted to it), is set against the step time compiling saved on an H200: (a) 44,982 -> 54,458
tokens/s, an eager step of 0.364 s, 0.063 s saved; (b) 27,027 -> 30,315 tokens/s, an eager
step of 0.303 s, 0.033 s saved.

The measured peaks these are compared with (whichgpu bench on an H200, torch 2.11,
transformers 5.17, AdamW foreach, bf16 AMP, peak of ``torch.cuda.max_memory_allocated``):
(a) eager 76.42 GiB, compiled 52.63 GiB; (b) eager 64.81 GiB, compiled 54.59 GiB.

Run: ``.venv/bin/python scripts/compiled_memory.py [--top N]``
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

from whichgpu.trace.compiled import CompiledActivations, Partition, Phase, compiled_activations
from whichgpu.units import GIB
from whichgpu.workloads import run_config
from whichgpu.workloads.base import Workload
from whichgpu.workloads.user import config_workload

CONFIGS = Path(__file__).parents[1] / "src" / "whichgpu" / "workloads" / "configs"

MEASURED_GIB = {
    "llama-3.2-1b": (76.42, 52.63),
    "llama-3.1-8b, 8 layers": (64.81, 54.59),
}
"""(eager, compiled) peak allocated GiB on an H200 (see the module's docstring)."""

MEASURED_STEP_SECONDS = {
    "llama-3.2-1b": (0.364, 0.364 * 44_982 / 54_458),
    "llama-3.1-8b, 8 layers": (0.303, 0.303 * 27_027 / 30_315),
}
"""(eager, compiled) step seconds on an H200, from the measured tokens/s."""

H200_BYTES_PER_SECOND = 4.8e12
DRAM_EFFICIENCY = 0.573
"""whichgpu's fitted fraction of the bandwidth a memory-bound kernel reaches."""
LAUNCH_SECONDS = 3.8e-6
"""whichgpu's fitted floor of one kernel."""
PHASES: tuple[Phase, Phase] = ("forward", "backward")


def eight_layer_8b(folder: Path) -> Workload:
    """The Llama 3.1 8B config with 8 layers, written to ``folder`` and read as ``--config``."""
    config = json.loads((CONFIGS / "llama-3.1-8b.json").read_text())
    config["num_hidden_layers"] = 8
    path = folder / "llama-3.1-8b-8-layers.json"
    path.write_text(json.dumps(config, indent=2))
    return config_workload(path)


def show(label: str, result: CompiledActivations, top: int) -> None:
    default, compiled = result.default, result.min_cut
    saved = result.saved_bytes_difference / GIB
    eager_gib, compiled_gib = MEASURED_GIB[label]
    measured = eager_gib - compiled_gib
    print(f"== {label}: batch {result.batch_size} x {result.seq_len}, {result.precision}")
    for part in (default, compiled):
        print(
            f"  {part.partitioner:8s} saved {part.saved_bytes / GIB:7.2f} GiB   "
            f"({len([t for t in part.saved if t.bytes])} tensors; forward {part.forward_ops} "
            f"ops, backward {part.backward_ops} ops; traced in {part.trace_seconds:.1f} s)"
        )
    print(
        f"  outputs held by the step (loss, logits, KV cache): {default.output_bytes / GIB:.2f} GiB"
    )
    print(f"  difference: {saved:.2f} GiB")
    print(
        f"  measured: eager {eager_gib:.2f} GiB, compiled {compiled_gib:.2f} GiB, saving "
        f"{measured:.2f} GiB; the saved activations explain {saved / measured:.0%} of it"
    )
    for part in (default, compiled):
        table(part, top)
    traffic(label, result)


def traffic(label: str, result: CompiledActivations) -> None:
    """The DRAM traffic of the step's kernels, fused and not, and the time the difference
    is worth at the H200's bandwidth."""
    default, compiled = result.default, result.min_cut
    print("  kernels (count, GiB read + written):")
    for phase in PHASES:
        for part in (compiled, default):
            print(
                f"    {phase:8s} {part.partitioner:8s} fused {part.kernel_count(phase):5d} "
                f"{part.kernel_bytes(phase) / GIB:7.2f} GiB   extern "
                f"{part.kernel_count(phase, 'extern'):5d} "
                f"{part.kernel_bytes(phase, 'extern') / GIB:7.2f} GiB   unfused "
                f"{part.unfused_count(phase):5d} {part.unfused_bytes(phase) / GIB:7.2f} GiB"
            )
    eager_ops = sum(default.unfused_bytes(p) for p in PHASES)
    fused = sum(compiled.kernel_bytes(p) for p in PHASES)
    eager_extern = sum(default.kernel_bytes(p, "extern") for p in PHASES)
    compiled_extern = sum(compiled.kernel_bytes(p, "extern") for p in PHASES)
    removed = eager_ops - fused
    removed_all = removed + eager_extern - compiled_extern
    launches = sum(default.unfused_count(p) - compiled.kernel_count(p) for p in PHASES)
    rate = DRAM_EFFICIENCY * H200_BYTES_PER_SECOND
    eager_s, compiled_s = MEASURED_STEP_SECONDS[label]
    print(
        f"  fusion removes {removed / GIB:.2f} GiB of the fusible operators' traffic "
        f"(eager ops {eager_ops / GIB:.2f} GiB -> fused kernels {fused / GIB:.2f} GiB; "
        f"with the extern kernels' change, {removed_all / GIB:.2f} GiB) and {launches} launches"
    )
    print(
        f"  at {DRAM_EFFICIENCY} x {H200_BYTES_PER_SECOND / 1e12:.1f} TB/s: "
        f"{removed / rate * 1e3:.1f} ms per step ({removed_all / rate * 1e3:.1f} ms with the "
        f"externs; launch floors {launches * LAUNCH_SECONDS * 1e3:.1f} ms at most); measured "
        f"saving {(eager_s - compiled_s) * 1e3:.1f} ms of a {eager_s * 1e3:.0f} ms eager step"
    )


def table(part: Partition, top: int) -> None:
    print(f"  largest saved tensors, {part.partitioner}:")
    for t in part.largest(top):
        shape = "x".join(str(s) for s in t.shape)
        dtype = t.dtype.removeprefix("torch.")
        print(f"    {t.bytes / GIB:7.3f} GiB  {t.name:28s} {t.op:36s} {shape:22s} {dtype}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--top", type=int, default=10, help="saved tensors listed (default 10)")
    parser.add_argument(
        "--only", choices=["a", "b"], default=None, help="run one of the two cases only"
    )
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        if args.only in (None, "a"):
            run = run_config(batch_size=8, seq_len=2048, precision="bf16")
            show("llama-3.2-1b", compiled_activations("llama-3.2-1b", run, 8, 2048), args.top)
        if args.only in (None, "b"):
            run = run_config(batch_size=4, seq_len=2048, precision="bf16")
            result = compiled_activations(eight_layer_8b(Path(folder)), run, 4, 2048)
            show("llama-3.1-8b, 8 layers", result, args.top)


if __name__ == "__main__":
    main()

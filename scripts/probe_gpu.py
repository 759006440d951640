"""Record what a GPU's allocator and kernels do in whichgpu's training steps, for root-cause checks.

``whichgpu bench`` says how much memory a step reserved and how long it took; this script says
why, on a CUDA GPU, so that a miss of the memory or speed model can be traced to its cause
instead of being corrected by a factor. Three parts, each case written to ``--out`` as soon as
it finishes (a run cut short keeps what finished):

- ``alloc``: every allocation and free of PyTorch's caching allocator over the first training
  steps (``torch.cuda.memory._record_memory_history``, no stacks), with the peaks and the
  segments it ended with, with ``cudnn.benchmark`` on and off. Replaying the recorded stream
  through ``whichgpu.estimate.allocator`` separates "the trace has other tensors" from "the
  allocator model reserves differently".
- ``kernels``: the device time of every operator (with input shapes) and every kernel of two
  profiled steps (``torch.profiler``), and the wall time of ten unprofiled steps: where a step's
  time goes, and how much of it the GPU sits idle.
- ``gemm``: bf16/fp32 matrix products at the shapes of the measured models and elementwise /
  normalisation passes at their sizes, timed with CUDA events: the efficiencies the speed
  model assumes, measured.
- ``infer``: a request batch as ``whichgpu bench --mode inference`` serves it eagerly (a static
  KV cache, the prefill, then one greedy decode step per new token): the prefill and the
  decode steps timed apart, and the device time of every operator and kernel of one request,
  the prefill's and the decode steps' apart (``torch.profiler`` with ``record_function``).

The steps are whichgpu's own (the workload's model and loss, ``recipe.training``'s
optimizer; ``recipe.generation``'s static cache and generation step), random weights and
synthetic data. Run from the repository root::

    python scripts/probe_gpu.py --out DIR [--parts alloc,kernels,gemm,infer] [--device cuda]

``--device cpu`` runs the same code on tiny sizes (no allocator history: a CPU has no caching
allocator) to check the script before a GPU is at hand.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import gzip
import json
import platform
import statistics
import sys
import time
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from whichgpu.recipe.generation import (
    generation_arguments,
    prompt_ids,
    serving_sizes,
    static_cache,
)
from whichgpu.recipe.training import make_optimizer, step_loss
from whichgpu.workloads import get_workload, run_config
from whichgpu.workloads.finetune import apply_method


@dataclass(frozen=True)
class Case:
    """A training step to probe: the workload, its run options and the cuDNN search setting."""

    workload: str
    options: dict[str, Any]
    cudnn_benchmark: bool = True

    @property
    def label(self) -> str:
        opts = "_".join(f"{k}{v}" for k, v in self.options.items())
        return f"{self.workload}_{opts}_bench{int(self.cudnn_benchmark)}".replace("-", "")


ALLOC_CASES = (
    Case("resnet50", {"precision": "bf16", "batch_size": 128}),
    Case("resnet50", {"precision": "bf16", "batch_size": 128}, cudnn_benchmark=False),
    Case("vit-b-16", {"precision": "bf16", "batch_size": 128}),
    Case("vit-b-16", {"precision": "bf16", "batch_size": 128}, cudnn_benchmark=False),
    Case("resnet50", {"precision": "fp32", "batch_size": 64}, cudnn_benchmark=False),
    Case("gpt2", {"precision": "bf16", "batch_size": 32, "seq_len": 1024}),
    Case("llama-3.2-1b", {"precision": "bf16", "batch_size": 8, "seq_len": 2048}),
)
"""The H200 cases the memory model misses (ResNet-50 and ViT-B under AMP), the cuDNN case with
the search off, and two it matches (GPT-2, Llama 1B) as controls."""

KERNEL_CASES = (
    Case("llama-3.2-1b", {"precision": "bf16", "batch_size": 8, "seq_len": 2048}),
    Case("resnet50", {"precision": "bf16", "batch_size": 128}),
    Case("gpt2", {"precision": "bf16", "batch_size": 8, "seq_len": 1024}),
    Case("vit-b-16", {"precision": "bf16", "batch_size": 128}),
    Case("bert-large", {"precision": "bf16", "batch_size": 32, "seq_len": 512}),
    Case("llama-3.2-1b", {"precision": "bf16-pure", "batch_size": 8, "seq_len": 2048}),
)
"""The H200 step-time cases, the two largest misses first (Llama 1B too slow, ResNet-50 too
fast)."""

INFERENCE_CASES = (
    Case(
        "llama-3.2-1b", {"precision": "bf16", "concurrency": 16, "context": 2048, "new_tokens": 32}
    ),
    Case(
        "llama-3.2-1b", {"precision": "bf16", "concurrency": 64, "context": 2048, "new_tokens": 32}
    ),
)
"""whichgpu's own eager inference measurements on the H200 (``bench --mode inference``,
2026-11-27: 1,024 and 1,390 generated tokens/s), which ``predict`` gives 39 and 67 % faster,
the time going to work that grows with the sequences: the prefill or the decode steps."""

CPU_SIZES = {"batch_size": 1, "seq_len": 32}
"""What ``--device cpu`` shrinks every case to."""

CPU_INFERENCE_SIZES = {"concurrency": 2, "context": 16, "new_tokens": 2}
"""What ``--device cpu`` shrinks every inference case to."""


def environment(device: str) -> dict[str, Any]:
    """The software and hardware a probe ran on."""
    import transformers

    env: dict[str, Any] = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
        "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    if device.startswith("cuda"):
        props = torch.cuda.get_device_properties(0)
        env.update(
            gpu=props.name,
            total_memory_bytes=props.total_memory,
            multiprocessors=props.multi_processor_count,
            compute_capability=f"{props.major}.{props.minor}",
        )
    return env


@dataclass
class Step:
    """A built training step on a device."""

    run_step: Callable[[], None]
    parameters: int


def build_step(case: Case, device: str) -> Step:
    """Build ``case``'s model, batch and optimizer on ``device``, as ``whichgpu bench`` does."""
    options = dict(case.options)
    if device == "cpu":
        options.update({k: v for k, v in CPU_SIZES.items() if k in options or k == "batch_size"})
    run = run_config(mode="train", **options)
    torch.backends.cudnn.benchmark = case.cudnn_benchmark
    if device.startswith("cuda"):
        fp32 = run.precision == "fp32"
        torch.backends.cuda.matmul.allow_tf32 = not fp32 and run.precision == "tf32"
        torch.backends.cudnn.allow_tf32 = not fp32
    workload = get_workload(case.workload)
    with torch.device(device):
        built = apply_method(workload.build(run), run)
        model = built.model.to(device)
        batch = built.make_batch(run.batch_size or 1, run.seq_len)
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = make_optimizer(run, params)
    amp = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(run.precision)
    kind = "cuda" if device.startswith("cuda") else "cpu"

    def run_step() -> None:
        with torch.autocast(device_type=kind, dtype=amp or torch.float32, enabled=amp is not None):
            loss = step_loss(built, run, model, batch)
        loss.backward()  # type: ignore[no-untyped-call]
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return Step(run_step, sum(p.numel() for p in model.parameters()))


def synchronize(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def release(device: str) -> None:
    gc.collect()
    if device.startswith("cuda"):
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()


def write(out: Path, name: str, record: dict[str, Any]) -> None:
    """Write one case's record, gzipped JSON, and say so on stdout."""
    path = out / f"{name}.json.gz"
    with gzip.open(path, "wt") as f:
        json.dump(record, f)
    print(f"wrote {path.name} ({path.stat().st_size // 1024} KiB)", flush=True)


@contextmanager
def allocator_history(device: str) -> Iterator[dict[str, Any]]:
    """Record the caching allocator's events while the block runs (CUDA only)."""
    found: dict[str, Any] = {}
    if not device.startswith("cuda"):
        yield found
        return
    torch.cuda.memory._record_memory_history(
        enabled="all", context=None, stacks="python", max_entries=2_000_000
    )
    try:
        yield found
        snapshot = torch.cuda.memory._snapshot()
    finally:
        torch.cuda.memory._record_memory_history(enabled=None)
    codes = {"alloc": "a", "free_requested": "r", "free_completed": "f"}
    events = []
    for trace in snapshot["device_traces"]:
        for event in trace:
            action = event["action"]
            events.append(
                [codes.get(action, action), event["addr"], event["size"], event.get("stream", 0)]
            )
    found["events"] = events
    found["segments_at_end"] = [
        {
            "total_size": s["total_size"],
            "allocated_size": s["allocated_size"],
            "pool": s.get("segment_type"),
            "stream": s.get("stream", 0),
        }
        for s in snapshot["segments"]
    ]


ALLOC_STATS = (
    "allocated_bytes.all.peak",
    "reserved_bytes.all.peak",
    "requested_bytes.all.peak",
    "allocated_bytes.large_pool.peak",
    "reserved_bytes.large_pool.peak",
    "allocated_bytes.small_pool.peak",
    "reserved_bytes.small_pool.peak",
    "inactive_split_bytes.all.peak",
    "segment.all.peak",
    "num_alloc_retries",
    "num_device_alloc",
    "num_device_free",
)


def probe_alloc(case: Case, device: str, steps: int) -> dict[str, Any]:
    """The allocator's events and peaks over the first ``steps`` training steps."""
    release(device)
    with allocator_history(device) as history:
        step = build_step(case, device)
        for _ in range(steps):
            step.run_step()
        synchronize(device)
    record: dict[str, Any] = {"case": case.label, "workload": case.workload, **case.options}
    record.update(cudnn_benchmark=case.cudnn_benchmark, steps=steps, parameters=step.parameters)
    if device.startswith("cuda"):
        stats = torch.cuda.memory_stats()
        record["stats"] = {k: stats.get(k) for k in ALLOC_STATS}
        record["peak_allocated_bytes"] = torch.cuda.max_memory_allocated()
        record["peak_reserved_bytes"] = torch.cuda.max_memory_reserved()
        record["event_format"] = (
            "[action, address, size_bytes, stream]; action a = alloc, r = free requested, "
            "f = free completed, else the allocator's own name (segment_alloc, ...)"
        )
        record.update(history)
    del step
    release(device)
    return record


def profiled_tables(prof: Any) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """A ``torch.profiler`` run's ATen operators (by input shapes: count, device and CPU
    times) and its kernels (count, device time)."""
    ops = [
        {
            "name": e.key,
            "shapes": str(e.input_shapes),
            "count": e.count,
            "device_us": e.device_time_total,
            "self_device_us": e.self_device_time_total,
            "cpu_us": e.cpu_time_total,
        }
        for e in prof.key_averages(group_by_input_shape=True)
        if e.key.startswith("aten::")
    ]
    kernels = [
        {"name": e.key, "count": e.count, "device_us": e.self_device_time_total}
        for e in prof.key_averages()
        if e.self_device_time_total > 0 and not e.key.startswith("aten::")
    ]
    return ops, kernels


def probe_kernels(case: Case, device: str, timed_steps: int) -> dict[str, Any]:
    """Operator and kernel device times of two profiled steps; wall time of unprofiled ones."""
    from torch.profiler import ProfilerActivity, profile

    release(device)
    step = build_step(case, device)
    for _ in range(3):
        step.run_step()
    synchronize(device)
    start = time.perf_counter()
    for _ in range(timed_steps):
        step.run_step()
    synchronize(device)
    wall_s = (time.perf_counter() - start) / timed_steps
    activities = [ProfilerActivity.CPU]
    if device.startswith("cuda"):
        activities.append(ProfilerActivity.CUDA)
    with profile(activities=activities, record_shapes=True) as prof:
        for _ in range(2):
            step.run_step()
        synchronize(device)
    ops, kernels = profiled_tables(prof)
    record: dict[str, Any] = {"case": case.label, "workload": case.workload, **case.options}
    record.update(
        wall_s_per_step=wall_s,
        timed_steps=timed_steps,
        profiled_steps=2,
        kernel_us_total=sum(k["device_us"] for k in kernels),
        parameters=step.parameters,
        ops=ops,
        kernels=kernels,
    )
    del step, prof
    release(device)
    return record


def probe_inference(case: Case, device: str, repeats: int) -> dict[str, Any]:
    """The prefill and the decode steps of one eager request batch, as ``whichgpu bench --mode
    inference`` serves it (bf16 autocast, ``inference_mode``, a fresh static cache per
    request), timed apart over ``repeats`` requests after two warm-up ones (synchronised wall
    times; medians), and the operators and kernels of one profiled request, the prefill's and
    the decode steps' apart."""
    from torch.profiler import ProfilerActivity, profile, record_function

    release(device)
    options = dict(case.options)
    if device == "cpu":
        options.update(CPU_INFERENCE_SIZES)
    run = run_config(mode="inference", **options)
    workload = get_workload(case.workload)
    with torch.device(device):
        built = workload.build(run)
        model = built.model.to(device).eval()
    serving = serving_sizes(workload.info, built, run)
    if serving is None:
        raise ValueError(f"{case.workload} does not generate with a KV cache")
    ids = prompt_ids(model, serving)
    amp = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(run.precision)
    kind = "cuda" if device.startswith("cuda") else "cpu"

    def request(marks: bool = False) -> tuple[float, float]:
        """One request batch: its prefill's seconds and its decode steps' mean seconds."""
        with (
            torch.inference_mode(),
            torch.autocast(device_type=kind, dtype=amp or torch.float32, enabled=amp is not None),
        ):
            step = generation_arguments(model, static_cache(model, serving))
            synchronize(device)
            start = time.perf_counter()
            with record_function("prefill") if marks else contextlib.nullcontext():
                token = model(input_ids=ids, **step).logits[:, -1:].argmax(dim=-1)
                synchronize(device)
            prefilled = time.perf_counter()
            with record_function("decode") if marks else contextlib.nullcontext():
                for _ in range(serving.new_tokens):
                    token = model(input_ids=token, **step).logits[:, -1:].argmax(dim=-1)
                synchronize(device)
            end = time.perf_counter()
        return prefilled - start, (end - prefilled) / serving.new_tokens

    for _ in range(2):
        request()
    times = [request() for _ in range(repeats)]
    prefill_s = statistics.median(t[0] for t in times)
    decode_s = statistics.median(t[1] for t in times)
    activities = [ProfilerActivity.CPU]
    if device.startswith("cuda"):
        activities.append(ProfilerActivity.CUDA)
    with profile(activities=activities, record_shapes=True) as prof:
        request(marks=True)
    phases = {
        e.key: {"device_us": e.device_time_total, "cpu_us": e.cpu_time_total}
        for e in prof.key_averages()
        if e.key in ("prefill", "decode")
    }
    ops, kernels = profiled_tables(prof)
    request_s = prefill_s + serving.new_tokens * decode_s
    record: dict[str, Any] = {"case": case.label, "workload": case.workload, **options}
    record.update(
        sequences=serving.sequences,
        context_tokens=serving.context_tokens,
        new_tokens=serving.new_tokens,
        requests_timed=repeats,
        prefill_s=prefill_s,
        decode_step_s=decode_s,
        request_s=request_s,
        generated_tokens_per_s=serving.sequences * serving.new_tokens / request_s,
        phases=phases,
        kernel_us_total=sum(k["device_us"] for k in kernels),
        ops=ops,
        kernels=kernels,
    )
    del prof
    release(device)
    return record


def _timed_ms(fn: Callable[[], Any], device: str, repeats: int) -> float:
    """Median milliseconds of ``fn`` after two warm-ups (CUDA events on a GPU)."""
    for _ in range(2):
        fn()
    synchronize(device)
    times = []
    for _ in range(repeats):
        if device.startswith("cuda"):
            begin = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            begin.record()
            fn()
            end.record()
            end.synchronize()
            times.append(begin.elapsed_time(end))
        else:
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e3)
    times.sort()
    return times[len(times) // 2]


GEMM_SHAPES = (
    # (m, n, k): Llama 3.2 1B at 8 x 2048 tokens: q/o, k/v, gate/up, down, lm_head
    (16384, 2048, 2048),
    (16384, 512, 2048),
    (16384, 8192, 2048),
    (16384, 2048, 8192),
    (16384, 128256, 2048),
    # its backward: grad input (n <-> k) and grad weight (k = tokens)
    (2048, 2048, 16384),
    (8192, 2048, 16384),
    (2048, 128256, 16384),
    # GPT-2 small at 8 x 1024 tokens: qkv, proj, fc, lm_head
    (8192, 2304, 768),
    (8192, 768, 768),
    (8192, 3072, 768),
    (8192, 50257, 768),
    (8192, 50304, 768),
    # BERT-large at 32 x 512 tokens; ViT-B at 128 x 197 tokens
    (16384, 4096, 1024),
    (25216, 3072, 768),
    # squares
    (4096, 4096, 4096),
    (8192, 8192, 8192),
)
"""Matrix products ``(m, k) @ (k, n)`` of the measured models."""

PASSES = (
    # (what, shape): BN and ReLU at ResNet-50's largest activations at batch 128, LayerNorm of
    # Llama 1B's and GPT-2's hidden states, a softmax over GPT-2's vocabulary
    ("batch_norm_train", (128, 256, 56, 56)),
    ("batch_norm_train", (128, 64, 112, 112)),
    ("relu", (128, 256, 56, 56)),
    ("add", (128, 256, 56, 56)),
    ("layer_norm", (16384, 2048)),
    ("layer_norm", (8192, 768)),
    ("log_softmax_fp32", (8192, 50257)),
    ("copy", (1 << 28,)),
)
"""Memory-bound passes at the measured models' sizes (bf16 unless named fp32)."""


def probe_gemm(device: str) -> dict[str, Any]:
    """Achieved TFLOP/s of matrix products and GB/s of memory-bound passes."""
    scale = 1 if device.startswith("cuda") else 64
    rows = []
    for dtype, tf32 in ((torch.bfloat16, False), (torch.float32, False)):
        torch.backends.cuda.matmul.allow_tf32 = tf32
        for m, n, k in GEMM_SHAPES if dtype == torch.bfloat16 else GEMM_SHAPES[-2:]:
            m, n, k = max(1, m // scale), max(1, n // scale), max(1, k // scale)
            a = torch.randn(m, k, device=device, dtype=dtype)
            b = torch.randn(k, n, device=device, dtype=dtype)
            for layout in ("nn", "nt", "tn"):
                x = a if layout != "tn" else a.t().contiguous().t()
                y = b if layout != "nt" else b.t().contiguous().t()
                ms = _timed_ms(lambda x=x, y=y: torch.matmul(x, y), device, 10)
                rows.append(
                    {
                        "kind": "gemm",
                        "dtype": str(dtype).removeprefix("torch."),
                        "m": m,
                        "n": n,
                        "k": k,
                        "layout": layout,
                        "ms": ms,
                        "tflops": 2 * m * n * k / ms / 1e9,
                    }
                )
                del x, y
            del a, b
            release(device)
    for what, shape in PASSES:
        shape = tuple(max(1, s // scale) if i == 0 else s for i, s in enumerate(shape))
        dtype = torch.float32 if what.endswith("fp32") else torch.bfloat16
        x = torch.randn(*shape, device=device, dtype=dtype)
        moved = x.numel() * x.element_size()
        if what == "batch_norm_train":
            channels = shape[1]
            weight = torch.ones(channels, device=device)
            bias = torch.zeros(channels, device=device)
            mean = torch.zeros(channels, device=device)
            var = torch.ones(channels, device=device)

            def fn(
                x: torch.Tensor = x,
                stats: tuple[torch.Tensor, ...] = (mean, var, weight, bias),
            ) -> Any:
                return torch.nn.functional.batch_norm(x, *stats, training=True)

            moved *= 3  # statistics read, normalising read, write
        elif what == "relu":

            def fn(x: torch.Tensor = x) -> Any:
                return torch.relu(x)

            moved *= 2
        elif what == "add":

            def fn(x: torch.Tensor = x) -> Any:
                return x + x

            moved *= 2
        elif what == "layer_norm":
            w = torch.ones(shape[-1], device=device, dtype=dtype)

            def fn(x: torch.Tensor = x, w: torch.Tensor = w, n: int = shape[-1]) -> Any:
                return torch.nn.functional.layer_norm(x, (n,), w, w)

            moved *= 2
        elif what.startswith("log_softmax"):

            def fn(x: torch.Tensor = x) -> Any:
                return torch.log_softmax(x, dim=-1)

            moved *= 2
        else:

            def fn(x: torch.Tensor = x) -> Any:
                return x.clone()

            moved *= 2
        ms = _timed_ms(fn, device, 20)
        rows.append(
            {
                "kind": what,
                "dtype": str(dtype).removeprefix("torch."),
                "shape": list(shape),
                "ms": ms,
                "bytes_moved_assumed": moved,
                "gb_per_s": moved / ms / 1e6,
            }
        )
        del x
        release(device)
    return {"rows": rows}


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="folder for the records")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--parts", default="alloc,kernels,gemm,infer")
    parser.add_argument("--only", nargs="*", default=[], help="workloads to probe")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    parts = args.parts.split(",")
    write(args.out, "environment", environment(args.device))
    jobs: list[tuple[str, Callable[[], dict[str, Any]]]] = []
    on_cpu = args.device == "cpu"
    steps = 2 if on_cpu else 10
    jobs.extend(
        (f"alloc_{case.label}", lambda c=case: probe_alloc(c, args.device, 3))
        for case in (ALLOC_CASES if "alloc" in parts else ())
        if not args.only or case.workload in args.only
    )
    jobs.extend(
        (f"kernels_{case.label}", lambda c=case: probe_kernels(c, args.device, steps))
        for case in (KERNEL_CASES if "kernels" in parts else ())
        if not args.only or case.workload in args.only
    )
    jobs.extend(
        (f"infer_{case.label}", lambda c=case: probe_inference(c, args.device, 2 if on_cpu else 5))
        for case in (INFERENCE_CASES if "infer" in parts else ())
        if not args.only or case.workload in args.only
    )
    if "gemm" in parts:
        jobs.append(("gemm", lambda: probe_gemm(args.device)))
    failed = 0
    for name, job in jobs:
        start = time.perf_counter()
        print(f"probing {name}", flush=True)
        try:
            record = job()
        except Exception as exc:
            failed += 1
            release(args.device)
            record = {"error": repr(exc)[:500], "traceback": traceback.format_exc()[-2000:]}
            print(f"  failed: {exc!r}"[:300], flush=True)
        record["wall_s"] = time.perf_counter() - start
        write(args.out, name, record)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

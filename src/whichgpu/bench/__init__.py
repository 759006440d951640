"""Measure workloads on a real device: largest batch, throughput, memory, power.

``run_bench`` (in ``runner``) benches one workload on one ``Device`` (``parse_device``: CUDA,
the CPU, Apple's MPS, or the simulated ``FakeDevice`` the tests use) and returns
``BenchResult``s. Every probe and measurement runs in a child process with a timeout
(``probe``), so an out-of-memory error, a hang or a crash is an outcome, never the end of the
harness. The package knows nothing of the results store, the catalog or the reports, so a
rank of a multi-GPU run can run it with no side effects; ``whichgpu.api.bench`` adds the
catalog's figures (GPU id, MFU) and the CLI stores the results.

Roles: ``devices`` (the device protocol), ``probe`` (child processes and their outcomes),
``search`` (doubling then bisection), ``timing`` (warm-up and timing rule), ``session`` (the
step on a torch device), ``tensor_memory`` (the CPU's memory count and limit), ``nvml``
(power and clocks), ``environment`` (what the machine is), ``distributed`` (multi-GPU
aggregation), ``worker`` (the child tasks), ``runner`` (the order of a bench), ``jobs``
(what crosses between processes). Importing this package does not import torch.
"""

from __future__ import annotations

from whichgpu.bench.devices import (
    CpuDevice,
    CudaDevice,
    Device,
    FakeDevice,
    MpsDevice,
    parse_device,
)
from whichgpu.bench.jobs import BenchProgress, WorkloadRef
from whichgpu.bench.runner import BenchOptions, inspect, run_bench
from whichgpu.bench.timing import TimingRule

__all__ = [
    "BenchOptions",
    "BenchProgress",
    "CpuDevice",
    "CudaDevice",
    "Device",
    "FakeDevice",
    "MpsDevice",
    "TimingRule",
    "WorkloadRef",
    "inspect",
    "parse_device",
    "run_bench",
]

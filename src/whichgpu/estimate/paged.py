"""Paged optimizers (``--optimizer paged-adamw-8bit``, bitsandbytes' ``PagedAdamW8bit``): the
large 8-bit states live in CUDA unified memory, outside PyTorch's caching allocator, so they
never decide what fits; what does not stay resident beside the step crosses PCIe twice each
optimizer step, at the share of the link that bitsandbytes' documentation says page migration
reaches at best. What bitsandbytes does and the model: docs/memory.md, "Paged optimizers".
"""

from __future__ import annotations

from whichgpu.estimate.data_parallel import load_links
from whichgpu.schema import GpuSpec, RunConfig, Vendor
from whichgpu.units import GB, GIB

PAGED_OPTIMIZERS = ("paged-adamw-8bit",)
"""Optimizers whose state bitsandbytes allocates in CUDA unified memory."""

PAGE_MIGRATION_SHARE = 0.5
"""The share of the PCIe link's rate that paging reaches at best: "you usually won't be able to
get full PCIe memory bandwidth utilization. If you do a manual prefetch, transfer speeds can be
high but still only about half or worse than the full PCIe memory bandwidth" (bitsandbytes
docs, "Paged optimizers", ``docs/source/explanations/optimizers.mdx``)."""


def is_paged(run: RunConfig) -> bool:
    """Whether ``run`` trains with a paged optimizer."""
    return run.mode == "train" and run.optimizer in PAGED_OPTIMIZERS


def paged_refusal(run: RunConfig, gpu: GpuSpec) -> str | None:
    """Why ``gpu`` cannot run ``run``'s paged optimizer (None: it can, or the run pages
    nothing): bitsandbytes pages through CUDA unified memory, which NVIDIA's GPUs have."""
    if not is_paged(run) or gpu.vendor == Vendor.NVIDIA:
        return None
    return (
        f"{gpu.name}: --optimizer {run.optimizer} keeps its state in CUDA unified memory "
        "(bitsandbytes' paged optimizers allocate it with cudaMallocManaged), which only "
        "NVIDIA's GPUs page; use --optimizer adamw-8bit"
    )


def paged_out_bytes(paged_state_bytes: int, headroom_bytes: int) -> int:
    """The part of the paged state that does not fit in the memory the step leaves free."""
    return max(0, paged_state_bytes - max(headroom_bytes, 0))


def pcie_bytes_per_s(gpu: GpuSpec) -> float | None:
    """The peak rate of ``gpu``'s PCIe link to the host, per direction (bytes/s): the
    catalog's generation and lanes (x16 where the lanes are unknown) at the per-lane rates of
    ``data/links.json``; None without a known generation."""
    rates = load_links().pcie_gbps_per_lane
    if gpu.pcie_gen is None or gpu.pcie_gen not in rates:
        return None
    return rates[gpu.pcie_gen] * (gpu.pcie_lanes or 16) * GB


def paging_seconds(paged_out: int, gpu: GpuSpec) -> float | None:
    """Seconds an optimizer step spends moving ``paged_out`` bytes in and out over PCIe
    (``2 x paged_out / (PAGE_MIGRATION_SHARE x rate)``); 0 when nothing is paged out, None when
    the link's rate is not known."""
    if paged_out <= 0:
        return 0.0
    rate = pcie_bytes_per_s(gpu)
    return None if rate is None else 2 * paged_out / (PAGE_MIGRATION_SHARE * rate)


def memory_note(paged_state: int, paged_out: int) -> str:
    """The assumption line of a memory estimate with a paged optimizer."""
    return (
        f"paged optimizer (bitsandbytes PagedAdamW8bit): {paged_state / GIB:.2f} GiB of its "
        "8-bit state (parameters of 1e5 elements or more) in CUDA unified memory, outside the "
        "caching allocator: not in the device total, and it never decides whether a batch "
        "fits; it stays resident in the memory the step leaves free, and "
        f"{paged_out / GIB:.2f} GiB that does not fit there is paged to host memory and back "
        "each optimizer step"
    )


def speed_note(gpu: GpuSpec, paged_out: int, seconds: float | None) -> str:
    """The assumption line of a speed prediction with state paged out."""
    if seconds is None:
        return (
            f"{paged_out / GIB:.2f} GiB of paged optimizer state moves over PCIe each step, "
            f"but the catalog has no PCIe generation for {gpu.name}: the time ignores the "
            "paging"
        )
    rate = pcie_bytes_per_s(gpu) or 0.0
    lanes = "" if gpu.pcie_lanes else " (x16 assumed)"
    return (
        f"paged optimizer: {paged_out / GIB:.2f} GiB of its state does not fit beside the step "
        f"and crosses PCIe {gpu.pcie_gen}.0{lanes} twice per optimizer step (in, then out): "
        f"{seconds * 1e3:.0f} ms added at half the link's peak {rate / GB:.0f} GB/s per "
        "direction, what page migration reaches at best (bitsandbytes docs: 'about half or "
        "worse'), so this is the fast side"
    )

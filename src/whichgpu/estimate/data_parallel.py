"""Training on N GPUs of one node, data parallel: what the gradient exchange adds to a step.

Each GPU runs the one-GPU step on its own batch; the GPUs then average their gradients with a
ring all-reduce (NCCL), which sends ``2 (N - 1) / N`` of the gradient bytes over each GPU's
link. ZeRO-2 does a reduce-scatter and an all-gather of the same volume; ZeRO-3 / FSDP also
gather the parameters before forward and backward, ``(N - 1) / N`` of the parameter bytes
each time. The link is the GPU's NVLink/NVSwitch where every GPU reaches every other over it
(SXM and OAM boards), the bridge for two bridged PCIe cards, and PCIe otherwise, at the width
the machine's platform gives each card (the build class for N GPUs, as ``whichgpu cost build``
prices and checks it: a desktop's 16 GPU lanes are x8 each for two cards); its rate is the
peak per direction times the share NCCL reaches on such links (``data/links.json``, with
sources).

DDP starts reducing a bucket of gradients as soon as backward has produced it, so the exchange
hides behind backward except for what does not fit in it and for the last bucket, which can
only start when backward ends; FSDP's gathers hide behind forward and backward alike. The
model counts no slowdown of the compute by the communication kernels that run beside it, so it
errs optimistic where links are fast and compute is saturated.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Any

from whichgpu.catalog.cost_data import build_class_for, pcie_lanes_per_gpu
from whichgpu.errors import MissingRates, UsageError
from whichgpu.schema import FormFactor, GpuSpec, Interconnect, Sharding
from whichgpu.units import GB

_SWITCHED = (FormFactor.SXM, FormFactor.OAM, FormFactor.SUPERCHIP)
"""Boards whose GPUs all reach each other over the fast link (NVSwitch / fully connected)."""
_FAST_LINKS = (Interconnect.NVLINK, Interconnect.INFINITY_FABRIC)


@dataclass(frozen=True)
class LinkData:
    """The link figures of ``data/links.json``."""

    pcie_gbps_per_lane: dict[int, float]
    """PCIe rate per lane and direction by generation, GB/s."""
    bus_efficiency: dict[str, float]
    """Share of the peak per direction that NCCL's all-reduce reaches, by link kind."""
    bus_efficiency_sources: dict[str, str]
    """Where each share comes from."""
    ddp_bucket_bytes: int
    """DDP's gradient bucket size."""
    all_reduce_floor_s: float
    """Shortest time of one all-reduce, however small (the collective's latency)."""
    all_reduce_floor_source: str
    """Where that floor comes from."""
    max_gpus_per_node: int
    """Most GPUs of one machine that the link figures describe."""


@cache
def load_links() -> LinkData:
    """The shipped link data."""
    ref = resources.files("whichgpu.estimate").joinpath("data/links.json")
    doc: dict[str, Any] = json.loads(ref.read_text(encoding="utf-8"))
    return LinkData(
        pcie_gbps_per_lane={int(k): float(v) for k, v in doc["pcie_gbps_per_lane"].items()},
        bus_efficiency={k: float(v) for k, v in doc["bus_efficiency"].items()},
        bus_efficiency_sources=dict(doc["bus_efficiency_sources"]),
        ddp_bucket_bytes=int(doc["ddp_bucket_bytes"]),
        all_reduce_floor_s=float(doc["all_reduce_floor_s"]),
        all_reduce_floor_source=str(doc["all_reduce_floor_source"]),
        max_gpus_per_node=int(doc["max_gpus_per_node"]),
    )


def check_one_node(gpus: int, links: LinkData | None = None) -> None:
    """Refuse a data-parallel speed question about more GPUs than one machine holds: between
    machines the network sets the pace, and no figure here describes it."""
    most = (links or load_links()).max_gpus_per_node
    if gpus > most:
        raise UsageError(
            f"--gpus {gpus}: speed and price are modelled for the GPUs of one machine, at most "
            f"{most}; across machines the network between them sets the pace, which whichgpu "
            f"does not model. Ask about one machine (--gpus {most} or fewer) and multiply by "
            "the machines you plan, or use whichgpu fit, whose memory per GPU holds for any "
            "count."
        )


@dataclass(frozen=True)
class Link:
    """The link a GPU exchanges gradients over, in a node of ``n_gpus``."""

    kind: str
    """``nvswitch`` (every GPU on the fast link), ``bridge`` (a bridged pair), ``pcie``."""
    description: str
    """In words, e.g. ``NVLink 4, 450 GB/s per direction``."""
    peak_bytes_per_s: float
    """Peak rate per direction."""
    bus_bytes_per_s: float
    """Rate the all-reduce reaches (peak x the link kind's efficiency)."""


def gpu_link(gpu: GpuSpec, n_gpus: int, links: LinkData | None = None) -> Link:
    """The link ``n_gpus`` GPUs like ``gpu`` in one node exchange gradients over."""
    data = links or load_links()
    fast = gpu.interconnect in _FAST_LINKS and gpu.interconnect_bandwidth_gbps
    if fast and gpu.interconnect_bandwidth_gbps is not None:
        per_direction = gpu.interconnect_bandwidth_gbps / 2 * GB
        name = f"{gpu.interconnect.value if gpu.interconnect else 'link'}"
        if gpu.interconnect_gen:
            name += f" {gpu.interconnect_gen}"
        if gpu.form_factor in _SWITCHED:
            kind = "nvswitch"
        elif n_gpus == 2:
            kind = "bridge"
            name += " bridge"
        else:
            kind = ""
        if kind:
            return Link(
                kind=kind,
                description=f"{name}, {per_direction / GB:,.0f} GB/s per direction",
                peak_bytes_per_s=per_direction,
                bus_bytes_per_s=per_direction * data.bus_efficiency[kind],
            )
    if gpu.pcie_gen is None or gpu.pcie_gen not in data.pcie_gbps_per_lane:
        raise MissingRates(
            f"The catalog has no PCIe generation for {gpu.name}, so its multi-GPU exchange "
            "cannot be timed; predict it on one GPU (drop --gpus).",
            ("pcie_gen",),
        )
    # the machine's platform shares its GPU lanes out (a desktop's 16: x8 each for two), as
    # whichgpu cost build shows for the same machine
    build = build_class_for(n_gpus, module=gpu.is_module)
    lanes = pcie_lanes_per_gpu(build, n_gpus, gpu.pcie_lanes)
    if lanes < 1:
        raise UsageError(
            f"A {build.id} has no PCIe lanes to give {n_gpus} x {gpu.name}; ask about fewer GPUs."
        )
    assumed = "" if gpu.pcie_lanes else "; the card's width is not in the catalog: x16 assumed"
    per_direction = data.pcie_gbps_per_lane[gpu.pcie_gen] * lanes * GB
    return Link(
        kind="pcie",
        description=f"PCIe {gpu.pcie_gen}.0 x{lanes} (in a {build.id}), {per_direction / GB:,.0f} "
        f"GB/s per direction{assumed}",
        peak_bytes_per_s=per_direction,
        bus_bytes_per_s=per_direction * data.bus_efficiency["pcie"],
    )


def exchange_bytes(
    gradient_bytes: int, parameter_bytes: int, n_gpus: int, sharding: Sharding
) -> float:
    """Bytes each GPU sends per step (ring algorithms; 0 on one GPU)."""
    if n_gpus <= 1:
        return 0.0
    share = (n_gpus - 1) / n_gpus
    exchanged = 2 * share * gradient_bytes
    if sharding in ("zero3", "fsdp"):  # reduce-scatter grads + gather params twice
        exchanged = share * gradient_bytes + 2 * share * parameter_bytes
    return exchanged


@dataclass(frozen=True)
class DataParallelStep:
    """One data-parallel step: the one-GPU step plus the exchange that does not hide."""

    step_time_s: float
    """Time of the step on each GPU."""
    exchange_s: float
    """Time of the whole exchange on the link."""
    exposed_s: float
    """Part of it that adds to the step."""
    link: Link
    """The link."""


def data_parallel_step(
    single_step_s: float,
    backward_s: float,
    gradient_bytes: int,
    parameter_bytes: int,
    gpu: GpuSpec,
    n_gpus: int,
    sharding: Sharding,
    links: LinkData | None = None,
) -> DataParallelStep:
    """Step time on each of ``n_gpus`` GPUs like ``gpu`` training together."""
    data = links or load_links()
    link = gpu_link(gpu, n_gpus, data)
    exchange_s = exchange_bytes(gradient_bytes, parameter_bytes, n_gpus, sharding) / (
        link.bus_bytes_per_s
    )
    window_s = single_step_s if sharding in ("zero3", "fsdp") else backward_s
    last_bucket = min(1.0, data.ddp_bucket_bytes / gradient_bytes) if gradient_bytes else 1.0
    exposed_s = max(exchange_s - window_s, exchange_s * last_bucket)
    return DataParallelStep(
        step_time_s=single_step_s + exposed_s, exchange_s=exchange_s, exposed_s=exposed_s, link=link
    )


def all_reduce_s(nbytes: float, n_gpus: int, link: Link, links: LinkData | None = None) -> float:
    """Time of one ring all-reduce of ``nbytes`` among ``n_gpus`` over ``link``: the bytes each
    GPU sends at the link's all-reduce rate, and never less than the collective's floor."""
    data = links or load_links()
    if n_gpus <= 1:
        return 0.0
    moved = 2 * (n_gpus - 1) / n_gpus * nbytes / link.bus_bytes_per_s
    return max(moved, data.all_reduce_floor_s)

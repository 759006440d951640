"""Training on N GPUs, data parallel: what the gradient exchange adds to a step.

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

More GPUs than one node holds (``max_gpus_per_node``, 8) are nodes of that many joined by a
network fabric (``fabrics`` in ``data/links.json``: InfiniBand NDR by default), rail-optimised,
one NIC per GPU. NCCL then runs one ring per NIC, each crossing every node's boundary once on
its own NIC, so the node's NICs together carry the ring: the ring's rate is the slowest of the
in-node link and the node's NICs at the share of their peak NCCL reaches; the bytes each GPU
sends are the ring's, as on one node. Tensor parallel across nodes is not modelled.

DDP starts reducing a bucket of gradients as soon as backward has produced it, so the exchange
hides behind backward except for what does not fit in it and for the last bucket, which can
only start when backward ends; FSDP's gathers hide behind forward and backward alike. HSDP
(FSDP's hybrid sharding) runs FSDP inside each node and, between nodes, an all-reduce of each
GPU's gradient shard among the GPUs holding the same shard, one per node over its own NIC. The
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
from whichgpu.errors import MissingRates, UsageError, option
from whichgpu.estimate.sharding import Parallel
from whichgpu.schema import FormFactor, GpuSpec, Interconnect, RunConfig, Sharding
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
    """Most GPUs of one machine that the link figures describe: the node size of a run on
    several nodes."""
    max_gpus: int
    """Most GPUs of a run, over all its nodes."""
    fabrics: dict[str, Fabric]
    """The networks between nodes, by id."""
    default_fabric: str
    """The fabric assumed when none is named."""


@dataclass(frozen=True)
class Fabric:
    """A network between nodes, rail-optimised: one NIC per GPU."""

    id: str
    """``ib-ndr``, ``ib-hdr``, ``roce-1600`` ..."""
    name: str
    """In words."""
    gbit_per_s_per_gpu: float
    """Each GPU's NIC, Gb/s per direction."""
    bytes_per_s_per_gpu: float
    """The same in bytes/s."""
    source: str
    """Where the rate comes from."""


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
        max_gpus=int(doc["max_gpus"]),
        fabrics={
            key: Fabric(
                id=key,
                name=str(f["name"]),
                gbit_per_s_per_gpu=float(f["gbit_per_s_per_gpu"]),
                bytes_per_s_per_gpu=float(f["gbyte_per_s_per_gpu"]) * GB,
                source=str(f["source"]),
            )
            for key, f in doc["fabrics"].items()
        },
        default_fabric=str(doc["default_fabric"]),
    )


def get_fabric(network: str | None, links: LinkData | None = None) -> Fabric:
    """The fabric ``network`` names (None: the default, InfiniBand NDR)."""
    data = links or load_links()
    key = data.default_fabric if network is None else network.strip().lower()
    if key not in data.fabrics:
        known = ", ".join(f"{k} ({f.name})" for k, f in data.fabrics.items())
        raise UsageError(f"{option('network')} '{network}' is not a known fabric; known: {known}.")
    return data.fabrics[key]


def node_count(gpus: int, links: LinkData | None = None) -> int:
    """Nodes ``gpus`` GPUs take (1 up to a node's size)."""
    size = (links or load_links()).max_gpus_per_node
    return max(1, -(-gpus // size))


def check_gpu_count(
    gpus: int, mode: str = "train", network: str | None = None, links: LinkData | None = None
) -> None:
    """Refuse a speed question about ``gpus`` GPUs that whichgpu cannot time: more than
    ``max_gpus``, several nodes of a count their size does not divide, serving across nodes,
    or an unknown fabric."""
    data = links or load_links()
    get_fabric(network, data)
    size = data.max_gpus_per_node
    if gpus > data.max_gpus:
        raise UsageError(
            f"{option('gpu_count')} {gpus}: whichgpu times data-parallel runs of at most "
            f"{data.max_gpus:,} GPUs; beyond that hierarchical collectives and several kinds "
            "of parallelism set the pace, which it does not model."
        )
    if gpus <= size:
        return
    if mode == "inference":
        raise UsageError(
            f"{option('gpu_count')} {gpus}: serving spreads one model tensor parallel across its "
            f"GPUs, which whichgpu models within one node only (at most {size} GPUs); ask about "
            f"{size} or fewer and run several copies for more throughput."
        )
    if gpus % size:
        lower, upper = gpus // size * size, -(-gpus // size) * size
        raise UsageError(
            f"{option('gpu_count')} {gpus}: across nodes the GPUs are nodes of {size}, and {size} "
            f"does not divide {gpus}; ask about {lower} or {upper} GPUs ({lower // size} or "
            f"{upper // size} nodes)."
        )


@dataclass(frozen=True)
class Link:
    """The link a GPU exchanges gradients over, in a node of ``n_gpus``."""

    kind: str
    """``nvswitch`` (every GPU on the fast link), ``bridge`` (a bridged pair), ``pcie``, or
    ``network`` (nodes joined by a fabric)."""
    description: str
    """In words, e.g. ``NVLink 4, 450 GB/s per direction``."""
    peak_bytes_per_s: float
    """Peak rate per direction."""
    bus_bytes_per_s: float
    """Rate the all-reduce reaches (peak x the link kind's efficiency)."""


def link_domain(gpu: GpuSpec, links: LinkData | None = None) -> int:
    """Most GPUs like ``gpu`` that reach each other over its own link: its switched NVLink
    domain where the catalog gives one larger than a node (``interconnect_domain_gpus``:
    GB200 NVL72's 72), else a node's ``max_gpus_per_node``."""
    data = links or load_links()
    return max(data.max_gpus_per_node, gpu.interconnect_domain_gpus or 0)


def span_link(
    gpu: GpuSpec, span: int, network: str | None, links: LinkData | None = None
) -> tuple[float, str]:
    """The rate one GPU exchanges at among ``span`` neighbouring GPUs like ``gpu``, and the link
    in words: the node's (or NVLink domain's) own link at the share NCCL reaches there while
    they fit in it, else the GPU's own NIC on the fabric ``network`` (None: the default)."""
    data = links or load_links()
    if span <= link_domain(gpu, data):
        node = gpu_link(gpu, span, data)
        return node.bus_bytes_per_s, node.description
    fabric = get_fabric(network, data)
    rate = fabric.bytes_per_s_per_gpu * data.bus_efficiency["network"]
    return rate, f"{fabric.id}, {fabric.bytes_per_s_per_gpu / GB:,.0f} GB/s per GPU"


def gpu_link(
    gpu: GpuSpec, n_gpus: int, links: LinkData | None = None, network: str | None = None
) -> Link:
    """The link ``n_gpus`` GPUs like ``gpu`` exchange gradients over: within one node (or one
    NVLink domain larger than a node, ``link_domain``), the GPUs' own; across nodes
    (``network``: the fabric's id, None the default), the slower of the in-node link and the
    fabric, whose NICs in a node carry the ring together."""
    data = links or load_links()
    if n_gpus > link_domain(gpu, data):
        return _network_link(gpu, n_gpus, data, network)
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


def _network_link(gpu: GpuSpec, n_gpus: int, data: LinkData, network: str | None) -> Link:
    size = data.max_gpus_per_node
    fabric = get_fabric(network, data)
    inside = gpu_link(gpu, size, data)
    share = data.bus_efficiency["network"]
    node_peak = size * fabric.bytes_per_s_per_gpu
    nodes = node_count(n_gpus, data)
    bound = "the network" if node_peak * share < inside.bus_bytes_per_s else "the node's link"
    return Link(
        kind="network",
        # short: a table column (the assumptions say the rest: network_note)
        description=f"{nodes} x {size} over {fabric.id} "
        f"({fabric.gbit_per_s_per_gpu:,.0f} Gb/s per GPU), {inside.description} inside; "
        f"{bound} sets the pace",
        peak_bytes_per_s=min(node_peak, inside.peak_bytes_per_s),
        bus_bytes_per_s=min(node_peak * share, inside.bus_bytes_per_s),
    )


def shard_group(
    n_gpus: int, sharding: Sharding, links: LinkData | None = None, *, tensor: int = 1
) -> int:
    """GPUs the model state is split over, of ``n_gpus`` data-parallel ones: for ``hsdp``
    those of one node (at most ``max_gpus_per_node``, or its ``1/tensor`` where each copy
    splits its layers over ``tensor`` GPUs of the node), each node a replica; for every other
    strategy all of them."""
    if sharding != "hsdp":
        return n_gpus
    data = links or load_links()
    return min(n_gpus, max(1, data.max_gpus_per_node // tensor))


def memory_parallel(
    n_gpus: int,
    sharding: Sharding,
    links: LinkData | None = None,
    *,
    tensor: int = 1,
    pipeline: int = 1,
    virtual: int = 1,
    fp8_gather: bool = False,
    context: int = 1,
    expert: int = 1,
    expert_fraction: float = 0.0,
) -> Parallel:
    """What one GPU's memory is split by: ``n_gpus`` data-parallel copies and ``sharding``,
    with HSDP's shard group in place of the GPUs (``shard_group``), each copy split ``tensor``
    ways within layers and ``pipeline`` ways by layer (``virtual`` chunks per GPU);
    ``fp8_gather``: FSDP gathers the blocks' weights in fp8; ``context``: the GPUs that split
    each sequence, counted among the ``n_gpus`` that share the model state; ``expert``: the
    copies each layer's routed experts (``expert_fraction`` of the parameters) are spread
    over."""
    return Parallel(
        shard_group(n_gpus, sharding, links, tensor=tensor),
        sharding,
        tensor,
        pipeline,
        virtual,
        fp8_gather,
        context,
        expert,
        expert_fraction if expert > 1 else 0.0,
    )


def run_parallel(
    run: RunConfig, links: LinkData | None = None, expert_fraction: float = 0.0
) -> Parallel:
    """What one GPU of a training ``run`` holds a share of: the GPUs that share its model
    state under its sharding (the data-parallel copies times the context-parallel GPUs of
    each), each copy split by its tensor- and pipeline-parallel degrees, and under expert
    parallel 1/E of the routed experts (``expert_fraction`` of the parameters;
    ``memory_parallel``)."""
    return memory_parallel(
        run.state_group(),
        run.sharding,
        links,
        tensor=run.tensor_parallel,
        pipeline=run.pipeline_parallel,
        virtual=run.virtual_stages,
        fp8_gather=run.fp8_all_gather,
        context=run.context_parallel,
        expert=run.expert_parallel,
        expert_fraction=expert_fraction,
    )


def exchange_bytes(
    gradient_bytes: int, parameter_bytes: int, n_gpus: int, sharding: Sharding
) -> float:
    """Bytes each GPU sends per step among ``n_gpus`` (ring algorithms; 0 on one GPU); for
    ``hsdp`` within its shard group (``n_gpus`` is that group)."""
    if n_gpus <= 1:
        return 0.0
    share = (n_gpus - 1) / n_gpus
    exchanged = 2 * share * gradient_bytes
    if sharding in ("zero3", "fsdp", "hsdp"):  # reduce-scatter grads + gather params twice
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
    network: str | None = None,
    link: Link | None = None,
    tensor: int = 1,
) -> DataParallelStep:
    """Step time on each of ``n_gpus`` GPUs like ``gpu`` training together (across nodes over
    the fabric ``network`` names, None the default; ``link``: the link they exchange over,
    where the caller placed them otherwise, as a model-parallel split does; ``tensor``: the
    GPUs each copy splits its layers over, which share its node). HSDP across nodes:
    ``_hybrid_step``."""
    data = links or load_links()
    group = shard_group(n_gpus, sharding, data, tensor=tensor)
    if group < n_gpus:
        return _hybrid_step(
            single_step_s,
            backward_s,
            gradient_bytes,
            parameter_bytes,
            gpu,
            (n_gpus, group),
            data,
            network,
        )
    link = link or gpu_link(gpu, n_gpus, data, network)
    exchange_s = exchange_bytes(gradient_bytes, parameter_bytes, n_gpus, sharding) / (
        link.bus_bytes_per_s
    )
    window_s = single_step_s if sharding in ("zero3", "fsdp", "hsdp") else backward_s
    exposed_s = max(exchange_s - window_s, exchange_s * _last_bucket(gradient_bytes, data))
    return DataParallelStep(
        step_time_s=single_step_s + exposed_s, exchange_s=exchange_s, exposed_s=exposed_s, link=link
    )


def _last_bucket(gradient_bytes: int, data: LinkData) -> float:
    """The share of the exchange that can only start when backward ends: the last bucket
    (DDP's bucket size, taken for a ZeRO or FSDP unit too) of ``gradient_bytes``."""
    return min(1.0, data.ddp_bucket_bytes / gradient_bytes) if gradient_bytes else 1.0


def _hybrid_step(
    single_step_s: float,
    backward_s: float,
    gradient_bytes: int,
    parameter_bytes: int,
    gpu: GpuSpec,
    gpus_and_group: tuple[int, int],
    data: LinkData,
    network: str | None,
) -> DataParallelStep:
    """HSDP on ``n_gpus`` data-parallel GPUs in shard groups of ``group`` per node
    (``gpus_and_group``; a node's ``max_gpus_per_node``, fewer where each copy is split tensor
    parallel over GPUs of the node): inside each node FSDP's
    reduce-scatter and two gathers over the node's link, hidden behind the whole step as
    FSDP's are; between the nodes an all-reduce of each GPU's gradient shard among the GPUs
    holding the same shard (one per node, each over its own NIC), which starts as backward
    reduce-scatters each unit, so it hides behind backward. The two run on different links at
    once; what does not hide of either, and the last unit's share of each, adds to the step."""
    n_gpus, size = gpus_and_group
    replicas = -(-n_gpus // size)
    inside = gpu_link(gpu, max(size, 2), data)
    fabric = get_fabric(network, data)
    nic_bytes_per_s = fabric.bytes_per_s_per_gpu * data.bus_efficiency["network"]
    inside_s = exchange_bytes(gradient_bytes, parameter_bytes, size, "hsdp")
    inside_s /= inside.bus_bytes_per_s
    shard = gradient_bytes / size
    between_s = 2 * (replicas - 1) / replicas * shard / nic_bytes_per_s
    exposed_s = max(
        inside_s - single_step_s,
        between_s - backward_s,
        (inside_s + between_s) * _last_bucket(gradient_bytes, data),
    )
    link = Link(
        kind="network",
        description=f"{replicas} x {size}: the shards over {inside.description} inside each "
        f"node, the replicas' all-reduce over {fabric.id} ({fabric.gbit_per_s_per_gpu:,.0f} "
        "Gb/s per GPU) between them",
        peak_bytes_per_s=min(inside.peak_bytes_per_s, fabric.bytes_per_s_per_gpu),
        bus_bytes_per_s=min(inside.bus_bytes_per_s, nic_bytes_per_s),
    )
    return DataParallelStep(
        step_time_s=single_step_s + exposed_s,
        exchange_s=inside_s + between_s,
        exposed_s=exposed_s,
        link=link,
    )


def all_reduce_s(nbytes: float, n_gpus: int, link: Link, links: LinkData | None = None) -> float:
    """Time of one ring all-reduce of ``nbytes`` among ``n_gpus`` over ``link``: the bytes each
    GPU sends at the link's all-reduce rate, and never less than the collective's floor."""
    data = links or load_links()
    if n_gpus <= 1:
        return 0.0
    moved = 2 * (n_gpus - 1) / n_gpus * nbytes / link.bus_bytes_per_s
    return max(moved, data.all_reduce_floor_s)


def network_note(
    n_gpus: int, network: str | None, links: LinkData | None = None, gpu: GpuSpec | None = None
) -> str:
    """The assumption a run across nodes rests on, in words (empty on one node); with
    ``gpu``, a run within its NVLink domain larger than a node says so instead."""
    data = links or load_links()
    if n_gpus <= data.max_gpus_per_node:
        return ""
    if gpu is not None and n_gpus <= link_domain(gpu, data):
        return (
            f"{n_gpus} GPUs of one {link_domain(gpu, data)}-GPU NVLink domain ({gpu.name}): "
            "the exchanges run over NVLink across its machines, not over the network (which "
            "the notes above assume for nodes of 8)"
        )
    return (
        f"{n_gpus} GPUs in {node_count(n_gpus, data)} nodes of {data.max_gpus_per_node} joined "
        f"by {fabric_note(network, data)}"
    )


def fabric_note(network: str | None, links: LinkData | None = None) -> str:
    """The fabric ``network`` names (None: the default) and what is assumed of it, in words:
    ``InfiniBand NDR (ib-ndr; …): 400 Gb/s (50 GB/s) per GPU per direction, …``."""
    data = links or load_links()
    fabric = get_fabric(network, data)
    default = "; the default fabric, --network names another" if network is None else ""
    return (
        f"{fabric.name} ({fabric.id}{default}): {fabric.gbit_per_s_per_gpu:,.0f} Gb/s "
        f"({fabric.bytes_per_s_per_gpu / GB:,.0f} GB/s) per GPU per direction, one NIC per "
        f"GPU, NCCL's ring reaching {data.bus_efficiency['network']:.0%} of it"
    )

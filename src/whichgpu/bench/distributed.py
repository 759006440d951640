"""Several GPUs of one node training together (DDP), and how their figures combine.

The runner starts one process per GPU (``probe.run_in_children``, each a ``measure_task`` with
a ``GroupSpec``); each joins a process group (NCCL on CUDA, gloo on the CPU) through a TCP
rendezvous on this host, wraps the model in ``DistributedDataParallel`` and times its own
steps. Warm-up and stopping are decided on the slowest rank's step time, so every rank runs
the same steps. Each rank sends back its own ``Measurement``; ``aggregate`` combines them by
the rules in ``AGGREGATION_RULES`` (also written into every multi-GPU result's notes).

Across nodes the ranks are torchrun's (``torchrun_group`` reads its environment): each
torchrun process measures its own device in a child that joins the torchrun group
(``init_method="env://"``), and the children gather their ``Measurement``s on rank 0, whose
process alone makes the result.
"""

from __future__ import annotations

import socket
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from whichgpu.bench.jobs import Measurement
from whichgpu.errors import UsageError

AGGREGATION_RULES = (
    "step time = the slowest rank's median (a DDP step ends with the last gradient "
    "all-reduce, so the slowest rank paces every rank); spread = that rank's IQR",
    "throughput = the units of every rank's step / that step time",
    "memory = the largest of the ranks' peaks (each GPU holds its own)",
    "power and energy = sums over ranks; energy per sample = total energy / samples timed on "
    "all ranks; SM clock and utilisation = means over ranks; temperature = the hottest rank",
    "scaling efficiency = throughput / (GPUs x the one-GPU throughput measured in the same "
    "bench at the same per-GPU batch)",
)
"""How a multi-GPU result is made from its ranks."""


@dataclass(frozen=True)
class Aggregate:
    """The figures of a run, combined over its ranks (one rank: its own figures)."""

    step_time_s: float
    """Median step time of the slowest rank, s."""
    step_time_iqr_s: float
    """Its interquartile range, s."""
    throughput: float
    """Units per second over all ranks."""
    iterations: int
    """Timed steps (the same on every rank)."""
    warmup_iterations: int
    """Untimed steps before them."""
    measured_s: float
    """Time of the timed steps (the slowest rank's sum), s."""
    peak_allocated_bytes: int | None
    """Largest peak of tensor bytes over ranks."""
    peak_reserved_bytes: int | None
    """Largest peak of allocator-reserved bytes over ranks."""
    device_used_bytes: int | None
    """Largest NVML memory in use over ranks."""
    power_w: float | None
    """Sum of the ranks' mean power, W."""
    energy_j_per_sample: float | None
    """Total energy / samples timed, J."""
    sm_clock_mhz: float | None
    """Mean SM clock over ranks, MHz."""
    temperature_c: float | None
    """Hottest rank's highest temperature, °C."""
    utilization: float | None
    """Mean utilisation over ranks."""
    flops_per_step: float | None
    """Model FLOPs of one step of one device (rank 0's count)."""
    per_rank: tuple[dict[str, float], ...]
    """Each rank's own figures (multi-GPU runs only)."""


def _largest(values: Sequence[int | None]) -> int | None:
    known = [v for v in values if v is not None]
    return max(known) if known else None


def _mean(values: Sequence[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return statistics.fmean(known) if known else None


def aggregate(measurements: Sequence[Measurement]) -> Aggregate:
    """Combine the ranks' measurements by ``AGGREGATION_RULES``."""
    if not measurements:
        raise ValueError("no measurements to aggregate")
    ranks = sorted(measurements, key=lambda m: m.rank)
    slowest = max(ranks, key=lambda m: m.timing.median_s)
    step = slowest.timing.median_s
    powers = [m.power.power_w for m in ranks]
    energies = [m.power.energy_j for m in ranks]
    samples = sum(m.timing.iterations * m.samples_per_step for m in ranks)
    energy_per_sample = (
        sum(e for e in energies if e is not None) / samples
        if samples and all(e is not None for e in energies)
        else None
    )
    temperatures = [m.power.temperature_c for m in ranks if m.power.temperature_c is not None]
    per_rank: tuple[dict[str, float], ...] = ()
    if len(ranks) > 1:
        per_rank = tuple(_rank_figures(m) for m in ranks)
    return Aggregate(
        step_time_s=step,
        step_time_iqr_s=slowest.timing.iqr_s,
        throughput=sum(m.units_per_step for m in ranks) / step,
        iterations=min(m.timing.iterations for m in ranks),
        warmup_iterations=max(m.timing.warmup_iterations + m.warmup_extra for m in ranks),
        measured_s=max(m.timing.measured_s for m in ranks),
        peak_allocated_bytes=_largest([m.peak_allocated_bytes for m in ranks]),
        peak_reserved_bytes=_largest([m.peak_reserved_bytes for m in ranks]),
        device_used_bytes=_largest([m.power.used_bytes for m in ranks]),
        power_w=sum(p for p in powers if p is not None)
        if all(p is not None for p in powers)
        else None,
        energy_j_per_sample=energy_per_sample,
        sm_clock_mhz=_mean([m.power.sm_clock_mhz for m in ranks]),
        temperature_c=max(temperatures) if temperatures else None,
        utilization=_mean([m.power.utilization for m in ranks]),
        flops_per_step=ranks[0].flops_per_step,
        per_rank=per_rank,
    )


def _rank_figures(m: Measurement) -> dict[str, float]:
    figures: dict[str, float | int | None] = {
        "rank": m.rank,
        "step_time_s": m.timing.median_s,
        "step_time_iqr_s": m.timing.iqr_s,
        "iterations": m.timing.iterations,
        "units_per_step": m.units_per_step,
        "peak_allocated_bytes": m.peak_allocated_bytes,
        "peak_reserved_bytes": m.peak_reserved_bytes,
        "power_w": m.power.power_w,
    }
    return {k: float(v) for k, v in figures.items() if v is not None}


def scaling_efficiency(throughput: float, one_gpu_throughput: float, n_gpus: int) -> float:
    """``throughput / (n_gpus x one_gpu_throughput)`` (1.0 = perfect scaling)."""
    return throughput / (n_gpus * one_gpu_throughput)


def rendezvous_address() -> str:
    """``tcp://127.0.0.1:PORT`` on a port free now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"tcp://127.0.0.1:{port}"


TORCHRUN_VARIABLES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")
"""What torchrun (and its c10d rendezvous) sets in every process it starts, and a bench
under torchrun needs."""


@dataclass(frozen=True)
class TorchrunGroup:
    """This process's place in the group torchrun started (read from its environment)."""

    rank: int
    """Global rank (``RANK``)."""
    world_size: int
    """Processes in the group, over every node (``WORLD_SIZE``)."""
    local_rank: int
    """Rank on this node (``LOCAL_RANK``): the device this process measures."""
    local_world_size: int
    """Processes on this node (``LOCAL_WORLD_SIZE``; ``WORLD_SIZE`` when it is unset)."""
    nodes: int
    """Nodes in the group (``GROUP_WORLD_SIZE``, torchrun's agents; else
    ``WORLD_SIZE / LOCAL_WORLD_SIZE``)."""
    master_addr: str
    """Host of the group's store (``MASTER_ADDR``)."""
    master_port: int
    """Its port (``MASTER_PORT``)."""

    @property
    def is_leader(self) -> bool:
        """Whether this is rank 0, the one process that reports and stores."""
        return self.rank == 0

    def describe(self) -> str:
        """The group in a few words, for a result's notes."""
        return (
            f"{self.world_size} ranks on {self.nodes} node{'s' * (self.nodes != 1)} "
            f"({self.local_world_size} per node on rank 0's), launched by torchrun"
        )


def torchrun_group(environ: Mapping[str, str]) -> TorchrunGroup | None:
    """The torchrun group this process belongs to, or None when it was not started by
    torchrun (neither ``RANK`` nor ``WORLD_SIZE`` is set). An environment that sets some of
    ``TORCHRUN_VARIABLES`` but not all, or values that cannot be, is a ``UsageError``."""
    if "RANK" not in environ and "WORLD_SIZE" not in environ:
        return None
    missing = [name for name in TORCHRUN_VARIABLES if not environ.get(name)]
    if missing:
        raise UsageError(
            f"RANK or WORLD_SIZE is set, as torchrun sets them, but {', '.join(missing)} "
            "is not: start the bench with torchrun (which sets "
            f"{', '.join(TORCHRUN_VARIABLES)}), or unset RANK and WORLD_SIZE."
        )

    def number(name: str, least: int) -> int:
        text = environ[name]
        try:
            value = int(text)
        except ValueError:
            raise UsageError(f"{name}={text!r} in the environment is not a number.") from None
        if value < least:
            raise UsageError(f"{name}={value} in the environment: it must be at least {least}.")
        return value

    world_size = number("WORLD_SIZE", 1)
    rank = number("RANK", 0)
    local_rank = number("LOCAL_RANK", 0)
    local_world_size = number("LOCAL_WORLD_SIZE", 1) if environ.get("LOCAL_WORLD_SIZE") else None
    port = number("MASTER_PORT", 1)
    if rank >= world_size or (local_world_size is not None and local_rank >= local_world_size):
        raise UsageError(
            f"RANK={rank}, LOCAL_RANK={local_rank} in the environment do not fit "
            f"WORLD_SIZE={world_size}"
            + (f", LOCAL_WORLD_SIZE={local_world_size}." if local_world_size else ".")
        )
    if port > 65535:
        raise UsageError(f"MASTER_PORT={port} in the environment is not a port.")
    local = local_world_size or world_size
    nodes = (
        number("GROUP_WORLD_SIZE", 1)
        if environ.get("GROUP_WORLD_SIZE")
        else max(1, world_size // local)
    )
    return TorchrunGroup(
        rank=rank,
        world_size=world_size,
        local_rank=local_rank,
        local_world_size=local,
        nodes=nodes,
        master_addr=environ["MASTER_ADDR"],
        master_port=port,
    )

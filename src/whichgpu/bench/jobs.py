"""What a bench child process is asked to do, and what it reports back.

Every type here is a frozen dataclass of plain values, so it pickles into a child process (a
forked or spawned interpreter) and back. Nothing here imports torch.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from whichgpu.schema import BenchEnvironment, RunConfig

if TYPE_CHECKING:
    from whichgpu.bench.devices.protocol import Device
    from whichgpu.bench.nvml import PowerSummary
    from whichgpu.bench.timing import Timing, TimingRule
    from whichgpu.workloads.base import Workload


@dataclass(frozen=True)
class WorkloadRef:
    """How a child process finds the workload: a registered name, a config file or a model
    function. Paths are absolute, so the child finds them whatever its working directory."""

    name: str | None = None
    """Registered workload."""
    config: str | None = None
    """A Hugging Face ``config.json`` (``--config``)."""
    task: str | None = None
    """Task of the config (``--task``)."""
    model: str | None = None
    """``FILE.py:FUNCTION`` or ``package.module:FUNCTION`` (``--model``)."""
    label: str | None = None
    """The name results carry: what the user typed (paths as given, not made absolute)."""

    @classmethod
    def of(
        cls,
        name: str | None = None,
        config: Path | str | None = None,
        task: str | None = None,
        model: str | None = None,
    ) -> WorkloadRef:
        """The reference to what the user named, with file paths made absolute."""
        config_path = str(Path(config).resolve()) if config is not None else None
        label = name or (str(config) if config is not None else model)
        if model is not None:
            target, sep, function = model.rpartition(":")
            if sep and (target.endswith(".py") or "/" in target):
                model = f"{Path(target).resolve()}:{function}"
        return cls(name=name, config=config_path, task=task, model=model, label=label)

    def resolve(self) -> Workload:
        """The workload (imports the user's file for ``--model``)."""
        from whichgpu.workloads import select_workload

        return select_workload(
            self.name,
            Path(self.config) if self.config else None,
            self.task,  # type: ignore[arg-type]
            model=self.model,
        )


@dataclass(frozen=True)
class GroupSpec:
    """A data-parallel group the step runs in (one process per device)."""

    rank: int
    """This process's rank."""
    world_size: int
    """Processes in the group."""
    address: str
    """Rendezvous address (``tcp://127.0.0.1:PORT``; ``env://`` under torchrun, whose
    environment names the group's store)."""
    timeout_s: float
    """How long a collective may wait for the other ranks."""
    local_world_size: int | None = None
    """Processes of the group on this host (None: all of them); they share its CPU threads."""


@dataclass(frozen=True)
class StepSpec:
    """One step configuration, as a child process builds and runs it."""

    workload: WorkloadRef
    """What to build."""
    run: RunConfig
    """Run configuration (batch size and sequence length resolved)."""
    batch_size: int
    """Samples per step on this device."""
    seq_len: int | None
    """Tokens per sequence (sequence models)."""
    compile: bool = False
    """Run the model under ``torch.compile``."""
    channels_last: bool = False
    """Images and convolution weights in channels-last layout."""
    memory_limit_bytes: int | None = None
    """Memory the step may use (``--memory-limit``); None: the device's own."""
    group: GroupSpec | None = None
    """Data-parallel group, for a multi-GPU run."""


@dataclass(frozen=True)
class BenchProgress:
    """What a bench is doing now (sent to the progress callback)."""

    stage: str
    """``start`` (the CLI, before anything runs), ``inspect``, ``search``, ``probe``,
    ``build``, ``warmup``, ``timing``, ``flops``, ``ranks``, ``done``."""
    message: str
    """One line for a person."""
    fraction: float | None = None
    """How far the stage is (0-1), when that is known."""
    workload: str | None = None
    """Workload being measured (set by the runner)."""


@dataclass(frozen=True)
class InspectJob:
    """Look at the device: is it there, what is it, what software runs it."""

    device: Device
    """Device of the bench."""
    n_devices: int = 1
    """Devices a multi-GPU run will use (from ``device`` on), for the interconnect."""


@dataclass(frozen=True)
class Inspection:
    """The device and its software, as a child process found them."""

    environment: BenchEnvironment
    """Machine and software."""
    notes: tuple[str, ...] = ()
    """What could not be found, and why."""


@dataclass(frozen=True)
class ProbeJob:
    """Build the step and run it a few times: does it fit?"""

    device: Device
    """Where."""
    step: StepSpec
    """What."""
    steps: int = 2
    """Steps run: the second runs with the optimizer state the first created."""


@dataclass(frozen=True)
class ProbeReport:
    """A probe that ran: the memory its steps used."""

    peak_allocated_bytes: int | None
    """Peak bytes held by tensors."""
    peak_reserved_bytes: int | None
    """Peak bytes the allocator held (devices with a caching allocator)."""
    seconds: float
    """Time of the probe's steps."""


@dataclass(frozen=True)
class MeasureJob:
    """Build the step, warm it up, time it, and read memory, power and FLOPs."""

    device: Device
    """Where (this rank's device in a multi-GPU run)."""
    step: StepSpec
    """What."""
    rule: TimingRule
    """When warm-up ends and timing stops."""
    sample_period_s: float = 0.1
    """NVML sampling period."""


@dataclass(frozen=True)
class PrecisionState:
    """The numeric settings actually in force while the step ran."""

    tf32_matmul: bool | None = None
    """``torch.backends.cuda.matmul.allow_tf32`` (CUDA only)."""
    tf32_cudnn: bool | None = None
    """``torch.backends.cudnn.allow_tf32`` (CUDA only)."""
    amp_dtype: str | None = None
    """Autocast dtype, None without autocast."""


@dataclass(frozen=True)
class Measurement:
    """One device's measurement of a step."""

    rank: int
    """Rank in a multi-GPU run (0 alone)."""
    timing: Timing
    """Step times, warm-up and statistics."""
    warmup_extra: int
    """Steps run before the timing loop's warm-up (the memory steps), untimed too."""
    units_per_step: int
    """Throughput units one step of this device processes."""
    samples_per_step: int
    """Samples one step of this device processes (its batch)."""
    peak_allocated_bytes: int | None
    """Peak bytes held by tensors."""
    peak_reserved_bytes: int | None
    """Peak bytes the caching allocator held."""
    memory_method: str
    """How the memory figures were measured."""
    power: PowerSummary
    """NVML readings while timing."""
    flops_per_step: float | None
    """Model FLOPs of one step (``bench.flops``: counted, else traced; None: neither worked)."""
    flops_method: str
    """How they were obtained, or why there are none (a note of the result)."""
    precision: PrecisionState
    """Numeric settings in force."""
    compiled: bool
    """Whether ``torch.compile`` was applied."""
    channels_last: bool
    """Whether channels-last was applied."""
    notes: tuple[str, ...] = field(default=())
    """What the reader should know about this device's run."""
